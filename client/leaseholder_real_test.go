package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// withoutCredential fails unless r answers about a live lease someone else
// holds without what proves it: no request token, no fencing token, no
// Lease.
func withoutCredential(t *testing.T, what string, r client.Result) {
	t.Helper()
	if r.Record == nil || r.Record.State != client.StateLeased || r.Record.Expires.IsZero() {
		t.Errorf("%s: %v %+v, want the other holder's live lease", what, r.Code, r.Record)
		return
	}
	if len(r.Record.RequestToken) != 0 || r.Record.FencingToken != 0 {
		t.Errorf("%s: record %+v carries the holder's request token or fencing token", what, r.Record)
	}
	if _, ok := r.Lease(); ok {
		t.Errorf("%s: Result.Lease gives a lease", what)
	}
}

// A lease is its holder's alone, through every way the client sends: a
// second consumer (unary, streamed, batched, through Process) is told the
// ID is in progress and until when, never the tokens that name the lease,
// and with the holder's fencing token (it is a Raft index: guessable) it
// still cannot commit, renew or release the lease. The holder's own
// calls, and a retry of its claim, work as before.
func TestLeaseOnlyItsHolderCanCommitRenewOrRelease(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	cl := testcluster.Demo(t)
	holder := newClient(t, cl.Addrs())
	seconds := map[string]*client.Client{
		"unary":    newClient(t, cl.Addrs()),
		"streamed": newClient(t, cl.Addrs(), client.WithTransport(client.TransportStream, 0)),
	}
	batcher := testcluster.Batcher(t, cl.Addrs())

	res, err := holder.Claim(ctx, "jobs", items("job-3"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lease, ok := res[0].Lease()
	if !ok || string(lease.ID) != "job-3" || lease.FencingToken == 0 || len(lease.RequestToken) == 0 {
		t.Fatalf("holder's claim: %v %+v, lease %+v %v; want acquired with both tokens", res[0].Code, res[0].Record, lease, ok)
	}

	for name, c := range seconds {
		r, err := c.Claim(ctx, "jobs", items("job-3"), time.Minute)
		if err != nil || r[0].Code != client.CodeInProgress {
			t.Fatalf("%s second claim: %v %v, want in_progress", name, r, err)
		}
		withoutCredential(t, name+" second claim", r[0])
		chk, err := c.Check(ctx, "jobs", [][]byte{[]byte("job-3")}, client.Linearizable)
		if err != nil {
			t.Fatal(err)
		}
		withoutCredential(t, name+" check", chk[0])
		mk, err := c.Mark(ctx, "jobs", items("job-3"), 0)
		if err != nil || mk[0].Code != client.CodeDuplicate {
			t.Fatalf("%s mark of the leased ID: %v %v", name, mk, err)
		}
		withoutCredential(t, name+" mark", mk[0])

		// The holder's fencing token with a request token of the second
		// consumer's own (its claim's, say): not the lease.
		forged := []client.Lease{{ID: []byte("job-3"), FencingToken: lease.FencingToken, RequestToken: []byte("second-consumer")}}
		calls := map[string]func() ([]client.Result, error){
			"commit":  func() ([]client.Result, error) { return c.Commit(ctx, "jobs", forged, 0) },
			"renew":   func() ([]client.Result, error) { return c.Renew(ctx, "jobs", forged, time.Minute) },
			"release": func() ([]client.Result, error) { return c.Release(ctx, "jobs", forged) },
		}
		for op, call := range calls {
			r, err := call()
			if err != nil || r[0].Code != client.CodeLeaseLost || r[0].LostReason != client.LostTokenMismatch {
				t.Fatalf("%s %s with the holder's fencing token: %v %v, want lease_lost token_mismatch", name, op, r, err)
			}
			withoutCredential(t, name+" "+op, r[0])
		}
		// The fencing token alone is refused before anything is sent.
		_, err = c.Commit(ctx, "jobs", []client.Lease{{ID: []byte("job-3"), FencingToken: lease.FencingToken}}, 0)
		if e := client.AsError(err); e == nil || e.Kind != client.ErrInvalidArgument || e.Field != "items[0].request_token" || e.Item != 1 {
			t.Fatalf("%s commit without a request token: %v, want InvalidArgument items[0].request_token", name, err)
		}
	}

	// Batched, and through Process.
	r, err := batcher.Claim(ctx, "jobs", client.Item{ID: []byte("job-3")}, time.Minute)
	if err != nil || r.Code != client.CodeInProgress {
		t.Fatalf("batched second claim: %v %v", r, err)
	}
	withoutCredential(t, "batched second claim", r)
	r, err = batcher.Commit(ctx, "jobs", client.Lease{ID: []byte("job-3"), FencingToken: lease.FencingToken, RequestToken: []byte("second-consumer")}, 0)
	if err != nil || r.Code != client.CodeLeaseLost {
		t.Fatalf("batched commit with the holder's fencing token: %v %v, want lease_lost", r, err)
	}
	_, err = batcher.Release(ctx, "jobs", client.Lease{ID: []byte("job-3"), FencingToken: lease.FencingToken})
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("batched release without a request token: %v, want InvalidArgument", err)
	}
	for name, p := range map[string]client.Processor{"client": seconds["unary"], "batcher": batcher} {
		pr, err := p.Process(ctx, "jobs", []byte("job-3"), func(context.Context) error {
			t.Errorf("%s: fn ran while another consumer holds the lease", name)
			return nil
		})
		if err != nil || pr.Outcome != client.OutcomeInProgress || pr.Ran {
			t.Fatalf("%s Process of the held ID: %+v %v, want in_progress", name, pr, err)
		}
		withoutCredential(t, name+" Process", client.Result{Code: client.CodeInProgress, Record: pr.Record})
	}

	// The holder: its claim retried (same request token) answers as at
	// first; it renews and commits; the ID is then a duplicate for all.
	again, err := holder.Claim(ctx, "jobs", []client.Item{{ID: []byte("job-3"), RequestToken: lease.RequestToken}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := again[0].Lease(); !ok || l.FencingToken != lease.FencingToken || string(l.RequestToken) != string(lease.RequestToken) {
		t.Fatalf("holder's claim retried: %v %+v, want acquired with the same lease", again[0].Code, again[0].Record)
	}
	if r, err := holder.Renew(ctx, "jobs", []client.Lease{lease}, time.Minute); err != nil || r[0].Code != client.CodeOK {
		t.Fatalf("holder's renew: %v %v", r, err)
	}
	if r, err := holder.Commit(ctx, "jobs", []client.Lease{lease}, 0); err != nil || r[0].Code != client.CodeOK {
		t.Fatalf("holder's commit: %v %v", r, err)
	}
	if r, err := seconds["streamed"].Claim(ctx, "jobs", items("job-3"), time.Minute); err != nil || r[0].Code != client.CodeDuplicate {
		t.Fatalf("claim after the holder's commit: %v %v, want duplicate", r, err)
	}
}

// Process hands its fn the lease with both tokens (LeaseFrom) and commits
// with them, through a Client and a Batcher.
func TestProcessCommitsWithItsLeasesRequestToken(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	cl := testcluster.Demo(t)
	c := newClient(t, cl.Addrs())
	for name, p := range map[string]client.Processor{"client": c, "batcher": testcluster.Batcher(t, cl.Addrs())} {
		id := []byte("proc-" + name)
		var got client.Lease
		pr, err := p.Process(ctx, "jobs", id, func(ctx context.Context) error {
			got, _ = client.LeaseFrom(ctx)
			return nil
		}, client.WithClaimToken([]byte("my-claim-"+name)))
		if err != nil || pr.Outcome != client.OutcomeProcessed {
			t.Fatalf("%s Process: %+v %v", name, pr, err)
		}
		if got.FencingToken == 0 || string(got.RequestToken) != "my-claim-"+name || string(pr.Lease.RequestToken) != "my-claim-"+name {
			t.Fatalf("%s: lease in fn %+v, in the result %+v; want the claim's fencing token and request token", name, got, pr.Lease)
		}
	}
}
