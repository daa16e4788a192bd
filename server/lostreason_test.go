package server_test

import (
	"testing"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// A lease_lost answer carries the reason the leader's FSM decided, also
// when the request reaches a follower (forwarded): a wrong token, a
// released lease, a committed ID.
func TestLeaseLostCarriesReasonThroughAFollower(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	f := tc.followers()[0]
	ctx := rpcCtx(t)
	cl, err := claimRetrying(ctx, f.dedup, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("job")}}, LeaseMs: 60_000})
	if err != nil || cl.Results[0].Code != dedupv1.ClaimResult_ACQUIRED {
		t.Fatalf("claim: %v %v", cl, err)
	}
	fence, claimTok := cl.Results[0].Record.FencingToken, cl.Results[0].Record.RequestToken
	lease := func(id string, tok uint64) []*dedupv1.LeaseItem {
		return []*dedupv1.LeaseItem{{Id: []byte(id), FencingToken: tok, RequestToken: claimTok}}
	}
	want := func(what string, resp *dedupv1.LeaseResponse, err error, reason dedupv1.LeaseResult_Reason) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if r := resp.Results[0]; r.Code != dedupv1.LeaseResult_LEASE_LOST || r.Reason != reason {
			t.Errorf("%s: %s %s, want LEASE_LOST %s", what, r.Code, r.Reason, reason)
		}
	}
	resp, err := f.dedup.Commit(ctx, &dedupv1.CommitRequest{Items: lease("job", fence+1)})
	want("commit with another token", resp, err, dedupv1.LeaseResult_TOKEN_MISMATCH)
	resp, err = f.dedup.Renew(ctx, &dedupv1.RenewRequest{Items: lease("never", 5)})
	want("renew of an ID never claimed", resp, err, dedupv1.LeaseResult_NOT_CLAIMED)
	if resp, err = f.dedup.Commit(ctx, &dedupv1.CommitRequest{Items: lease("job", fence)}); err != nil || resp.Results[0].Code != dedupv1.LeaseResult_OK || resp.Results[0].Reason != dedupv1.LeaseResult_REASON_UNSPECIFIED {
		t.Fatalf("commit: %v %v, want OK without a reason", resp, err)
	}
	resp, err = f.dedup.Release(ctx, &dedupv1.ReleaseRequest{Items: lease("job", fence)})
	want("release after commit", resp, err, dedupv1.LeaseResult_ALREADY_COMMITTED)
}
