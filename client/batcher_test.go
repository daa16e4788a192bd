package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// markAll runs one Batcher.Mark per ID, each from its own goroutine, and
// returns the results in ID order.
func markAll(t *testing.T, ctx context.Context, b *client.Batcher, ns string, idList [][]byte, ttl time.Duration) []client.Result {
	t.Helper()
	out := make([]client.Result, len(idList))
	errs := make([]error, len(idList))
	var wg sync.WaitGroup
	for i, id := range idList {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = b.Mark(ctx, ns, client.Item{ID: id}, ttl)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}

// With a linger longer than the test, a batch leaves only when full: 100
// concurrent single-ID calls become exactly 100/maxBatch batches on the
// wire. (An attempt a loaded machine's election or attempt timeout makes
// the client retry is the same batch again: same items, same tokens.)
func TestBatcherCoalescesConcurrentCallsIntoFullBatches(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	for _, maxBatch := range []int{100, 10} {
		var log rpcLog
		c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor()))
		b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(maxBatch), client.WithBatchTransport(client.TransportUnary)) // unary: the test reads the RPCs on the wire
		t.Cleanup(func() { b.Close() })

		idList := ids(fmt.Sprintf("coalesce%d", maxBatch), 100)
		for i, r := range markAll(t, ctx, b, "batch", idList, time.Hour) {
			if r.Code != client.CodeNew || !bytes.Equal(r.ID, idList[i]) {
				t.Fatalf("maxBatch %d: result %d = %s %v, want %s new", maxBatch, i, r.ID, r.Code, idList[i])
			}
		}
		want := 100 / maxBatch
		if st := b.Stats(); st.Calls != 100 || st.RPCs != uint64(want) || st.Items != 100 {
			t.Fatalf("maxBatch %d: stats %+v, want 100 calls in %d RPCs", maxBatch, st, want)
		}
		// Each item carries its own request token; a retried attempt
		// carries its batch's items and tokens again.
		batches := map[string][]*dedupv1.MarkItem{} // first item's token -> items
		seen := map[string]bool{}
		for _, m := range log.of("/dedup.v1.Dedup/Mark") {
			its := m.req.(*dedupv1.MarkRequest).GetItems()
			if len(its) != maxBatch {
				t.Fatalf("maxBatch %d: a Mark RPC with %d items", maxBatch, len(its))
			}
			key := string(its[0].GetRequestToken())
			if prev, ok := batches[key]; ok {
				for i, it := range its {
					if !bytes.Equal(it.GetId(), prev[i].GetId()) || !bytes.Equal(it.GetRequestToken(), prev[i].GetRequestToken()) {
						t.Fatalf("maxBatch %d: a retried batch changed item %d: %s %x, was %s %x", maxBatch, i, it.GetId(), it.GetRequestToken(), prev[i].GetId(), prev[i].GetRequestToken())
					}
				}
				continue
			}
			batches[key] = its
			for _, it := range its {
				tok := string(it.GetRequestToken())
				if len(tok) != 16 || seen[tok] {
					t.Fatalf("item %s: token %x missing or shared", it.GetId(), it.GetRequestToken())
				}
				seen[tok] = true
			}
		}
		if len(batches) != want {
			t.Fatalf("maxBatch %d: %d batches on the wire, want %d", maxBatch, len(batches), want)
		}
	}
}

