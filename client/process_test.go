package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

func TestProcessRunsOnceThenDuplicate(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())

	var runs atomic.Int64
	fn := func(ctx context.Context) error {
		if l, ok := client.LeaseFrom(ctx); !ok || l.FencingToken == 0 || string(l.ID) != "evt-1" {
			return fmt.Errorf("no lease in fn's context: %+v %v", l, ok)
		}
		runs.Add(1)
		return nil
	}
	res, err := c.Process(ctx, "proc", []byte("evt-1"), fn)
	if err != nil || res.Outcome != client.OutcomeProcessed || !res.Ran {
		t.Fatalf("first: %+v %v, want processed", res, err)
	}
	if res.Record == nil || res.Record.State != client.StateCommitted {
		t.Fatalf("first: record %+v, want committed", res.Record)
	}
	res, err = c.Process(ctx, "proc", []byte("evt-1"), fn)
	if err != nil || res.Outcome != client.OutcomeDuplicate || res.Ran {
		t.Fatalf("second: %+v %v, want duplicate, not run", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times, want 1", runs.Load())
	}
}

// A failed fn releases the lease: the redelivery runs at once (no wait for
// the lease to expire).
func TestProcessFailureReleasesForTheRedelivery(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	boom := errors.New("payment gateway down")
	res, err := c.Process(ctx, "proc", []byte("evt-2"), func(context.Context) error { return boom }, client.WithLease(time.Hour))
	if !errors.Is(err, boom) || res.Outcome != client.OutcomeFailed || !res.Ran {
		t.Fatalf("failing fn: %+v %v, want failed with fn's error", res, err)
	}
	res, err = c.Process(ctx, "proc", []byte("evt-2"), func(context.Context) error { return nil }, client.WithLease(time.Hour))
	if err != nil || res.Outcome != client.OutcomeProcessed {
		t.Fatalf("redelivery: %+v %v, want processed (lease released, not held for an hour)", res, err)
	}
}

// While one caller processes, another gets in_progress and does not run
// fn; a panic in fn releases the lease and is re-raised.
func TestProcessInProgressAndPanic(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())

	started, finish := make(chan struct{}), make(chan struct{})
	first := make(chan client.ProcessResult, 1)
	go func() {
		res, err := c.Process(ctx, "proc", []byte("evt-3"), func(context.Context) error {
			close(started)
			<-finish
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	<-started
	res, err := c.Process(ctx, "proc", []byte("evt-3"), func(context.Context) error {
		t.Error("fn ran while another caller held the lease")
		return nil
	})
	if err != nil || res.Outcome != client.OutcomeInProgress || res.Ran || res.Record == nil || res.Record.State != client.StateLeased {
		t.Fatalf("concurrent: %+v %v, want in_progress with the holder's lease", res, err)
	}
	close(finish)
	if r := <-first; r.Outcome != client.OutcomeProcessed {
		t.Fatalf("holder: %v, want processed", r.Outcome)
	}

	func() {
		defer func() {
			if p := recover(); p != "kaboom" {
				t.Fatalf("recovered %v, want the fn's panic re-raised", p)
			}
		}()
		_, _ = c.Process(ctx, "proc", []byte("evt-4"), func(context.Context) error { panic("kaboom") }, client.WithLease(time.Hour))
	}()
	res, err = c.Process(ctx, "proc", []byte("evt-4"), func(context.Context) error { return nil })
	if err != nil || res.Outcome != client.OutcomeProcessed {
		t.Fatalf("after panic: %+v %v, want processed (the panicking run released)", res, err)
	}
}

// The lease is renewed while fn runs: fn outlives the lease and still
// commits, and meanwhile nobody else can claim the ID. The lease is long
// next to the renewal interval: a renewal that a loaded machine delays
// past the lease's end loses the lease, rightly, and that is not what this
// test is about.
func TestProcessRenewsTheLeaseWhileFnRuns(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	var log rpcLog
	c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor()))
	other := newClient(t, cl.Addrs())

	const lease = 4 * time.Second
	start := time.Now()
	res, err := c.Process(ctx, "proc", []byte("evt-5"), func(fctx context.Context) error {
		// Run past the lease, with at least three renewals.
		testcluster.WaitFor(t, 60*time.Second, "three lease renewals and a lease length", func() bool {
			if fctx.Err() != nil {
				return true // the lease was lost: said below
			}
			if time.Since(start) <= lease {
				return false
			}
			n := 0
			for _, r := range log.of("/dedup.v1.Dedup/Renew") {
				if r.err == nil {
					n++
				}
			}
			return n >= 3
		})
		if err := fctx.Err(); err != nil {
			return fmt.Errorf("fn's context ended although the lease was renewed: %w", context.Cause(fctx))
		}
		r, err := other.Claim(ctx, "proc", []client.Item{{ID: []byte("evt-5")}}, 0)
		if err != nil {
			return err
		}
		if r[0].Code != client.CodeInProgress {
			return fmt.Errorf("claim by another caller after renewals: %v, want in_progress", r[0].Code)
		}
		return nil
	}, client.WithLease(lease), client.WithRenewEvery(lease/8))
	if err != nil || res.Outcome != client.OutcomeProcessed {
		t.Fatalf("%+v %v, want processed", res, err)
	}
}

