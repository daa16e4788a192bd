// Package headercheck checks the response header of every answer on a gRPC
// connection: the client and a node's connections to its peers both refuse
// an answer whose dedupnode-cluster-id header names another cluster.
package headercheck

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Check inspects one answer's response header; a non-nil error replaces
// the answer (it came from a node that must not be believed).
type Check func(metadata.MD) error

// Unary returns an interceptor that hands each unary answer's header to
// check; a failed check replaces the call's own result.
func Unary(check Check) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var md metadata.MD
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&md))...)
		if cerr := check(md); cerr != nil {
			return cerr
		}
		return err
	}
}

// Stream returns an interceptor that checks a stream's header once, with
// the first message received (the header has arrived by then). A failed
// check fails that receive and every later one.
func Stream(check Check) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &checkedStream{ClientStream: cs, check: check}, nil
	}
}

type checkedStream struct {
	grpc.ClientStream
	check   Check
	checked bool
	err     error
}

func (s *checkedStream) RecvMsg(m any) error {
	if s.err != nil {
		return s.err
	}
	err := s.ClientStream.RecvMsg(m)
	if !s.checked {
		s.checked = true
		if md, herr := s.ClientStream.Header(); herr == nil {
			if s.err = s.check(md); s.err != nil {
				return s.err
			}
		}
	}
	return err
}
