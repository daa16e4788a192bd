package client_test

// An ID named twice in one request, against a real 3-node cluster: the
// first occurrence wins and a repeat answers as a second request would
// (README Guarantees (1)), on every path a request takes: unary, streamed,
// a retried request, and a Batcher flush holding two callers' calls.

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

func codesOf(res []client.Result) string {
	s := ""
	for i, r := range res {
		if i > 0 {
			s += " "
		}
		s += r.Code.String()
	}
	return s
}

func wantResults(t *testing.T, what string, res []client.Result, err error, want string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got := codesOf(res); got != want {
		t.Fatalf("%s: got %s, want %s", what, got, want)
	}
}

func TestRepeatedIDInOneRequest(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	nodes, _ := startNodes(t, 3, nil)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	for _, tr := range []client.Transport{client.TransportUnary, client.TransportStream} {
		t.Run(fmt.Sprint(tr), func(t *testing.T) {
			c := newClient(t, addrs, client.WithTransport(tr, 0))
			ns := fmt.Sprint("rep-", tr)
			res, err := c.Mark(ctx, ns, items("x", "x", "y", "x"), time.Hour)
			wantResults(t, "mark x x y x", res, err, "new duplicate new duplicate")
			if a, b := res[0].Record, res[1].Record; b == nil || !bytes.Equal(a.RequestToken, b.RequestToken) || !a.Expires.Equal(b.Expires) {
				t.Fatalf("repeat's record %+v, want the first occurrence's %+v", b, a)
			}
			res, err = c.Mark(ctx, ns, []client.Item{{ID: []byte("d"), Digest: []byte("1")}, {ID: []byte("d"), Digest: []byte("2")}}, time.Hour)
			wantResults(t, "mark d d, other digests", res, err, "new conflict")

			res, err = c.Claim(ctx, ns, items("c", "c"), time.Minute)
			wantResults(t, "claim c c", res, err, "acquired in_progress")
			lease, ok := res[0].Lease()
			if !ok {
				t.Fatalf("claim c c: the first answer %+v names no lease", res[0])
			}
			if _, ok := res[1].Lease(); ok {
				t.Fatalf("claim c c: the repeat's in_progress answer %+v names the lease", res[1])
			}
			res, err = c.Commit(ctx, ns, []client.Lease{lease, lease}, time.Hour)
			wantResults(t, "commit c=T c=T", res, err, "ok ok")
			res, err = c.Claim(ctx, ns, items("c", "c"), time.Minute)
			wantResults(t, "claim c c after commit", res, err, "duplicate duplicate")
		})
	}

	// A request whose reply is lost is retried with its token and gets
	// every first answer back, the repeat's duplicate too.
	t.Run("retried", func(t *testing.T) {
		var log rpcLog
		c := newClient(t, addrs, fastRetry(10), client.WithTransport(client.TransportUnary, 0), client.WithDialOptions(log.interceptor()))
		for _, n := range nodes {
			n.faults.DropReplies(markMethod, 1)
		}
		res, err := c.Mark(ctx, "rep-retried", items("x", "x", "y"), time.Hour)
		wantResults(t, "mark x x y, its reply lost", res, err, "new duplicate new")
		marks := log.of(markMethod)
		if len(marks) < 2 {
			t.Fatalf("%d mark attempts, want a retry", len(marks))
		}
		for _, m := range marks[1:] {
			if !bytes.Equal(markToken(m), markToken(marks[0])) {
				t.Fatal("the retry carried another request token")
			}
		}
	})

	// Two callers of one Batcher claim the same ID and their calls leave
	// in one request: one wins (marks: TestBatcherSameIDTwiceInOneBatchHasOneWinner).
	t.Run("batcher", func(t *testing.T) {
		b := newClient(t, addrs).NewBatcher(client.WithMaxBatch(2), client.WithLinger(time.Minute))
		t.Cleanup(func() { b.Close() })
		var wg sync.WaitGroup
		res := make([]client.Result, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { res[i], errs[i] = b.Claim(ctx, "rep-batcher", client.Item{ID: []byte("b")}, time.Minute) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if st := b.Stats(); st.RPCs != 1 || st.Items != 2 {
			t.Fatalf("%+v, want both calls in one RPC", st)
		}
		if countCode(res, client.CodeAcquired) != 1 || countCode(res, client.CodeInProgress) != 1 {
			t.Fatalf("two callers got %s and %s, want one acquired, one in_progress", res[0].Code, res[1].Code)
		}
	})
}
