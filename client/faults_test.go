package client_test

// Real nodes with fault injection: server.Start (real Raft, Pebble and gRPC
// on loopback ports from :0) with a gRPC unary server interceptor, passed
// through server.Config.ServerOptions, that counts the calls clients send
// to the node and can fail them before or after the real handler runs.
// Nothing here answers in a node's place: every reply that reaches a client
// was produced by the real server (or is a transport error the test
// injected on purpose). testcluster.Demo has no ServerOptions hook, hence
// startNodes (on testcluster.Start).

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/server"
)

// forwardedHeader is the metadata key a node sets on calls it forwards to
// the node it believes is the leader (server/route.go, mdForwarded). A
// non-leader answers a forwarded write with NOT_LEADER instead of
// forwarding it again.
const forwardedHeader = "x-dedupnode-forwarded-by"

func isForwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedHeader)) > 0
}

// faults is one node's fault injector. Calls between nodes (forwarded
// writes, read-index requests: they carry forwardedHeader) pass untouched
// and uncounted; faults and counts apply to the calls clients send.
type faults struct {
	mu    sync.Mutex
	calls map[string]int
	fail  map[string]int // method -> fail the next n calls before handling
	drop  map[string]int // method -> handle the next n calls, then lose the reply
	wrap  map[string]func(ctx context.Context, req any, h grpc.UnaryHandler) (any, error)
}

func newFaults() *faults {
	return &faults{calls: map[string]int{}, fail: map[string]int{}, drop: map[string]int{}, wrap: map[string]func(context.Context, any, grpc.UnaryHandler) (any, error){}}
}

// FailNext makes the next n client calls of method fail with Unavailable
// before the server handles them: nothing is applied.
func (f *faults) FailNext(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = n
}

// DropReplies makes the next n client calls of method run on the real
// server (a write is applied), then answers Unavailable instead of the
// reply: the reply was lost after the apply.
func (f *faults) DropReplies(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop[method] = n
}

// Wrap runs every later client call of method through w, which gets the
// real handler.
func (f *faults) Wrap(method string, w func(ctx context.Context, req any, h grpc.UnaryHandler) (any, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wrap[method] = w
}

// Calls returns how many calls of method clients sent to the node.
func (f *faults) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *faults) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if isForwarded(ctx) {
		return h(ctx, req)
	}
	m := info.FullMethod
	f.mu.Lock()
	f.calls[m]++
	fail := f.fail[m] > 0
	if fail {
		f.fail[m]--
	}
	drop := !fail && f.drop[m] > 0
	if drop {
		f.drop[m]--
	}
	w := f.wrap[m]
	f.mu.Unlock()
	if fail {
		return nil, status.Error(codes.Unavailable, "test fault: failed before handling")
	}
	var (
		resp any
		err  error
	)
	if w != nil {
		resp, err = w(ctx, req, h)
	} else {
		resp, err = h(ctx, req)
	}
	if drop {
		return nil, status.Errorf(codes.Unavailable, "test fault: reply lost after handling (handler error: %v)", err)
	}
	return resp, err
}

// realNode is one node started by startNodes.
type realNode struct {
	id     string
	addr   string // gRPC address
	srv    *server.Server
	faults *faults
}

// startNodes starts n real nodes (testcluster.Start), each with its own
// fault injector and namespaces created on first use. tune, if not nil,
// adjusts every node's config. It waits until a ready leader is known to
// every node, returns the nodes and the leader's index, and closes every
// node at cleanup.
func startNodes(t *testing.T, n int, tune func(*server.Config)) ([]*realNode, int) {
	t.Helper()
	nodes := make([]*realNode, n)
	srvs, leader := testcluster.Start(t, n, func(i int, cfg *server.Config) {
		f := newFaults()
		nodes[i] = &realNode{id: cfg.Cluster.NodeID, addr: cfg.Cluster.GRPCAddr, faults: f}
		cfg.AutoCreateNamespaces = true
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(f.intercept))
		if tune != nil {
			tune(cfg)
		}
	})
	for i, s := range srvs {
		nodes[i].srv = s
	}
	return nodes, leader
}

// startSingle starts a single real node (its own leader).
func startSingle(t *testing.T, tune func(*server.Config)) *realNode {
	t.Helper()
	nodes, _ := startNodes(t, 1, tune)
	return nodes[0]
}
