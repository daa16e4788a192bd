package client_test

import (
	"bytes"
	"context"
	"fmt"
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

// streamLog records what a client sends and receives on Dedup.Stream: the
// streams it opens and every call it sends (by target), and lets a test
// break a stream after it received a given answer.
type streamLog struct {
	mu    sync.Mutex
	opens int
	sent  []sentCall
	// onRecv, if set, sees every answer; a non-nil error replaces it (the
	// stream then counts as broken for the client).
	onRecv func(target string, r *dedupv1.StreamResponse) error
}

type sentCall struct {
	target string
	req    *dedupv1.StreamRequest
}

func (l *streamLog) interceptor() grpc.DialOption {
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != dedupv1.Dedup_Stream_FullMethodName {
			return cs, err
		}
		l.mu.Lock()
		l.opens++
		l.mu.Unlock()
		return &loggedStream{ClientStream: cs, l: l, target: cc.Target()}, nil
	})
}

func (l *streamLog) marks() []sentCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []sentCall
	for _, s := range l.sent {
		if s.req.GetMark() != nil {
			out = append(out, s)
		}
	}
	return out
}

type loggedStream struct {
	grpc.ClientStream
	l      *streamLog
	target string
}

func (s *loggedStream) SendMsg(m any) error {
	s.l.mu.Lock()
	s.l.sent = append(s.l.sent, sentCall{target: s.target, req: m.(*dedupv1.StreamRequest)})
	s.l.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *loggedStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	if f := s.l.onRecv; f != nil {
		return f(s.target, m.(*dedupv1.StreamResponse))
	}
	return nil
}

// With TransportStream every call of the Client, and every batch of its
// Batcher, is a message on one stream per node: no unary Dedup RPC is
// sent, and the answers are those of unary calls.
func TestStreamTransportCarriesEveryCall(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	var unary rpcLog
	var sl streamLog
	c := newClient(t, cl.Addrs(), client.WithTransport(client.TransportStream, 8), client.WithDialOptions(unary.interceptor(), sl.interceptor()))

	res, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("s-1")}, {ID: []byte("s-2")}}, time.Hour)
	if err != nil || res[0].Code != client.CodeNew || res[1].Code != client.CodeNew {
		t.Fatalf("mark: %v %v", res, err)
	}
	res, err = c.Claim(ctx, "orders", []client.Item{{ID: []byte("s-3")}}, time.Minute)
	if err != nil || res[0].Code != client.CodeAcquired {
		t.Fatalf("claim: %v %v", res, err)
	}
	lease, _ := res[0].Lease()
	if res, err = c.Renew(ctx, "orders", []client.Lease{lease}, time.Minute); err != nil || res[0].Code != client.CodeOK {
		t.Fatalf("renew: %v %v", res, err)
	}
	if res, err = c.Commit(ctx, "orders", []client.Lease{lease}, time.Hour); err != nil || res[0].Code != client.CodeOK {
		t.Fatalf("commit: %v %v", res, err)
	}
	if res, err = c.Release(ctx, "orders", []client.Lease{lease}); err != nil || res[0].Code != client.CodeLeaseLost {
		t.Fatalf("release of a committed lease: %v %v", res, err)
	}
	if res, err = c.Forget(ctx, "orders", [][]byte{[]byte("s-2")}); err != nil || res[0].Code != client.CodeOK {
		t.Fatalf("forget: %v %v", res, err)
	}
	res, err = c.Check(ctx, "orders", [][]byte{[]byte("s-1"), []byte("s-2"), []byte("s-3")}, client.Linearizable)
	if err != nil || res[0].Code != client.CodeSeen || res[1].Code != client.CodeNotSeen || res[2].Code != client.CodeSeen {
		t.Fatalf("check: %v %v", res, err)
	}
	// A bad call fails alone with the unary call's code.
	if _, err := c.Check(ctx, "orders", [][]byte{nil}, client.Linearizable); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("check of an empty ID: %v, want InvalidArgument", err)
	}

	// The Batcher streams by default: 40 concurrent single-ID calls.
	b := c.NewBatcher()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.Mark(ctx, "orders", client.Item{ID: fmt.Appendf(nil, "batched-%d", i)}, time.Hour)
			if err != nil || r.Code != client.CodeNew {
				t.Errorf("batched mark %d: %v %v", i, r, err)
			}
		}()
	}
	wg.Wait()
	b.Close()

	for _, m := range []string{"Check", "Mark", "Claim", "Commit", "Renew", "Release", "Forget"} {
		if n := unary.count("/dedup.v1.Dedup/" + m); n != 0 {
			t.Errorf("%d unary %s RPCs with the stream transport", n, m)
		}
	}
	sl.mu.Lock()
	opens, sent := sl.opens, len(sl.sent)
	sl.mu.Unlock()
	if opens == 0 || opens > len(cl.Addrs()) {
		t.Errorf("%d streams opened for %d nodes", opens, len(cl.Addrs()))
	}
	if sent < 9 {
		t.Errorf("%d calls sent on streams, want at least 9", sent)
	}
}

