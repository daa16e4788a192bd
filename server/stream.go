package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

// DefaultStreamInflight is how many calls of one Dedup.Stream a node works
// on at once by default (Config.StreamInflight).
const DefaultStreamInflight = 64

// Stream implements dedupv1.DedupServer: many Dedup calls on one stream.
// Each call runs through the same interceptors (Config.CallInterceptors:
// access control; metrics) and the same handler as its unary RPC, in its
// own goroutine, so a slow call (a write waiting for its commit) does not
// hold back the others. At most Config.StreamInflight calls of the stream
// run at once; meanwhile no further message is read and HTTP/2 flow
// control holds the client back.
//
// When the server closes, the stream stops reading, answers the calls it
// has, and ends with Unavailable, so GracefulStop does not wait for clients
// to hang up and clients retry elsewhere.
func (s *Server) Stream(ss dedupv1.Dedup_StreamServer) error {
	ctx := ss.Context()
	var (
		sendMu  sync.Mutex
		sendErr error
		calls   sync.WaitGroup
		mu      sync.Mutex // guards stopped against calls.Add after calls.Wait
		stopped bool
	)
	slots := make(chan struct{}, s.cfg.StreamInflight)
	send := func(resp *dedupv1.StreamResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = ss.Send(resp)
		}
	}
	// Calls run on this stream's workers, started as needed (about one
	// per slot) and kept until the stream ends: a goroutine per call paid
	// for growing a fresh stack on every call (runtime.newstack ≈ 11 % of
	// a leader's CPU answering 50×16 checks).
	work := make(chan *dedupv1.StreamRequest)
	quit := make(chan struct{})
	defer close(quit)
	serve := func(req *dedupv1.StreamRequest) {
		for {
			resp := s.streamCall(ctx, req)
			<-slots // free before sending: the answer is done
			send(resp)
			calls.Done()
			select {
			case req = <-work:
			case <-quit:
				return
			}
		}
	}
	// The reader runs apart from the handler so that the handler can end
	// the stream on shutdown while Recv blocks (returning cancels ctx,
	// which ends Recv).
	readDone := make(chan error, 1)
	s.wg.Add(1) // a handler is running: Close has not reached s.wg.Wait
	go func() {
		defer s.wg.Done()
		readDone <- func() error {
			for {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				req, err := ss.Recv()
				if err != nil {
					<-slots
					return err
				}
				mu.Lock()
				if stopped {
					mu.Unlock()
					return nil
				}
				calls.Add(1)
				mu.Unlock()
				select {
				case work <- req: // an idle worker took it
				default:
					go serve(req)
				}
			}
		}()
	}()
	var err error
	select {
	case err = <-readDone:
		if errors.Is(err, io.EOF) {
			err = nil // the client closed its side: answer what was read
		}
	case <-s.stop:
		err = toStatus(cluster.ErrShutdown) // Unavailable, reason SHUTTING_DOWN
	}
	mu.Lock()
	stopped = true
	mu.Unlock()
	calls.Wait()
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.FromContextError(err).Err()
		}
		return err
	}
	sendMu.Lock()
	defer sendMu.Unlock()
	return sendErr
}

