package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

func TestMarkViaOneNode_CheckViaEveryNode(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	batch := ids("order", 100)
	via := tc.followers()[0] // a follower forwards the write to the leader
	resp, err := via.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("tok-1")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_NEW)
	if r := resp.Results[0].Record; r == nil || r.State != dedupv1.RecordState_RECORD_STATE_COMMITTED || string(r.RequestToken) != "tok-1" || r.ExpiresUnixMs <= r.FirstSeenUnixMs {
		t.Fatalf("record %v", r)
	}
	for _, nd := range tc.nodes {
		c, err := nd.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: batch})
		if err != nil {
			t.Fatalf("check via %s: %v", nd.id, err)
		}
		wantCheckCodes(t, c, len(batch), dedupv1.CheckResult_SEEN)
		c, err = nd.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: ids("other", 10)})
		if err != nil {
			t.Fatal(err)
		}
		wantCheckCodes(t, c, 10, dedupv1.CheckResult_NOT_SEEN)
	}
	// A different caller marking the same IDs through another node: all
	// duplicates.
	resp, err = tc.nodes[2].dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("tok-2")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_DUPLICATE)
	// Stale reads converge on every node.
	for _, nd := range tc.nodes {
		waitFor(t, 20*time.Second, "stale check SEEN via "+nd.id, func() bool {
			c, err := nd.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: batch, Consistency: dedupv1.Consistency_CONSISTENCY_STALE})
			return err == nil && c.Results[len(batch)-1].Code == dedupv1.CheckResult_SEEN && c.Results[0].Code == dedupv1.CheckResult_SEEN
		})
	}
}

func TestInvariant7_RetriesReturnFirstAnswer(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	id := [][]byte{[]byte("evt-1")}
	first, err := tc.nodes[0].dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(id), RequestToken: []byte("A")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, first, 1, dedupv1.MarkResult_NEW)
	for _, nd := range tc.nodes {
		again, err := nd.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(id), RequestToken: []byte("A")})
		if err != nil {
			t.Fatal(err)
		}
		wantMarkCodes(t, again, 1, dedupv1.MarkResult_NEW)
		if again.Results[0].Record.FirstSeenUnixMs != first.Results[0].Record.FirstSeenUnixMs {
			t.Fatalf("retry changed the record: %v vs %v", again.Results[0].Record, first.Results[0].Record)
		}
		other, err := nd.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(id), RequestToken: []byte("B")})
		if err != nil {
			t.Fatal(err)
		}
		wantMarkCodes(t, other, 1, dedupv1.MarkResult_DUPLICATE)
	}
	// Claims: the winner's retry is ACQUIRED with the same fencing token.
	claim := func(nd *testNode, tok string) *dedupv1.ClaimResult {
		r, err := nd.dedup.Claim(ctx, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("job-9")}}, RequestToken: []byte(tok)})
		if err != nil {
			t.Fatal(err)
		}
		return r.Results[0]
	}
	c1 := claim(tc.nodes[1], "C")
	c2 := claim(tc.nodes[2], "C")
	c3 := claim(tc.nodes[0], "D")
	if c1.Code != dedupv1.ClaimResult_ACQUIRED || c2.Code != dedupv1.ClaimResult_ACQUIRED || c1.Record.FencingToken != c2.Record.FencingToken {
		t.Fatalf("claim and its retry: %v / %v", c1, c2)
	}
	if c3.Code != dedupv1.ClaimResult_IN_PROGRESS {
		t.Fatalf("second claimer: %v, want IN_PROGRESS", c3)
	}
	lr, err := tc.nodes[2].dedup.Commit(ctx, &dedupv1.CommitRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("job-9"), FencingToken: c1.Record.FencingToken, RequestToken: c1.Record.RequestToken}}})
	if err != nil || lr.Results[0].Code != dedupv1.LeaseResult_OK {
		t.Fatalf("commit: %v %v", lr, err)
	}
	if c := claim(tc.nodes[1], "E"); c.Code != dedupv1.ClaimResult_DUPLICATE {
		t.Fatalf("claim after commit: %v, want DUPLICATE", c)
	}
}

