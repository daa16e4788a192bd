package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// noCredential fails unless rec, a record answered to someone other than
// the lease's holder, is the live lease without what proves it: no
// request token, no fencing token.
func noCredential(t *testing.T, what string, rec *dedupv1.Record) {
	t.Helper()
	if rec.GetState() != dedupv1.RecordState_RECORD_STATE_LEASED || rec.GetExpiresUnixMs() == 0 {
		t.Errorf("%s: record %v, want the live lease (state, expiry)", what, rec)
	}
	if len(rec.GetRequestToken()) != 0 || rec.GetFencingToken() != 0 {
		t.Errorf("%s: record %v carries the holder's request token or fencing token", what, rec)
	}
}

// A lease is the holder's alone. A second consumer of job-3 learns that it
// is in progress and until when, from every answer (claim, check, mark,
// lease calls; unary through the leader or a follower, and streamed), but
// never the fencing token or request token that name the lease; and
// knowing (or guessing: it is a Raft index) the fencing token, it still
// cannot commit, renew or release the lease. The holder's own calls, and
// retries of its claim, answer as before.
func TestLeaseOnlyItsHolderCanCommitRenewOrRelease(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	leader, f := tc.leader(), tc.followers()[0]
	claim := func(nd *testNode, id, tok string) *dedupv1.ClaimResult {
		t.Helper()
		r, err := claimRetrying(ctx, nd.dedup, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte(id)}}, LeaseMs: 60_000, RequestToken: []byte(tok)})
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		return r.Results[0]
	}
	held := claim(f, "job-3", "holder-token")
	if held.Code != dedupv1.ClaimResult_ACQUIRED || held.Record.FencingToken == 0 || string(held.Record.RequestToken) != "holder-token" {
		t.Fatalf("holder's claim: %v, want ACQUIRED with its fencing token and request token", held)
	}
	fence := held.Record.FencingToken

	// What a second consumer is answered.
	for _, nd := range []*testNode{leader, f} {
		r := claim(nd, "job-3", "second-token")
		if r.Code != dedupv1.ClaimResult_IN_PROGRESS {
			t.Fatalf("second claim via %s: %v, want IN_PROGRESS", nd.id, r)
		}
		noCredential(t, "second claim via "+nd.id, r.Record)
	}
	for _, compact := range []bool{false, true} {
		chk, err := f.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: [][]byte{[]byte("job-3")}, Compact: compact})
		if err != nil {
			t.Fatal(err)
		}
		noCredential(t, "check", chk.Results[0].Record)
		mk, err := leader.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("job-3")}), RequestToken: []byte("marker"), Compact: compact})
		if err != nil || len(mk.Results) != 1 || mk.Results[0].Code != dedupv1.MarkResult_DUPLICATE {
			t.Fatalf("mark of the leased ID: %v %v, want one DUPLICATE result", mk, err)
		}
		noCredential(t, "mark", mk.Results[0].Record)
	}

	// The second consumer with the holder's fencing token: its own request
	// token is not the holder's, and without one the call is refused.
	intruder := []*dedupv1.LeaseItem{{Id: []byte("job-3"), FencingToken: fence, RequestToken: []byte("second-token")}}
	lost := func(what string, resp *dedupv1.LeaseResponse, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		r := resp.Results[0]
		if r.Code != dedupv1.LeaseResult_LEASE_LOST || r.Reason != dedupv1.LeaseResult_TOKEN_MISMATCH {
			t.Fatalf("%s: %v, want LEASE_LOST TOKEN_MISMATCH", what, r)
		}
		noCredential(t, what, r.Record)
	}
	for _, nd := range []*testNode{leader, f} {
		resp, err := nd.dedup.Commit(ctx, &dedupv1.CommitRequest{Items: intruder})
		lost("intruder's commit via "+nd.id, resp, err)
		resp, err = nd.dedup.Renew(ctx, &dedupv1.RenewRequest{Items: intruder, LeaseMs: 60_000})
		lost("intruder's renew via "+nd.id, resp, err)
		resp, err = nd.dedup.Release(ctx, &dedupv1.ReleaseRequest{Items: intruder})
		lost("intruder's release via "+nd.id, resp, err)
		_, err = nd.dedup.Commit(ctx, &dedupv1.CommitRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("job-3"), FencingToken: fence}}})
		wantStatus(t, err, codes.InvalidArgument, "items[0].request_token")
	}

	// The same on a stream.
	st, err := f.dedup.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*dedupv1.StreamRequest{
		{RequestId: 1, Call: &dedupv1.StreamRequest_Claim{Claim: &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("job-3")}}, RequestToken: []byte("second-token")}}},
		{RequestId: 2, Call: &dedupv1.StreamRequest_Commit{Commit: &dedupv1.CommitRequest{Items: intruder}}},
		{RequestId: 3, Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{Ids: [][]byte{[]byte("job-3")}}}},
	} {
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	got := streamRecv(t, st, 3)
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for id, r := range got {
		if err := streamErr(r); err != nil {
			t.Fatalf("streamed call %d: %v", id, err)
		}
	}
	if r := got[1].GetClaim().Results[0]; r.Code != dedupv1.ClaimResult_IN_PROGRESS {
		t.Fatalf("streamed second claim: %v, want IN_PROGRESS", r)
	}
	noCredential(t, "streamed second claim", got[1].GetClaim().Results[0].Record)
	lost("streamed intruder's commit", got[2].GetCommit(), nil)
	noCredential(t, "streamed check", got[3].GetCheck().Results[0].Record)

	// The holder: its claim retried answers as the first time; it renews
	// and commits; the ID is then a duplicate for everyone.
	for _, nd := range []*testNode{leader, f} {
		if r := claim(nd, "job-3", "holder-token"); r.Code != dedupv1.ClaimResult_ACQUIRED || r.Record.FencingToken != fence || string(r.Record.RequestToken) != "holder-token" {
			t.Fatalf("holder's claim retried via %s: %v, want ACQUIRED as at first (%v)", nd.id, r, held)
		}
	}
	// An answer to an item that carries the lease's request token may
	// show the lease: only its holder has that token.
	mk, err := f.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("job-3")}), RequestToken: []byte("holder-token")})
	if err != nil || mk.Results[0].Code != dedupv1.MarkResult_DUPLICATE || mk.Results[0].Record.FencingToken != fence || string(mk.Results[0].Record.RequestToken) != "holder-token" {
		t.Fatalf("mark with the holder's request token: %v %v, want DUPLICATE showing the lease", mk, err)
	}
	mine := []*dedupv1.LeaseItem{{Id: []byte("job-3"), FencingToken: fence, RequestToken: []byte("holder-token")}}
	rn, err := f.dedup.Renew(ctx, &dedupv1.RenewRequest{Items: mine, LeaseMs: 60_000})
	if err != nil || rn.Results[0].Code != dedupv1.LeaseResult_OK || rn.Results[0].Record.FencingToken != fence || string(rn.Results[0].Record.RequestToken) != "holder-token" {
		t.Fatalf("holder's renew: %v %v, want OK with its lease", rn, err)
	}
	cm, err := f.dedup.Commit(ctx, &dedupv1.CommitRequest{Items: mine})
	if err != nil || cm.Results[0].Code != dedupv1.LeaseResult_OK {
		t.Fatalf("holder's commit: %v %v, want OK", cm, err)
	}
	if r := claim(leader, "job-3", "second-token"); r.Code != dedupv1.ClaimResult_DUPLICATE {
		t.Fatalf("claim after the holder's commit: %v, want DUPLICATE", r)
	}

	// Release: the intruder's does not free the ID; the holder's does.
	h4 := claim(leader, "job-4", "holder-token")
	resp, err := f.dedup.Release(ctx, &dedupv1.ReleaseRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("job-4"), FencingToken: h4.Record.FencingToken, RequestToken: []byte("second-token")}}})
	lost("intruder's release of job-4", resp, err)
	if r := claim(f, "job-4", "second-token"); r.Code != dedupv1.ClaimResult_IN_PROGRESS {
		t.Fatalf("claim after the intruder's release: %v, want IN_PROGRESS (still held)", r)
	}
	resp, err = f.dedup.Release(ctx, &dedupv1.ReleaseRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("job-4"), FencingToken: h4.Record.FencingToken, RequestToken: []byte("holder-token")}}})
	if err != nil || resp.Results[0].Code != dedupv1.LeaseResult_OK {
		t.Fatalf("holder's release: %v %v", resp, err)
	}
	if r := claim(f, "job-4", "second-token"); r.Code != dedupv1.ClaimResult_ACQUIRED {
		t.Fatalf("claim after the holder's release: %v, want ACQUIRED", r)
	}
}

