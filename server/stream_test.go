package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/server"
)

// streamRecv collects a stream's answers by request ID.
func streamRecv(t *testing.T, st dedupv1.Dedup_StreamClient, n int) map[uint64]*dedupv1.StreamResponse {
	t.Helper()
	out := map[uint64]*dedupv1.StreamResponse{}
	for len(out) < n {
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("recv after %d of %d answers: %v", len(out), n, err)
		}
		if _, dup := out[r.RequestId]; dup {
			t.Fatalf("request %d answered twice", r.RequestId)
		}
		out[r.RequestId] = r
	}
	return out
}

func streamErr(r *dedupv1.StreamResponse) error {
	e := r.GetError()
	if e == nil {
		return nil
	}
	return status.ErrorProto(&spb.Status{Code: e.Code, Message: e.Message, Details: e.Details})
}

// Streamed calls get the answers and errors of the unary calls, matched
// by request ID, and one bad call fails alone: the stream goes on. Sent to
// a follower, so writes are forwarded and checks use the follower's read
// index, as unary calls would.
func TestStreamAnswersAsUnary(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, autoCreate: true})
	f := tc.followers()[0]
	ctx := rpcCtx(t)
	st, err := f.dedup.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := ids("stream-a", 5), ids("stream-b", 3)
	reqs := []*dedupv1.StreamRequest{
		{RequestId: 10, TimeoutMs: 20_000, Call: &dedupv1.StreamRequest_Mark{Mark: &dedupv1.MarkRequest{Namespace: "s", Items: markItems(a), RequestToken: []byte("tok-a")}}},
		{RequestId: 11, Call: &dedupv1.StreamRequest_Mark{Mark: &dedupv1.MarkRequest{Namespace: "s", Items: markItems(b), RequestToken: []byte("tok-b")}}},
		// Invalid: an empty ID, named as the unary call names it.
		{RequestId: 12, Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{Namespace: "s", Ids: [][]byte{[]byte("x"), nil}}}},
		{RequestId: 13},
		{RequestId: 14, TimeoutMs: -1, Call: &dedupv1.StreamRequest_Forget{Forget: &dedupv1.ForgetRequest{Namespace: "s", Ids: a[:1]}}},
	}
	for _, r := range reqs {
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	got := streamRecv(t, st, len(reqs))
	for _, id := range []uint64{10, 11} {
		if err := streamErr(got[id]); err != nil {
			t.Fatalf("mark %d: %v", id, err)
		}
	}
	wantMarkCodes(t, got[10].GetMark(), len(a), dedupv1.MarkResult_NEW)
	wantMarkCodes(t, got[11].GetMark(), len(b), dedupv1.MarkResult_NEW)
	_, uerr := f.dedup.Check(ctx, &dedupv1.CheckRequest{Namespace: "s", Ids: [][]byte{[]byte("x"), nil}})
	serr := streamErr(got[12])
	if status.Code(uerr) != codes.InvalidArgument || status.Convert(serr).Message() != status.Convert(uerr).Message() {
		t.Fatalf("invalid check: streamed %v, unary %v", serr, uerr)
	}
	if len(status.Convert(serr).Details()) == 0 || len(status.Convert(serr).Details()) != len(status.Convert(uerr).Details()) {
		t.Fatalf("invalid check: streamed details %v, unary %v", status.Convert(serr).Details(), status.Convert(uerr).Details())
	}
	wantStatus(t, streamErr(got[13]), codes.InvalidArgument, "call")
	wantStatus(t, streamErr(got[14]), codes.InvalidArgument, "timeout_ms")

	// The stream still works; a retry with a's token answers NEW again
	// (the original answer), a unary Mark of a answers DUPLICATE.
	if err := st.Send(&dedupv1.StreamRequest{RequestId: 20, Call: &dedupv1.StreamRequest_Mark{Mark: &dedupv1.MarkRequest{Namespace: "s", Items: markItems(a), RequestToken: []byte("tok-a")}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&dedupv1.StreamRequest{RequestId: 21, Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{Namespace: "s", Ids: append(append([][]byte{}, a...), b...)}}}); err != nil {
		t.Fatal(err)
	}
	got = streamRecv(t, st, 2)
	wantMarkCodes(t, got[20].GetMark(), len(a), dedupv1.MarkResult_NEW)
	wantCheckCodes(t, got[21].GetCheck(), len(a)+len(b), dedupv1.CheckResult_SEEN)
	resp, err := f.dedup.Mark(ctx, &dedupv1.MarkRequest{Namespace: "s", Items: markItems(a), RequestToken: []byte("tok-other")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(a), dedupv1.MarkResult_DUPLICATE)

	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, want EOF", err)
	}
}

// A node works on at most StreamInflight calls of one stream at once: the
// calls are held in an interceptor and released one by one, and no more
// than the limit are ever inside it together; every call is answered.
func TestStreamBoundsCallsInFlight(t *testing.T) {
	const limit, calls = 2, 12
	var inside, most atomic.Int32
	release := make(chan struct{})
	hold := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == dedupv1.Dedup_Check_FullMethodName {
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			defer inside.Add(-1)
		}
		return h(ctx, req)
	}
	tc := startCluster(t, clusterOpts{n: 1, autoCreate: true, serverTune: func(c *server.Config) {
		c.StreamInflight = limit
		c.CallInterceptors = []grpc.UnaryServerInterceptor{hold}
	}})
	nd := tc.leader()
	ctx := rpcCtx(t)
	st, err := nd.dedup.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range calls {
		req := &dedupv1.StreamRequest{RequestId: uint64(i + 1), Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{Ids: ids(fmt.Sprint("held-", i), 1)}}}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "the first calls held", func() bool { return inside.Load() == limit })
	seen := map[uint64]bool{}
	for range calls {
		release <- struct{}{} // lets exactly one held call go on
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := streamErr(r); err != nil {
			t.Fatalf("call %d: %v", r.RequestId, err)
		}
		seen[r.RequestId] = true
	}
	if len(seen) != calls {
		t.Fatalf("%d distinct answers, want %d", len(seen), calls)
	}
	if m := most.Load(); m > limit {
		t.Fatalf("%d calls of one stream ran at once, limit %d", m, limit)
	}
}

// Closing a node ends its open streams with Unavailable (clients retry
// elsewhere) instead of holding the shutdown until clients hang up, after
// answering the calls it had read.
func TestStreamEndsUnavailableOnClose(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1, autoCreate: true})
	nd := tc.leader()
	st, err := nd.dedup.Stream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&dedupv1.StreamRequest{RequestId: 1, Call: &dedupv1.StreamRequest_Mark{Mark: &dedupv1.MarkRequest{Namespace: "s", Items: markItems(ids("close", 2)), RequestToken: []byte("t")}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || streamErr(r) != nil {
		t.Fatalf("first call: %v %v", err, streamErr(r))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := tc.c.Stop(ctx, nd.i); err != nil { // Server.Close
			t.Errorf("close: %v", err)
		}
	}()
	_, err = st.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", err)
	}
	wg.Wait()
	nd.closed = true
	nd.cc.Close()
}