func TestInvariant1_AtMostOneWinner_ConcurrentClaims(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	const workers = 24
	var (
		wg                   sync.WaitGroup
		mu                   sync.Mutex
		acquired, inProgress int
		newMarks, dupMarks   int
	)
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := tc.nodes[w%len(tc.nodes)]
			<-start
			tok := []byte(fmt.Sprintf("worker-%d", w))
			// An election under load fails calls with Unavailable; the
			// documented retry (same request token) keeps the answer.
			cr, err := claimRetrying(ctx, nd.dedup, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("the-one")}}, RequestToken: tok})
			if err != nil {
				t.Errorf("claim via %s: %v", nd.id, err)
				return
			}
			mr, err := markRetrying(ctx, nd.dedup, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("the-mark")}), RequestToken: tok})
			if err != nil {
				t.Errorf("mark via %s: %v", nd.id, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch cr.Results[0].Code {
			case dedupv1.ClaimResult_ACQUIRED:
				acquired++
			case dedupv1.ClaimResult_IN_PROGRESS:
				inProgress++
			default:
				t.Errorf("claim: unexpected %v", cr.Results[0].Code)
			}
			switch mr.Results[0].Code {
			case dedupv1.MarkResult_NEW:
				newMarks++
			case dedupv1.MarkResult_DUPLICATE:
				dupMarks++
			default:
				t.Errorf("mark: unexpected %v", mr.Results[0].Code)
			}
		}()
	}
	close(start)
	wg.Wait()
	if acquired != 1 || inProgress != workers-1 {
		t.Fatalf("claims: %d ACQUIRED, %d IN_PROGRESS; want exactly 1 and %d", acquired, inProgress, workers-1)
	}
	if newMarks != 1 || dupMarks != workers-1 {
		t.Fatalf("marks: %d NEW, %d DUPLICATE; want exactly 1 and %d", newMarks, dupMarks, workers-1)
	}
}

func TestInvariant2_NoLostMarks_LeaderLoss(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	before := ids("before", 200)
	resp, err := tc.nodes[0].dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(before), RequestToken: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(before), dedupv1.MarkResult_NEW)

	old := tc.leader()
	tc.close(old)
	survivor := tc.live()[0]

	// Writes continue through a survivor; during the election they fail
	// with Unavailable and the retry (same token) is safe.
	after := ids("after", 200)
	resp, err = markRetrying(ctx, survivor.dedup, &dedupv1.MarkRequest{Items: markItems(after), RequestToken: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(after), dedupv1.MarkResult_NEW)
	newLeader := tc.waitStable()
	if newLeader == old {
		t.Fatal("closed node still leader")
	}
	for _, nd := range tc.live() {
		c, err := checkRetrying(ctx, nd.dedup, &dedupv1.CheckRequest{Ids: append(append([][]byte{}, before...), after...)})
		if err != nil {
			t.Fatal(err)
		}
		wantCheckCodes(t, c, len(before)+len(after), dedupv1.CheckResult_SEEN)
	}
	resp, err = markRetrying(ctx, survivor.dedup, &dedupv1.MarkRequest{Items: markItems(before), RequestToken: []byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(before), dedupv1.MarkResult_DUPLICATE)
}

func TestWritesWithoutQuorum_FailFastUnavailable(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	for _, f := range tc.followers() {
		tc.close(f)
	}
	last := tc.live()[0]
	// The mark must fail on its own (the lone leader steps down, or finds
	// no leader), not run into the caller's deadline: generous, so that a
	// loaded machine does not reach it, and checked as the deadline having
	// not fired rather than as a measured duration.
	const deadline = 60 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err := last.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("x", 1)), RequestToken: []byte("q")})
	if ctx.Err() != nil {
		t.Fatalf("mark without quorum ran into its %v deadline: %v", deadline, err)
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("mark without quorum: %v, want Unavailable", err)
	}
	// Whether the mark reached the log before the leader stepped down
	// (outcome unknown) or found no leader (nothing written) depends on
	// scheduling; either way the retry with the same token is safe.
	if r := reasonOf(err); r != dedupv1.ReasonOutcomeUnknown && r != dedupv1.ReasonNotLeader {
		t.Fatalf("mark without quorum: reason %q, want %s or %s: %v", r, dedupv1.ReasonOutcomeUnknown, dedupv1.ReasonNotLeader, err)
	}
	wantStatus(t, err, codes.Unavailable, "same request token")
	const deadline2 = 4 * time.Second
	// Linearizable reads fail too rather than answer from a lone node.
	rctx, rcancel := context.WithTimeout(context.Background(), deadline2)
	defer rcancel()
	_, err = last.dedup.Check(rctx, &dedupv1.CheckRequest{Ids: ids("x", 1)})
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("check without quorum: %v", err)
	}
}

