package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// A member removed while it was down, restarted from its data dir, never
// hears of its removal through Raft (the leader no longer replicates to
// it, and every member refuses its votes), so it knew no leader for ever.
// It asks its peers whether its ID is retired and then says so: its
// health and status name it and the fix, and calls to it fail at once
// with FAILED_PRECONDITION / NODE_REMOVED, which the client decodes as
// client.ErrNodeRemoved and does not retry. The cluster goes on.
func TestRemovedNodeRestartedSaysItWasRemoved(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, autoCreate: true, proxied: true})
	defer tc.closeAll()
	leader := tc.leader()
	victim := tc.followers()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The cut keeps every Raft RPC from the victim, also after its
	// restart: the leader's last attempt to replicate the removal to it
	// (hashicorp/raft sends one when it stops a removed follower's
	// replication) must not reach it, or it learns it from its own log.
	tc.cut(victim)
	tc.close(victim)
	if _, err := leader.admin.Remove(ctx, &dedupv1.RemoveRequest{NodeId: victim.id}); err != nil {
		t.Fatalf("remove %s: %v", victim.id, err)
	}
	tc.start(victim)

	want := "this node (" + victim.id + ") was removed from the cluster and its ID is retired; wipe its data dir and join with a new --node-id"
	waitFor(t, 60*time.Second, "the restarted node reports its removal", func() bool {
		ok, why := victim.srv.Node().Health()
		return !ok && why == want
	})
	// Learnt from a peer, not from its own log (the cut kept that out).
	var rm *cluster.RemovedError
	if err := victim.srv.Node().Removed(); !errors.As(err, &rm) || rm.Source == "its own state" {
		t.Fatalf("the removed node: %v, want a *cluster.RemovedError learnt from a peer", err)
	}
	st, err := victim.admin.Status(ctx, &dedupv1.StatusRequest{})
	if err != nil || st.Healthy || st.HealthReason != want {
		t.Fatalf("status of the removed node: %v, %v; want unhealthy with %q", st, err, want)
	}

	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	_, err = victim.dedup.Mark(cctx, &dedupv1.MarkRequest{Namespace: "ns", RequestToken: []byte("t1"),
		Items: []*dedupv1.MarkItem{{Id: []byte("x")}}})
	s, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	for _, d := range s.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if s.Code() != codes.FailedPrecondition || info == nil || info.Reason != dedupv1.ReasonNodeRemoved ||
		info.Metadata[dedupv1.MetaNodeID] != victim.id || !strings.Contains(s.Message(), want) {
		t.Fatalf("mark on the removed node: %v (details %v); want FAILED_PRECONDITION, reason %s naming %s", err, info, dedupv1.ReasonNodeRemoved, victim.id)
	}

	// A client pinned to the node (a default client finds the leader
	// through the members the removed node lists, and its writes succeed).
	c := testcluster.Client(t, []string{victim.srv.GRPCAddr()}, client.WithPinnedNode())
	_, err = c.Mark(cctx, "ns", []client.Item{{ID: []byte("y")}}, 0)
	if e := client.AsError(err); !errors.Is(err, client.ErrNodeRemoved) || e.Attempts != 1 || client.Heals(err) {
		t.Fatalf("client mark on the removed node: %v; want client.ErrNodeRemoved after one attempt, not healing", err)
	}
	for _, cons := range []client.Consistency{client.Linearizable, client.Stale} {
		if _, err := c.Check(cctx, "ns", [][]byte{[]byte("x")}, cons); !errors.Is(err, client.ErrNodeRemoved) {
			t.Fatalf("client check (%v) on the removed node: %v; want client.ErrNodeRemoved", cons, err)
		}
	}

	// A client that knows another node moves on to it: a stale check
	// goes to the first address (the removed node), then to the next.
	other := leader
	for _, nd := range tc.nodes {
		if nd != victim && nd != leader {
			other = nd
		}
	}
	both := testcluster.Client(t, []string{victim.srv.GRPCAddr(), other.srv.GRPCAddr()})
	if _, err := both.Check(cctx, "", [][]byte{[]byte("x")}, client.Stale); err != nil {
		t.Fatalf("stale check through a client that knows the removed node and %s: %v", other.id, err)
	}

	// The rest of the cluster still serves.
	if _, err := leader.dedup.Mark(cctx, &dedupv1.MarkRequest{Namespace: "ns", RequestToken: []byte("t2"),
		Items: []*dedupv1.MarkItem{{Id: []byte("z")}}}); err != nil {
		t.Fatalf("mark on the leader after the removal: %v", err)
	}
}
