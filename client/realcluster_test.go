package client_test

// Helpers for tests against real in-process nodes (demo.Cluster wraps
// server.Start: real Raft, Pebble and gRPC on loopback ports from :0).

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/demo"
)

func startCluster(t *testing.T) *demo.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := demo.StartCluster(ctx, demo.ClusterConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Logf("close cluster: %v", err)
		}
	})
	return c
}

// patientRetry rides out an election on two loaded cores.
var patientRetry = client.WithRetry(100, 20*time.Millisecond, 500*time.Millisecond)

func newClient(t *testing.T, addrs []string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, addrs, append([]client.Option{patientRetry, client.WithTimeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