// A stream that breaks with calls in flight fails them with a retryable
// error, and the client retries them, with their request tokens, on the
// next leader: here the node the client streams to (the leader it found)
// answers a Mark, which the cluster applied, and is killed before the
// client reads the answer. The retry returns the original NEW. The node is
// not asked whether it still leads: on a loaded machine an election can
// move the leadership meanwhile, and the answer was lost all the same.
func TestStreamBrokenAfterApplyRetryReturnsOriginalNew(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	var fired atomic.Bool
	var sl streamLog
	sl.onRecv = func(target string, r *dedupv1.StreamResponse) error {
		if r.GetMark() == nil || fired.Load() {
			return nil
		}
		i := indexOf(cl.Addrs(), target)
		if i < 0 {
			return nil
		}
		fired.Store(true)
		if err := cl.Kill(i); err != nil {
			t.Errorf("kill %s: %v", target, err)
		}
		return status.Error(codes.Unavailable, "test: node killed after apply, answer lost")
	}
	c := newClient(t, cl.Addrs(), client.WithTransport(client.TransportStream, 0), client.WithDialOptions(sl.interceptor()))
	res, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("order-1")}, {ID: []byte("order-2")}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !fired.Load() {
		t.Fatal("no node was killed after answering the mark")
	}
	for _, r := range res {
		if r.Code != client.CodeNew {
			t.Fatalf("%s: %v after the stream broke between apply and answer, want new", r.ID, r.Code)
		}
	}
	marks := sl.marks()
	if len(marks) < 2 {
		t.Fatalf("%d mark attempts, want the lost one and a retry", len(marks))
	}
	first := marks[0].req.GetMark().GetRequestToken()
	for i, m := range marks {
		if tok := m.req.GetMark().GetRequestToken(); !bytes.Equal(tok, first) {
			t.Fatalf("attempt %d carried token %x, first %x", i, tok, first)
		}
	}
	if marks[len(marks)-1].target == marks[0].target {
		t.Fatalf("the retry went to the killed node %s", marks[0].target)
	}
	again, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("order-1")}}, time.Hour)
	if err != nil || again[0].Code != client.CodeDuplicate {
		t.Fatalf("a new mark of a retried ID: %v %v, want duplicate", again, err)
	}
}

// Many callers keep batches in flight on the leader's stream while the
// leader is stopped: the stream breaks mid-flight, its pending calls fail
// as retryable, the client retries them on the new leader, and every
// caller still gets NEW for every ID it marked (retries return the
// original answer), and every ID is recorded.
func TestStreamLeaderStoppedMidFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a node under load")
	}
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 120*time.Second)
	var sl streamLog
	c := newClient(t, cl.Addrs(), client.WithTransport(client.TransportStream, 0), client.WithDialOptions(sl.interceptor()))
	const callers, perCaller, batch = 16, 6, 8
	var done atomic.Int32
	var killed atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var all [][]byte
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Calls back to back until perCaller are done and two started
			// after the kill, so that calls are in flight at the kill.
			after := 0
			for k := 0; k < perCaller || after < 2; k++ {
				if killed.Load() {
					after++
				}
				items := make([]client.Item, batch)
				for i := range items {
					items[i].ID = fmt.Appendf(nil, "mid-%d-%d-%d", w, k, i)
				}
				res, err := c.Mark(ctx, "orders", items, time.Hour)
				if err != nil {
					t.Errorf("caller %d call %d: %v", w, k, err)
					return
				}
				for _, r := range res {
					if r.Code != client.CodeNew {
						t.Errorf("%s: %v, want new (a retry must return the original answer)", r.ID, r.Code)
					}
				}
				mu.Lock()
				for _, it := range items {
					all = append(all, it.ID)
				}
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	testcluster.WaitFor(t, 60*time.Second, "the first calls answered", func() bool { return done.Load() >= callers })
	leader, err := cl.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	sl.mu.Lock()
	opens := sl.opens
	sl.mu.Unlock()
	if opens < 2 {
		t.Fatalf("%d streams opened: the calls after the kill should have needed a new one", opens)
	}
	tokens := map[string]int{}
	retried := 0
	for _, m := range sl.marks() {
		if tokens[string(m.req.GetMark().GetRequestToken())]++; tokens[string(m.req.GetMark().GetRequestToken())] == 2 {
			retried++
		}
	}
	if retried == 0 {
		t.Fatal("no call was retried: none was in flight when the leader stopped")
	}
	t.Logf("%d calls retried with their tokens after the leader stopped; %d streams opened", retried, opens)
	res, err := c.Check(ctx, "orders", all, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Code != client.CodeSeen {
			t.Fatalf("%s: %v after the retries, want seen", r.ID, r.Code)
		}
	}
}
