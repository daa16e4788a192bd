package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/server"
)

// testClockOffset is the --max-clock-offset of the replica tests (one
// machine: the clocks are the same clock).
const testClockOffset = 100 * time.Millisecond

func replicaOpts(n int) clusterOpts {
	return clusterOpts{n: n, proxied: true, serverTune: func(c *server.Config) { c.MaxClockOffset = testClockOffset }}
}

// addReplica starts a read replica that joins the cluster through its
// leader (devcluster.Add), behind its Raft proxy (tc.cut stops the
// leader's replication to it), and waits until the leader lists it as a
// replica and it is healthy.
func (tc *testCluster) addReplica(id string) *testNode {
	t := tc.t
	t.Helper()
	leader := tc.leader()
	nd := tc.add(devcluster.AddConfig{ID: id, Join: []string{leader.srv.GRPCAddr()}, ReadReplica: true})
	waitFor(t, 30*time.Second, id+" listed as a replica and healthy", func() bool {
		return suffrageOf(t, tc.leader(), id) == "replica" && nd.srv.Node().Healthy()
	})
	return nd
}

func suffrageOf(t testing.TB, nd *testNode, id string) string {
	t.Helper()
	st, err := nd.srv.Node().Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.ID == id {
			return m.Suffrage
		}
	}
	return ""
}

func check(ctx context.Context, nd *testNode, cons dedupv1.Consistency, maxStalenessMs int64, idList ...[]byte) (*dedupv1.CheckResponse, error) {
	return nd.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: idList, Consistency: cons, MaxStalenessMs: maxStalenessMs})
}