// When the lease is lost while fn runs (here an operator Forgets the ID),
// the next renewal says so, fn's context is cancelled with ErrLeaseLost,
// and Process reports lease_lost.
func TestProcessLeaseLostCancelsFn(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	started := make(chan struct{})
	var fnCause error
	done := make(chan struct{})
	var res client.ProcessResult
	var err error
	go func() {
		defer close(done)
		res, err = c.Process(ctx, "proc", []byte("evt-6"), func(fctx context.Context) error {
			close(started)
			<-fctx.Done()
			fnCause = context.Cause(fctx)
			return fctx.Err()
		}, client.WithLease(10*time.Second), client.WithRenewEvery(100*time.Millisecond))
	}()
	<-started
	if _, ferr := c.Forget(ctx, "proc", [][]byte{[]byte("evt-6")}); ferr != nil {
		t.Fatal(ferr)
	}
	<-done
	if !errors.Is(fnCause, client.ErrLeaseLost) {
		t.Fatalf("fn's context cause %v, want ErrLeaseLost", fnCause)
	}
	if !errors.Is(err, client.ErrLeaseLost) || res.Outcome != client.OutcomeLeaseLost || !res.Ran {
		t.Fatalf("%+v %v, want lease_lost", res, err)
	}
}

func TestProcessConflictOnOtherDigest(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	nop := func(context.Context) error { return nil }
	if res, err := c.Process(ctx, "proc", []byte("evt-7"), nop, client.WithDigest(client.Digest([]byte("amount=10")))); err != nil || res.Outcome != client.OutcomeProcessed {
		t.Fatalf("first: %+v %v", res, err)
	}
	res, err := c.Process(ctx, "proc", []byte("evt-7"), nop, client.WithDigest(client.Digest([]byte("amount=99"))))
	if err != nil || res.Outcome != client.OutcomeConflict || res.Ran {
		t.Fatalf("same ID, other body: %+v %v, want conflict", res, err)
	}
	res, err = c.Process(ctx, "proc", []byte("evt-7"), nop, client.WithDigest(client.Digest([]byte("amount=10"))))
	if err != nil || res.Outcome != client.OutcomeDuplicate {
		t.Fatalf("same ID, same body: %+v %v, want duplicate", res, err)
	}
}

// Many goroutines process overlapping IDs through one Batcher: each ID's
// fn runs exactly once, and the claims share RPCs.
func TestProcessBatchedManyGoroutinesEachIDOnce(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	c := newClient(t, cl.Addrs())
	b := c.NewBatcher()
	t.Cleanup(func() { b.Close() })

	const distinct, goroutines = 40, 64
	var mu sync.Mutex
	runs := map[string]int{}
	outcomes := map[client.Outcome]int{}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range distinct {
				id := fmt.Appendf(nil, "evt-%d", (i+g)%distinct)
				for {
					res, err := b.Process(ctx, "many", id, func(context.Context) error {
						mu.Lock()
						runs[string(id)]++
						mu.Unlock()
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					outcomes[res.Outcome]++
					mu.Unlock()
					if res.Outcome != client.OutcomeInProgress {
						break
					}
					// Another goroutine holds the lease: wait for its commit,
					// as a broker's redelivery would.
					select {
					case <-ctx.Done():
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
		}()
	}
	wg.Wait()
	if len(runs) != distinct {
		t.Fatalf("%d IDs processed, want %d", len(runs), distinct)
	}
	for id, n := range runs {
		if n != 1 {
			t.Fatalf("%s: fn ran %d times, want once", id, n)
		}
	}
	if outcomes[client.OutcomeProcessed] != distinct || outcomes[client.OutcomeDuplicate] != distinct*(goroutines-1) {
		t.Fatalf("outcomes %v, want %d processed and %d duplicates", outcomes, distinct, distinct*(goroutines-1))
	}
	if st := b.Stats(); st.RPCs >= st.Calls {
		t.Fatalf("stats %+v: no call shared an RPC", st)
	}
}