// Calls of different operations, namespaces or TTLs never share a request,
// and each gets the TTL it asked for.
func TestBatcherGroupsByOperationNamespaceAndTTL(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	var log rpcLog
	c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor()))
	b := c.NewBatcher(client.WithLinger(50*time.Millisecond), client.WithBatchTransport(client.TransportUnary)) // unary: the test reads the RPCs on the wire
	t.Cleanup(func() { b.Close() })

	type call struct {
		ns  string
		ttl time.Duration
		id  string
	}
	calls := []call{
		{"ga", time.Hour, "x1"}, {"ga", time.Hour, "x2"},
		{"ga", 2 * time.Hour, "x3"}, {"ga", 2 * time.Hour, "x4"},
		{"gb", time.Hour, "x1"}, {"gb", time.Hour, "x5"},
	}
	res := make([]client.Result, len(calls))
	var wg sync.WaitGroup
	for i, cc := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if res[i], err = b.Mark(ctx, cc.ns, client.Item{ID: []byte(cc.id)}, cc.ttl); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.Code != client.CodeNew || r.Record == nil {
			t.Fatalf("%+v: %v, want new with a record", calls[i], r.Code)
		}
		if got := r.Record.Expires.Sub(r.Record.FirstSeen); got != calls[i].ttl {
			t.Fatalf("%+v: record lives %v, want %v", calls[i], got, calls[i].ttl)
		}
	}
	for _, m := range log.of("/dedup.v1.Dedup/Mark") {
		req := m.req.(*dedupv1.MarkRequest)
		for _, it := range req.GetItems() {
			for _, cc := range calls {
				if cc.id == string(it.GetId()) && cc.ns == req.GetNamespace() && cc.ttl.Milliseconds() != req.GetTtlMs() {
					t.Fatalf("%s/%s travelled with ttl %d ms, want %v", cc.ns, cc.id, req.GetTtlMs(), cc.ttl)
				}
			}
		}
	}
	// Check, Claim and Forget calls form their own requests too.
	if r, err := b.Check(ctx, "ga", []byte("x1"), client.Linearizable); err != nil || r.Code != client.CodeSeen {
		t.Fatalf("check: %v %v", r.Code, err)
	}
	if r, err := b.Claim(ctx, "ga", client.Item{ID: []byte("y1")}, 10*time.Second); err != nil || r.Code != client.CodeAcquired {
		t.Fatalf("claim: %v %v", r.Code, err)
	}
	if r, err := b.Forget(ctx, "ga", []byte("x1")); err != nil || r.Code != client.CodeOK {
		t.Fatalf("forget: %v %v", r.Code, err)
	}
	if r, err := b.Check(ctx, "ga", []byte("x1"), client.Linearizable); err != nil || r.Code != client.CodeNotSeen {
		t.Fatalf("check after forget: %v %v", r.Code, err)
	}
}

// Two goroutines marking the same ID in one batch: one wins.
func TestBatcherSameIDTwiceInOneBatchHasOneWinner(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(2))
	t.Cleanup(func() { b.Close() })
	res := markAll(t, ctx, b, "same", [][]byte{[]byte("dup"), []byte("dup")}, 0)
	if b.Stats().RPCs != 1 {
		t.Fatalf("stats %+v, want one RPC", b.Stats())
	}
	if n := countCode(res, client.CodeNew); n != 1 || countCode(res, client.CodeDuplicate) != 1 {
		t.Fatalf("results %v %v, want one new and one duplicate", res[0].Code, res[1].Code)
	}
}

func countCode(res []client.Result, code client.Code) int {
	n := 0
	for _, r := range res {
		if r.Code == code {
			n++
		}
	}
	return n
}

// One caller's bad ID (the server rejects the whole request, applying
// nothing) fails only that caller: the batch is split and resent.
func TestBatcherBadInputFailsOnlyItsCaller(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(10))
	t.Cleanup(func() { b.Close() })

	idList := ids("split", 10)
	// Too long for the namespace (512 bytes by default): the node rejects
	// the batch. (An empty ID the client refuses itself: it never joins
	// a batch.)
	idList[3] = []byte(strings.Repeat("x", 600))
	res := make([]client.Result, len(idList))
	errs := make([]error, len(idList))
	var wg sync.WaitGroup
	for i, id := range idList {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = b.Mark(ctx, "split", client.Item{ID: id}, 0)
		}()
	}
	wg.Wait()
	for i := range idList {
		if i == 3 {
			if status.Code(errs[i]) != codes.InvalidArgument {
				t.Fatalf("bad item: err %v, want InvalidArgument", errs[i])
			}
			continue
		}
		if errs[i] != nil || res[i].Code != client.CodeNew {
			t.Fatalf("item %d: %v %v, want new", i, res[i].Code, errs[i])
		}
	}
	if st := b.Stats(); st.RPCs < 2 {
		t.Fatalf("stats %+v: the rejected batch was not split", st)
	}
}