// TestReadReplica_JoinsServesAndIsPromotedOnlyOnRequest: a read replica
// joins as a non-voter that the leader never promotes (several promotion
// rounds pass), answers stale, bounded and linearizable checks, forwards
// writes to the leader, and becomes a voter through Promote.
func TestReadReplica_JoinsServesAndIsPromotedOnlyOnRequest(t *testing.T) {
	tc := startCluster(t, replicaOpts(3))
	ctx := rpcCtx(t)
	r := tc.addReplica("r1")
	leader := tc.leader()

	// Promotion runs every TickInterval (200 ms) once PromoteAfter
	// (500 ms) has passed: a learner would be a voter well within this.
	time.Sleep(3 * time.Second)
	if got := suffrageOf(t, tc.leader(), "r1"); got != "replica" {
		t.Fatalf("after 3 s r1 is %q, want replica (never promoted by the leader)", got)
	}
	st, err := r.admin.Status(ctx, &dedupv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadReplica {
		t.Fatal("r1's status does not say read_replica")
	}

	marked := ids("rr-marked", 50)
	resp, err := markRetrying(ctx, leader.dedup, &dedupv1.MarkRequest{Items: markItems(marked), RequestToken: []byte("rr-1")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(marked), dedupv1.MarkResult_NEW)

	// Linearizable on the replica: one read index from the leader.
	lin, err := check(ctx, r, dedupv1.Consistency_CONSISTENCY_LINEARIZABLE, 0, marked...)
	if err != nil {
		t.Fatal(err)
	}
	wantCheckCodes(t, lin, len(marked), dedupv1.CheckResult_SEEN)
	if lin.ReadPath != dedupv1.ReadPath_READ_PATH_READ_INDEX {
		t.Fatalf("linearizable read path %v, want READ_INDEX", lin.ReadPath)
	}

	// Bounded: the marks were acknowledged more than 1 s ago, so a bounded
	// check of 1 s must see them, and on an idle log (the leader's
	// timestamp ticks) the replica proves its freshness locally.
	time.Sleep(time.Second)
	var b *dedupv1.CheckResponse
	waitFor(t, 10*time.Second, "a bounded check answered locally", func() bool {
		b, err = check(ctx, r, dedupv1.Consistency_CONSISTENCY_BOUNDED, 1000, marked...)
		if err != nil {
			t.Fatal(err)
		}
		return b.ReadPath == dedupv1.ReadPath_READ_PATH_LOCAL
	})
	wantCheckCodes(t, b, len(marked), dedupv1.CheckResult_SEEN)

	stale, err := check(ctx, r, dedupv1.Consistency_CONSISTENCY_STALE, 0, ids("rr-absent", 10)...)
	if err != nil {
		t.Fatal(err)
	}
	wantCheckCodes(t, stale, 10, dedupv1.CheckResult_NOT_SEEN)
	if stale.ReadPath != dedupv1.ReadPath_READ_PATH_LOCAL {
		t.Fatalf("stale read path %v, want LOCAL", stale.ReadPath)
	}

	// A write sent to the replica is forwarded to the leader.
	fwd := ids("rr-via-replica", 20)
	resp, err = markRetrying(ctx, r.dedup, &dedupv1.MarkRequest{Items: markItems(fwd), RequestToken: []byte("rr-2")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(fwd), dedupv1.MarkResult_NEW)
	resp, err = markRetrying(ctx, leader.dedup, &dedupv1.MarkRequest{Items: markItems(fwd), RequestToken: []byte("rr-3")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(fwd), dedupv1.MarkResult_DUPLICATE)

	// Bad input names the field.
	_, err = check(ctx, r, dedupv1.Consistency_CONSISTENCY_BOUNDED, 0, marked[0])
	wantStatus(t, err, codes.InvalidArgument, "max_staleness_ms")
	_, err = check(ctx, r, dedupv1.Consistency_CONSISTENCY_STALE, 5000, marked[0])
	wantStatus(t, err, codes.InvalidArgument, "max_staleness_ms")

	// Promote, through the replica (forwarded to the leader).
	if _, err := dedupv1.NewOpsClient(r.cc).Promote(ctx, &dedupv1.PromoteRequest{NodeId: "r1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "r1 a voter", func() bool { return suffrageOf(t, tc.leader(), "r1") == "voter" })
	// r1 learns of its promotion when it applies the entry: wait for it.
	waitFor(t, 30*time.Second, "promoted r1 no longer saying read_replica", func() bool {
		st, err := r.admin.Status(ctx, &dedupv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return !st.ReadReplica
	})
}

// TestReadReplica_BoundedFallsBackWhenCutOff: with the leader's
// replication to the replica cut, a mark acknowledged by the majority is
// missing on the replica: stale still answers (not_seen, from its own
// state), while bounded (whose freshness proof expired) and linearizable
// checks fail within the request deadline instead of answering not_seen.
// With the leader gone too they still fail in time. Once replication
// resumes, bounded answers seen.
func TestReadReplica_BoundedFallsBackWhenCutOff(t *testing.T) {
	tc := startCluster(t, replicaOpts(3))
	ctx := rpcCtx(t)
	r := tc.addReplica("r1")
	leader := tc.leader()
	probe := []byte("probe")
	waitFor(t, 10*time.Second, "a bounded check answered locally", func() bool {
		b, err := check(ctx, r, dedupv1.Consistency_CONSISTENCY_BOUNDED, 1000, probe)
		if err != nil {
			t.Fatal(err)
		}
		return b.ReadPath == dedupv1.ReadPath_READ_PATH_LOCAL
	})

	tc.cut(r)
	late := []byte("marked-while-cut-off")
	resp, err := markRetrying(ctx, leader.dedup, &dedupv1.MarkRequest{Items: markItems([][]byte{late}), RequestToken: []byte("cut-1")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, 1, dedupv1.MarkResult_NEW)
	time.Sleep(1200 * time.Millisecond) // the mark is now older than the bound

	stale, err := check(ctx, r, dedupv1.Consistency_CONSISTENCY_STALE, 0, late)
	if err != nil {
		t.Fatalf("stale check on a cut-off replica: %v", err)
	}
	if stale.Results[0].Code != dedupv1.CheckResult_NOT_SEEN {
		t.Fatalf("stale check on a cut-off replica: %v (the mark cannot have reached it)", stale.Results[0].Code)
	}
	const deadline = 2 * time.Second
	wantFailsInTime := func(what string, cons dedupv1.Consistency, maxMs int64) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		resp, err := check(cctx, r, cons, maxMs, late)
		if err == nil {
			t.Fatalf("%s on a cut-off replica answered %v via %v, want an error", what, resp.Results[0].Code, resp.ReadPath)
		}
		// The request's deadline bounds the call (gRPC ends it then); what
		// matters is that it fails rather than answers from the cut-off
		// state, and with an error that says to retry.
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			t.Fatalf("%s: %v, want Unavailable or DeadlineExceeded", what, err)
		}
	}
	wantFailsInTime("bounded check", dedupv1.Consistency_CONSISTENCY_BOUNDED, 1000)
	wantFailsInTime("linearizable check", dedupv1.Consistency_CONSISTENCY_LINEARIZABLE, 0)

	tc.heal(r)
	waitFor(t, 20*time.Second, "bounded check sees the mark after the cut heals", func() bool {
		b, err := check(ctx, r, dedupv1.Consistency_CONSISTENCY_BOUNDED, 1000, late)
		return err == nil && b.Results[0].Code == dedupv1.CheckResult_SEEN
	})

	// No leader at all (two of three voters stopped): bounded checks
	// cannot be proven fresh for long, then fail in time.
	for _, f := range tc.followers() {
		if f != r {
			tc.close(f)
			break
		}
	}
	tc.close(leader)
	time.Sleep(1200 * time.Millisecond)
	wantFailsInTime("bounded check without a leader", dedupv1.Consistency_CONSISTENCY_BOUNDED, 1000)
	stale, err = check(ctx, r, dedupv1.Consistency_CONSISTENCY_STALE, 0, late)
	if err != nil || stale.Results[0].Code != dedupv1.CheckResult_SEEN {
		t.Fatalf("stale check without a leader: %v %v, want seen", stale, err)
	}
}

// TestReadReplica_LosingEveryReplicaLosesNoWrite: replicas never count
// toward a commit. With both replicas unreachable and then stopped, every
// write is acknowledged and every acknowledged write is seen by the
// voters.
func TestReadReplica_LosingEveryReplicaLosesNoWrite(t *testing.T) {
	tc := startCluster(t, replicaOpts(3))
	ctx := rpcCtx(t)
	replicas := []*testNode{tc.addReplica("r1"), tc.addReplica("r2")}
	leader := tc.leader()
	for _, r := range replicas {
		tc.cut(r) // unreachable first: the leader keeps trying them
	}
	var all [][]byte
	for i := range 20 {
		batch := ids(fmt.Sprintf("no-replica-%d", i), 25)
		if i == 10 {
			for _, r := range replicas {
				tc.close(r)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := markRetrying(cctx, leader.dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: fmt.Appendf(nil, "nr-%d", i)})
		cancel()
		if err != nil {
			t.Fatalf("mark %d with every replica gone: %v", i, err)
		}
		wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_NEW)
		all = append(all, batch...)
	}
	for _, nd := range tc.live() {
		c, err := checkRetrying(ctx, nd.dedup, &dedupv1.CheckRequest{Ids: all})
		if err != nil {
			t.Fatal(err)
		}
		wantCheckCodes(t, c, len(all), dedupv1.CheckResult_SEEN)
	}
	if got := suffrageOf(t, tc.leader(), "r1"); got != "replica" {
		t.Fatalf("r1 is %q, want replica", got)
	}
}
