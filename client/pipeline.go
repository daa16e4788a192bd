package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// DefaultPipelineWindow is how many calls a Pipeline keeps in flight on
// its stream by default; a node works on 64 calls of one stream at once
// (server.DefaultStreamInflight), so more would only queue there.
const DefaultPipelineWindow = 64

// Transport says how a Client sends Dedup calls.
type Transport uint8

const (
	// TransportUnary sends each call as its own unary RPC.
	TransportUnary Transport = iota
	// TransportStream sends calls as messages on one long-lived
	// Dedup.Stream per node (a Pipeline), so concurrent calls share it
	// instead of paying for an RPC each. A node that does not serve
	// Dedup.Stream gets unary calls instead.
	TransportStream
)

// String returns "unary" or "stream".
func (t Transport) String() string {
	if t == TransportStream {
		return "stream"
	}
	return "unary"
}

// ParseTransport parses "unary" or "stream".
func ParseTransport(s string) (Transport, error) {
	switch s {
	case "unary":
		return TransportUnary, nil
	case "stream":
		return TransportStream, nil
	}
	return 0, fmt.Errorf("unknown transport %q (unary or stream)", s)
}

// errStreamUnsupported means the node does not serve Dedup.Stream; the
// Pipeline then sends unary calls.
var errStreamUnsupported = errors.New("dedupnode: node does not serve Dedup.Stream")

// Pipeline sends Dedup calls to one node as messages on a Dedup.Stream
// (pipelining, like Redis's): many goroutines' calls share the stream, each
// with its own request ID, deadline and answer, and at most window of them
// are in flight at once (further calls wait for a free slot or their
// context). It implements dedupv1.DedupClient, so code written against the
// generated client can use it unchanged; grpc.CallOptions given to its
// calls are ignored (they apply to RPCs, and a pipelined call is none).
//
// The stream is opened on first use and again after it broke. A broken
// stream (node stopped, connection lost) fails every call in flight on it
// with Unavailable, the code a failed unary attempt gets, so the Client
// retries them (writes with their request tokens, so a retry returns the
// original answer). A node that does not serve Dedup.Stream
// (Unimplemented) gets every later call as a unary RPC.
//
// A Client makes one Pipeline per node itself (WithTransport, and its
// Batcher by default).
type Pipeline struct {
	uc     dedupv1.DedupClient // unary calls: fallback and Stream itself
	target string
	base   context.Context // parent of every stream; cancelled by Close
	stop   context.CancelFunc
	slots  chan struct{}
	nextID atomic.Uint64
	unary  atomic.Bool // the node does not serve Dedup.Stream

	mu      sync.Mutex
	cur     *pstream
	opening *openAttempt
	closed  bool
	wg      sync.WaitGroup // readers
}

// pstream is one open Dedup.Stream and its unanswered calls.
type pstream struct {
	cs     dedupv1.Dedup_StreamClient
	cancel context.CancelFunc

	sendMu sync.Mutex

	mu      sync.Mutex
	pending map[uint64]pendingCall
	err     error // set once the stream broke; no call is added after
}

type pendingCall struct {
	done  chan streamResult
	write bool // not a Check: a broken stream leaves its outcome unknown
}

type streamResult struct {
	resp *dedupv1.StreamResponse
	err  error
}

type openAttempt struct {
	done chan struct{}
	s    *pstream
	err  error
}

// NewPipeline returns a Pipeline over cc. window < 1 means
// DefaultPipelineWindow. Close it when done (it does not close cc).
func NewPipeline(cc grpc.ClientConnInterface, window int) *Pipeline {
	if window < 1 {
		window = DefaultPipelineWindow
	}
	base, stop := context.WithCancel(context.Background())
	target := ""
	if c, ok := cc.(*grpc.ClientConn); ok {
		target = c.Target()
	}
	return &Pipeline{uc: dedupv1.NewDedupClient(cc), target: target, base: base, stop: stop, slots: make(chan struct{}, window)}
}

// Close ends the stream: calls in flight fail with Canceled, later calls
// with ErrClosed. It waits for the stream's reader to finish.
func (p *Pipeline) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stop()
	p.wg.Wait()
	return nil
}