// A caller whose context ends while its call waits for a batch returns at
// once with its context's error; the others in the batch are unaffected,
// and Close sends what is waiting without lingering.
func TestBatcherCallerCancelAndCloseFlush(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	c := newClient(t, cl.Addrs())
	b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(1000))

	cctx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error, 1)
	go func() {
		_, err := b.Mark(cctx, "cancel", client.Item{ID: []byte("gave-up")}, 0)
		cancelled <- err
	}()
	kept := make(chan client.Result, 1)
	go func() {
		r, err := b.Mark(ctx, "cancel", client.Item{ID: []byte("kept")}, 0)
		if err != nil {
			t.Error(err)
		}
		kept <- r
	}()
	testcluster.WaitFor(t, 10*time.Second, "both calls to wait in the batcher", func() bool { return b.Stats().Calls == 2 })
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-kept; r.Code != client.CodeNew {
		t.Fatalf("kept caller after Close: %v, want new", r.Code)
	}
	if _, err := b.Mark(ctx, "cancel", client.Item{ID: []byte("late")}, 0); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("mark after Close: %v, want ErrClosed", err)
	}
	// The caller that gave up before its batch left was not sent.
	r, err := c.Check(ctx, "cancel", [][]byte{[]byte("gave-up")}, client.Linearizable)
	if err != nil || r[0].Code != client.CodeNotSeen {
		t.Fatalf("check gave-up: %v %v, want not_seen", r[0].Code, err)
	}
}

// A batch whose reply is lost after the real leader applied it is retried
// whole; every caller gets its original NEW, and each item carries the
// same token on every attempt.
func TestBatcherRetryAfterLostReplyKeepsEachCallersToken(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	var log rpcLog
	var dropped atomic.Int64
	drop := grpc.WithChainUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, m, req, reply, cc, opts...)
		if m == "/dedup.v1.Dedup/Mark" && err == nil && dropped.Add(1) <= 2 {
			return status.Error(codes.Unavailable, "test: reply lost after apply")
		}
		return err
	})
	c := newClient(t, cl.Addrs(), client.WithDialOptions(drop, log.interceptor()))
	b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(50), client.WithBatchTransport(client.TransportUnary)) // unary: the test reads the RPCs on the wire
	t.Cleanup(func() { b.Close() })

	for _, r := range markAll(t, ctx, b, "lost", ids("lost", 50), 0) {
		if r.Code != client.CodeNew {
			t.Fatalf("%s: %v after lost replies, want new", r.ID, r.Code)
		}
	}
	// Two lost replies, then the answer; a loaded machine may add
	// attempts (an election, an attempt timeout), each of the same batch.
	marks := log.of("/dedup.v1.Dedup/Mark")
	if len(marks) < 3 || b.Stats().RPCs != 1 {
		t.Fatalf("%d attempts for %d batches, want at least 3 attempts of 1 batch", len(marks), b.Stats().RPCs)
	}
	for i := range marks[0].req.(*dedupv1.MarkRequest).GetItems() {
		tok := marks[0].req.(*dedupv1.MarkRequest).GetItems()[i].GetRequestToken()
		for _, m := range marks[1:] {
			if got := m.req.(*dedupv1.MarkRequest).GetItems()[i].GetRequestToken(); !bytes.Equal(got, tok) {
				t.Fatalf("item %d: token changed across retries: %x then %x", i, tok, got)
			}
		}
	}
}

// Many goroutines, many calls: every call is answered, and the batches on
// the wire are fewer than the calls.
func TestBatcherUnderConcurrency(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	c := newClient(t, cl.Addrs())
	b := c.NewBatcher(client.WithMaxInflight(1))
	t.Cleanup(func() { b.Close() })

	const workers, per = 32, 50
	var news atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				// Every ID is marked by two workers.
				id := []byte{byte(w / 2), byte(i)}
				r, err := b.Mark(ctx, "conc", client.Item{ID: id}, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Code == client.CodeNew {
					news.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := news.Load(); got != workers/2*per {
		t.Fatalf("%d new, want %d (one per distinct ID)", got, workers/2*per)
	}
	st := b.Stats()
	if st.Calls != workers*per || st.RPCs >= st.Calls {
		t.Fatalf("stats %+v: want %d calls in fewer RPCs", st, workers*per)
	}
	t.Logf("%d calls in %d RPCs (%.1f items per RPC)", st.Calls, st.RPCs, float64(st.Items)/float64(st.RPCs))
}
