package server_test

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// headerID is the cluster ID a response header carries.
func headerID(md metadata.MD) string {
	if v := md.Get(dedupv1.HeaderClusterID); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Every node of a cluster reports one cluster ID — in Status and in the
// header of every answer, unary or streaming, errors included — and
// another cluster reports another.
func TestClusterID_EveryNodeReportsItsClusterOnEveryAnswer(t *testing.T) {
	a := startCluster(t, clusterOpts{n: 3})
	b := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"b1"}})
	a.waitStable()
	b.waitStable()
	ctx := rpcCtx(t)

	statusID := func(nd *testNode) string {
		t.Helper()
		var md metadata.MD
		st, err := nd.admin.Status(ctx, &dedupv1.StatusRequest{}, grpc.Header(&md))
		if err != nil {
			t.Fatal(err)
		}
		if h := headerID(md); h != st.ClusterId {
			t.Fatalf("%s: header says cluster %q, Status says %q", nd.id, h, st.ClusterId)
		}
		return st.ClusterId
	}
	idA := ""
	for _, nd := range a.nodes {
		waitFor(t, 30e9, nd.id+" applies its cluster ID", func() bool { return nd.srv.Node().ClusterID() != "" })
		got := statusID(nd)
		if idA == "" {
			idA = got
		}
		if got != idA || got == "" {
			t.Fatalf("%s reports cluster %q, another node %q", nd.id, got, idA)
		}
	}
	if idB := statusID(b.nodes[0]); idB == "" || idB == idA {
		t.Fatalf("two clusters report IDs %q and %q", idA, idB)
	}

	// An error carries it too (a namespace that does not exist).
	var md metadata.MD
	_, err := a.nodes[1].dedup.Mark(ctx, &dedupv1.MarkRequest{Namespace: "nope", Items: markItems(ids("x", 1))}, grpc.Header(&md))
	if status.Code(err) != codes.NotFound || headerID(md) != idA {
		t.Fatalf("error answer: %v with cluster header %q, want NotFound with %q", err, headerID(md), idA)
	}
	// And a stream.
	st, err := a.nodes[2].dedup.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := st.Header()
	if err != nil || headerID(hdr) != idA {
		t.Fatalf("stream header: %v %q, want cluster %q", err, headerID(hdr), idA)
	}
	st.CloseSend()
}

// A member of another cluster is refused by Join (through any node: the
// call is forwarded to the leader) with FAILED_PRECONDITION, reason
// CLUSTER_MISMATCH naming both IDs and the address; nothing changes.
func TestJoin_NodeOfAnotherClusterIsRefused(t *testing.T) {
	a := startCluster(t, clusterOpts{n: 3})
	b := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"b1"}})
	a.waitStable()
	b.waitStable()
	ctx := rpcCtx(t)
	bn := b.nodes[0].srv
	waitFor(t, 30e9, "both clusters have their IDs", func() bool {
		return a.nodes[0].srv.Node().ClusterID() != "" && bn.Node().ClusterID() != ""
	})

	follower := a.followers()[0]
	_, err := follower.admin.Join(ctx, &dedupv1.JoinRequest{NodeId: "b1", RaftAddr: bn.RaftAddr(), GrpcAddr: bn.GRPCAddr()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("join of another cluster's node: %v, want FailedPrecondition", err)
	}
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.Reason != dedupv1.ReasonClusterMismatch ||
		info.Metadata[dedupv1.MetaClusterID] != a.nodes[0].srv.Node().ClusterID() ||
		info.Metadata[dedupv1.MetaPeerClusterID] != bn.Node().ClusterID() ||
		info.Metadata[dedupv1.MetaPeerAddr] != bn.GRPCAddr() {
		t.Fatalf("error details %v: want reason %s with both cluster IDs and %s", info, dedupv1.ReasonClusterMismatch, bn.GRPCAddr())
	}
	st, err := a.leader().admin.Status(ctx, &dedupv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.Id == "b1" {
			t.Fatalf("b1 is a member after the refused join: %v", st.Members)
		}
	}
	// b1 still serves its own cluster.
	if _, err := b.nodes[0].admin.Status(ctx, &dedupv1.StatusRequest{}); err != nil {
		t.Fatal(err)
	}
}
