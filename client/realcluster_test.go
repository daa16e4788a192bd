package client_test

// Helpers for tests against real in-process nodes (internal/testcluster:
// real Raft, Pebble and gRPC on loopback ports from :0).

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// newClient is testcluster.Client with a 5s per-call timeout.
func newClient(t *testing.T, addrs []string, opts ...client.Option) *client.Client {
	t.Helper()
	return testcluster.Client(t, addrs, append([]client.Option{client.WithTimeout(5 * time.Second)}, opts...)...)
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rpcLog records the unary RPCs a client sends: method, target and request.
type rpcLog struct {
	mu    sync.Mutex
	calls []rpcCall
}

type rpcCall struct {
	method string
	target string
	req    any
	err    error
}

func (l *rpcLog) interceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		l.mu.Lock()
		l.calls = append(l.calls, rpcCall{method: method, target: cc.Target(), req: req, err: err})
		l.mu.Unlock()
		return err
	})
}

func (l *rpcLog) count(method string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.method == method {
			n++
		}
	}
	return n
}

func (l *rpcLog) of(method string) []rpcCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []rpcCall
	for _, c := range l.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func ids(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%04d", prefix, i)
	}
	return out
}

func indexOf(addrs []string, target string) int {
	return slices.Index(addrs, target)
}