// Check implements dedupv1.DedupClient.
func (p *Pipeline) Check(ctx context.Context, req *dedupv1.CheckRequest, opts ...grpc.CallOption) (*dedupv1.CheckResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Check{Check: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Check(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetCheck(); res != nil {
		return res, nil
	}
	return nil, mismatched("check", r)
}

// Mark implements dedupv1.DedupClient.
func (p *Pipeline) Mark(ctx context.Context, req *dedupv1.MarkRequest, opts ...grpc.CallOption) (*dedupv1.MarkResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Mark{Mark: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Mark(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetMark(); res != nil {
		return res, nil
	}
	return nil, mismatched("mark", r)
}

// Claim implements dedupv1.DedupClient.
func (p *Pipeline) Claim(ctx context.Context, req *dedupv1.ClaimRequest, opts ...grpc.CallOption) (*dedupv1.ClaimResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Claim{Claim: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Claim(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetClaim(); res != nil {
		return res, nil
	}
	return nil, mismatched("claim", r)
}

// Commit implements dedupv1.DedupClient.
func (p *Pipeline) Commit(ctx context.Context, req *dedupv1.CommitRequest, opts ...grpc.CallOption) (*dedupv1.LeaseResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Commit{Commit: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Commit(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetCommit(); res != nil {
		return res, nil
	}
	return nil, mismatched("commit", r)
}

// Renew implements dedupv1.DedupClient.
func (p *Pipeline) Renew(ctx context.Context, req *dedupv1.RenewRequest, opts ...grpc.CallOption) (*dedupv1.LeaseResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Renew{Renew: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Renew(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetRenew(); res != nil {
		return res, nil
	}
	return nil, mismatched("renew", r)
}

// Release implements dedupv1.DedupClient.
func (p *Pipeline) Release(ctx context.Context, req *dedupv1.ReleaseRequest, opts ...grpc.CallOption) (*dedupv1.LeaseResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Release{Release: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Release(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetRelease(); res != nil {
		return res, nil
	}
	return nil, mismatched("release", r)
}

// Forget implements dedupv1.DedupClient.
func (p *Pipeline) Forget(ctx context.Context, req *dedupv1.ForgetRequest, opts ...grpc.CallOption) (*dedupv1.ForgetResponse, error) {
	r, err := p.do(ctx, &dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Forget{Forget: req}})
	if errors.Is(err, errStreamUnsupported) {
		return p.uc.Forget(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if res := r.GetForget(); res != nil {
		return res, nil
	}
	return nil, mismatched("forget", r)
}

// Stream implements dedupv1.DedupClient: a raw stream of its own (not the
// Pipeline's).
func (p *Pipeline) Stream(ctx context.Context, opts ...grpc.CallOption) (dedupv1.Dedup_StreamClient, error) {
	return p.uc.Stream(ctx, opts...)
}

func mismatched(op string, r *dedupv1.StreamResponse) error {
	return status.Errorf(codes.Internal, "dedupnode %s: stream answered with %T", op, r.GetResult())
}

// do sends one call and waits for its answer, a broken stream, or ctx.
func (p *Pipeline) do(ctx context.Context, req *dedupv1.StreamRequest) (*dedupv1.StreamResponse, error) {
	if p.unary.Load() {
		return nil, errStreamUnsupported
	}
	if dl, ok := ctx.Deadline(); ok {
		rem := time.Until(dl)
		if rem <= 0 {
			return nil, status.FromContextError(context.DeadlineExceeded).Err()
		}
		req.TimeoutMs = int64((rem + time.Millisecond - 1) / time.Millisecond)
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	s, err := p.stream(ctx)
	if err != nil {
		<-p.slots
		return nil, err
	}
	id := p.nextID.Add(1)
	req.RequestId = id
	done := make(chan streamResult, 1)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		<-p.slots
		return nil, err
	}
	_, read := req.Call.(*dedupv1.StreamRequest_Check)
	s.pending[id] = pendingCall{done: done, write: !read}
	s.mu.Unlock()
	// From here the slot is freed by whoever takes the call out of
	// pending: the reader (answer or broken stream) or a failed send.
	s.sendMu.Lock()
	err = s.cs.Send(req)
	s.sendMu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		// Not sent (e.g. too large): the stream itself is fine.
		if _, ok := s.take(id); ok {
			<-p.slots
		}
		return nil, err
	}
	// io.EOF: the stream broke; the reader fails every pending call.
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		if e := r.resp.GetError(); e != nil {
			return nil, status.ErrorProto(&spb.Status{Code: e.Code, Message: e.Message, Details: e.Details})
		}
		return r.resp, nil
	case <-ctx.Done():
		// The answer, when it comes, frees the slot; the node bounds the
		// call by the timeout sent with it.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *pstream) take(id uint64) (pendingCall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pc, ok := s.pending[id]
	delete(s.pending, id)
	return pc, ok
}

// stream returns the open stream, opening one if there is none. Concurrent
// callers share one opening attempt; each waits for it only as long as its
// own ctx allows.
func (p *Pipeline) stream(ctx context.Context) (*pstream, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if s := p.cur; s != nil {
		p.mu.Unlock()
		return s, nil
	}
	a := p.opening
	if a == nil {
		a = &openAttempt{done: make(chan struct{})}
		p.opening = a
		p.wg.Add(1)
		go p.open(a)
	}
	p.mu.Unlock()
	select {
	case <-a.done:
		return a.s, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// open opens a stream for attempt a and, on success, runs its reader.
func (p *Pipeline) open(a *openAttempt) {
	defer p.wg.Done()
	sctx, cancel := context.WithCancel(p.base)
	cs, err := p.uc.Stream(sctx)
	if err != nil {
		err = p.streamErr(err) // takes p.mu
	}
	p.mu.Lock()
	p.opening = nil
	if err == nil && p.closed {
		err = ErrClosed
	}
	if err != nil {
		cancel()
		a.err = err
		p.mu.Unlock()
		close(a.done)
		return
	}
	s := &pstream{cs: cs, cancel: cancel, pending: map[uint64]pendingCall{}}
	p.cur, a.s = s, s
	p.mu.Unlock()
	close(a.done)
	p.read(s)
}

// read hands out answers until the stream breaks, then fails the calls
// still pending.
func (p *Pipeline) read(s *pstream) {
	for {
		r, err := s.cs.Recv()
		if err != nil {
			p.broke(s, err)
			return
		}
		if pc, ok := s.take(r.RequestId); ok {
			<-p.slots
			pc.done <- streamResult{resp: r}
		}
	}
}

func (p *Pipeline) broke(s *pstream, err error) {
	err = p.streamErr(err)
	p.mu.Lock()
	if p.cur == s {
		p.cur = nil
	}
	p.mu.Unlock()
	s.mu.Lock()
	s.err = err
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	s.cancel()
	// A write that was sent may have been applied: say so, as a node does
	// for a write whose outcome it cannot know (a retry with the same
	// request token returns the original answer).
	werr := err
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable && len(st.Details()) == 0 {
		if ws, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: dedupv1.ErrorDomain, Reason: dedupv1.ReasonOutcomeUnknown}); derr == nil {
			werr = ws.Err()
		}
	}
	for _, pc := range pending {
		<-p.slots
		if pc.write {
			pc.done <- streamResult{err: werr}
		} else {
			pc.done <- streamResult{err: err}
		}
	}
}

// streamErr turns the error that ended (or failed to open) a stream into
// the error its calls fail with: Unavailable, the code of a failed unary
// attempt, so they are retried, except for what a retry cannot heal
// (access refused) and for a closed Pipeline.
func (p *Pipeline) streamErr(err error) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unimplemented:
		p.unary.Store(true)
		return errStreamUnsupported
	case codes.Unauthenticated, codes.PermissionDenied:
		return err
	case codes.Unavailable:
		return err // keeps the node's own message and details
	}
	return status.Errorf(codes.Unavailable, "dedupnode: stream to %s broke: %v", p.target, err)
}

// transportKey carries a per-call Transport that overrides the Client's
// (the Batcher's own setting).
type transportKey struct{}

func withTransport(ctx context.Context, t Transport) context.Context {
	return context.WithValue(ctx, transportKey{}, t)
}

// dedup returns the Dedup client for one attempt on cc: the generated
// unary client, or the node's Pipeline.
func (c *Client) dedup(ctx context.Context, cc *grpc.ClientConn) dedupv1.DedupClient {
	if c.transport(ctx) == TransportUnary {
		return dedupv1.NewDedupClient(cc)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dedupLocked(ctx, cc)
}

// transport is the Transport of a call: the client's, or the one ctx
// carries (withTransport).
func (c *Client) transport(ctx context.Context) Transport {
	if v, ok := ctx.Value(transportKey{}).(Transport); ok {
		return v
	}
	return c.opts.transport
}

// dedupLocked is dedup with c.mu held.
func (c *Client) dedupLocked(ctx context.Context, cc *grpc.ClientConn) dedupv1.DedupClient {
	if c.transport(ctx) == TransportUnary {
		return dedupv1.NewDedupClient(cc)
	}
	p := c.pipes[cc]
	if p == nil {
		if c.pipes == nil {
			c.pipes = map[*grpc.ClientConn]*Pipeline{}
		}
		p = NewPipeline(cc, c.opts.window)
		c.pipes[cc] = p
	}
	return p
}