// streamCall runs one call of a stream through the call interceptors and
// the unary handler of its kind, and wraps the answer.
func (s *Server) streamCall(ctx context.Context, req *dedupv1.StreamRequest) *dedupv1.StreamResponse {
	resp := &dedupv1.StreamResponse{RequestId: req.RequestId}
	var (
		method string
		in     any
		h      grpc.UnaryHandler
	)
	switch c := req.Call.(type) {
	case *dedupv1.StreamRequest_Check:
		method, in, h = dedupv1.Dedup_Check_FullMethodName, c.Check, s.checkHandler
	case *dedupv1.StreamRequest_Mark:
		method, in, h = dedupv1.Dedup_Mark_FullMethodName, c.Mark, s.markHandler
	case *dedupv1.StreamRequest_Claim:
		method, in, h = dedupv1.Dedup_Claim_FullMethodName, c.Claim, s.claimHandler
	case *dedupv1.StreamRequest_Commit:
		method, in, h = dedupv1.Dedup_Commit_FullMethodName, c.Commit, s.commitHandler
	case *dedupv1.StreamRequest_Renew:
		method, in, h = dedupv1.Dedup_Renew_FullMethodName, c.Renew, s.renewHandler
	case *dedupv1.StreamRequest_Release:
		method, in, h = dedupv1.Dedup_Release_FullMethodName, c.Release, s.releaseHandler
	case *dedupv1.StreamRequest_Forget:
		method, in, h = dedupv1.Dedup_Forget_FullMethodName, c.Forget, s.forgetHandler
	default:
		resp.Error = streamError(toStatus(invalidf("call", "no call set (one of check, mark, claim, commit, renew, release, forget)")))
		return resp
	}
	if req.TimeoutMs < 0 {
		resp.Error = streamError(toStatus(invalidf("timeout_ms", "%d is negative", req.TimeoutMs)))
		return resp
	}
	if req.TimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond)
		defer cancel()
	}
	out, err := s.callChain(ctx, in, &grpc.UnaryServerInfo{Server: s, FullMethod: method}, h)
	if err != nil {
		if ctx.Err() != nil && status.Code(err) == codes.Unknown {
			err = status.FromContextError(ctx.Err()).Err()
		}
		resp.Error = streamError(err)
		return resp
	}
	switch r := out.(type) {
	case *dedupv1.CheckResponse:
		resp.Result = &dedupv1.StreamResponse_Check{Check: r}
	case *dedupv1.MarkResponse:
		resp.Result = &dedupv1.StreamResponse_Mark{Mark: r}
	case *dedupv1.ClaimResponse:
		resp.Result = &dedupv1.StreamResponse_Claim{Claim: r}
	case *dedupv1.LeaseResponse:
		switch req.Call.(type) {
		case *dedupv1.StreamRequest_Commit:
			resp.Result = &dedupv1.StreamResponse_Commit{Commit: r}
		case *dedupv1.StreamRequest_Renew:
			resp.Result = &dedupv1.StreamResponse_Renew{Renew: r}
		default:
			resp.Result = &dedupv1.StreamResponse_Release{Release: r}
		}
	case *dedupv1.ForgetResponse:
		resp.Result = &dedupv1.StreamResponse_Forget{Forget: r}
	default:
		resp.Error = streamError(status.Error(codes.Internal, fmt.Sprintf("stream: %s answered %T", method, out)))
	}
	return resp
}

// streamError is err as the status a unary call would have returned.
func streamError(err error) *dedupv1.StreamError {
	p := status.Convert(err).Proto()
	return &dedupv1.StreamError{Code: p.Code, Message: p.Message, Details: p.Details}
}

// The unary handlers in grpc.UnaryHandler form, made once per Server (see
// initHandlers) so that a streamed call allocates no closure.
func (s *Server) initHandlers() {
	s.checkHandler = func(ctx context.Context, r any) (any, error) { return s.Check(ctx, r.(*dedupv1.CheckRequest)) }
	s.markHandler = func(ctx context.Context, r any) (any, error) { return s.Mark(ctx, r.(*dedupv1.MarkRequest)) }
	s.claimHandler = func(ctx context.Context, r any) (any, error) { return s.Claim(ctx, r.(*dedupv1.ClaimRequest)) }
	s.commitHandler = func(ctx context.Context, r any) (any, error) { return s.Commit(ctx, r.(*dedupv1.CommitRequest)) }
	s.renewHandler = func(ctx context.Context, r any) (any, error) { return s.Renew(ctx, r.(*dedupv1.RenewRequest)) }
	s.releaseHandler = func(ctx context.Context, r any) (any, error) { return s.Release(ctx, r.(*dedupv1.ReleaseRequest)) }
	s.forgetHandler = func(ctx context.Context, r any) (any, error) { return s.Forget(ctx, r.(*dedupv1.ForgetRequest)) }
}

// chainUnary composes interceptors into one, the first outermost, as
// grpc.ChainUnaryInterceptor does for unary calls.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return callAt(ics, 0, ctx, req, info, h)
	}
}

func callAt(ics []grpc.UnaryServerInterceptor, i int, ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if i == len(ics) {
		return h(ctx, req)
	}
	return ics[i](ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return callAt(ics, i+1, ctx, req, info, h)
	})
}