// TestInvariant3_LinearizableCheck_LaggingFollower cuts the leader's
// replication to one follower, acknowledges marks through the others, and
// checks through the lagging follower: a linearizable Check may fail or
// wait, but never answers NOT_SEEN; a stale Check shows the lag is real.
func TestInvariant3_LinearizableCheck_LaggingFollower(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, proxied: true})
	ctx := rpcCtx(t)
	lagging := tc.followers()[0]
	tc.cut(lagging)

	batch := ids("lin", 50)
	resp, err := markRetrying(ctx, tc.leader().dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("l")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_NEW)

	stale, err := lagging.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: batch, Consistency: dedupv1.Consistency_CONSISTENCY_STALE})
	if err != nil {
		t.Fatal(err)
	}
	if stale.Results[0].Code != dedupv1.CheckResult_NOT_SEEN {
		t.Fatalf("the follower is not lagging (stale check: %v); the test proves nothing", stale.Results[0].Code)
	}
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := lagging.dedup.Check(cctx, &dedupv1.CheckRequest{Ids: batch})
		cancel()
		if err == nil {
			for i, r := range c.Results {
				if r.Code != dedupv1.CheckResult_SEEN {
					t.Fatalf("linearizable check via lagging follower answered %v for acknowledged mark %d", r.Code, i)
				}
			}
			continue
		}
		if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Unavailable {
			t.Fatalf("linearizable check via lagging follower: %v", err)
		}
	}

	tc.heal(lagging)
	waitFor(t, 60*time.Second, "linearizable check SEEN via the caught-up follower", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := lagging.dedup.Check(cctx, &dedupv1.CheckRequest{Ids: batch})
		if err != nil {
			return false
		}
		wantCheckCodes(t, c, len(batch), dedupv1.CheckResult_SEEN)
		return true
	})
}

// TestFollowerCatchesUpBySnapshot cuts one follower off until the leader
// has truncated its log past the follower's last entry, so the follower
// can only catch up by installing a snapshot.
func TestFollowerCatchesUpBySnapshot(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, proxied: true, tune: func(c *cluster.Config) {
		c.SnapshotThreshold = 16
		c.TrailingLogs = 4
		c.SnapshotInterval = 50 * time.Millisecond
	}})
	ctx := rpcCtx(t)
	leader := tc.leader()
	lagging := tc.followers()[0]
	tc.cut(lagging)
	lagLast := lagging.srv.Node().Raft().LastIndex()

	var all [][]byte
	for i := range 60 {
		batch := ids(fmt.Sprintf("snap%02d", i), 10)
		all = append(all, batch...)
		resp, err := markRetrying(ctx, leader.dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: fmt.Appendf(nil, "s%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_NEW)
	}
	waitFor(t, 30*time.Second, "the leader to truncate its log past the lagging follower", func() bool {
		st, err := leader.srv.Node().Status()
		return err == nil && st.FirstLogIndex > lagLast+1 && st.LastSnapshotIndex > lagLast
	})
	leaderApplied := leader.srv.Node().FSM().AppliedIndex()
	tc.heal(lagging)
	waitFor(t, 60*time.Second, "the lagging follower to catch up", func() bool {
		return lagging.srv.Node().FSM().AppliedIndex() >= leaderApplied
	})
	c, err := lagging.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: all, Consistency: dedupv1.Consistency_CONSISTENCY_STALE})
	if err != nil {
		t.Fatal(err)
	}
	wantCheckCodes(t, c, len(all), dedupv1.CheckResult_SEEN)
	// Replicas hold identical state once applied to the same index.
	waitFor(t, 30*time.Second, "equal digests", func() bool {
		a, b := leader.srv.Node().FSM(), lagging.srv.Node().FSM()
		if a.AppliedIndex() != b.AppliedIndex() {
			return false
		}
		da, err1 := a.Digest()
		db, err2 := b.Digest()
		return err1 == nil && err2 == nil && string(da) == string(db) && a.AppliedIndex() == b.AppliedIndex()
	})
}