// A claim sent without a request token gets one from the node, in its
// ACQUIRED answer, and commits with it: no lease exists that its holder
// cannot prove.
func TestClaimWithoutRequestTokenGetsOne(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1})
	ctx := rpcCtx(t)
	d := tc.leader().dedup
	r, err := claimRetrying(ctx, d, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("a")}, {Id: []byte("b"), RequestToken: []byte("own")}}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := r.Results[0].Record, r.Results[1].Record
	if len(a.GetRequestToken()) != 16 || string(b.GetRequestToken()) != "own" {
		t.Fatalf("claim without a request token: tokens %x and %q, want 16 random bytes and the item's own", a.GetRequestToken(), b.GetRequestToken())
	}
	cm, err := d.Commit(ctx, &dedupv1.CommitRequest{Items: []*dedupv1.LeaseItem{
		{Id: []byte("a"), FencingToken: a.FencingToken, RequestToken: a.RequestToken},
		{Id: []byte("b"), FencingToken: b.FencingToken, RequestToken: b.RequestToken},
	}})
	if err != nil || cm.Results[0].Code != dedupv1.LeaseResult_OK || cm.Results[1].Code != dedupv1.LeaseResult_OK {
		t.Fatalf("commit with the tokens the claim answered: %v %v", cm, err)
	}
}
