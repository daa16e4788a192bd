package client_test

// Real nodes with fault injection: server.Start (real Raft, Pebble and gRPC
// on loopback ports from :0) with a gRPC unary server interceptor, passed
// through server.Config.ServerOptions, that counts the calls clients send
// to the node and can fail them before or after the real handler runs.
// Nothing here answers in a node's place: every reply that reaches a client
// was produced by the real server (or is a transport error the test
// injected on purpose). demo.StartCluster has no ServerOptions hook, hence
// startNodes.

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/cluster"
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

// startNodes starts n real nodes bootstrapped from a static peer list, each
// with its own fault injector, with demo.StartCluster's Raft timings
// (stable on two loaded cores under -race). tune, if not nil, adjusts every
// node's config. It waits until a ready leader is known to every node,
// returns the nodes and the leader's index, and closes every node at
// cleanup.
func startNodes(t *testing.T, n int, tune func(*server.Config)) ([]*realNode, int) {
	t.Helper()
	const election = 500 * time.Millisecond
	dir := t.TempDir()
	nodes := make([]*realNode, n)
	cfgs := make([]server.Config, n)
	var peers []cluster.Peer
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		g, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			g.Close()
			t.Fatal(err)
		}
		f := newFaults()
		nodes[i] = &realNode{id: id, addr: g.Addr().String(), faults: f}
		cfgs[i] = server.Config{
			Cluster: cluster.Config{
				NodeID:             id,
				DataDir:            filepath.Join(dir, id),
				RaftListener:       r,
				GRPCAddr:           g.Addr().String(),
				HeartbeatTimeout:   election,
				ElectionTimeout:    election,
				LeaderLeaseTimeout: election / 2,
				TickInterval:       200 * time.Millisecond,
				PromoteAfter:       election,
			},
			Listener:             g,
			AutoCreateNamespaces: true,
			ServerOptions:        []grpc.ServerOption{grpc.ChainUnaryInterceptor(f.intercept)},
		}
		peers = append(peers, cluster.Peer{ID: id, RaftAddr: r.Addr().String(), GRPCAddr: g.Addr().String()})
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, nd := range nodes {
			if nd.srv == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := nd.srv.Close(ctx); err != nil {
					t.Logf("close %s: %v", nd.id, err)
				}
			}()
		}
		wg.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		cfgs[i].Cluster.Peers = peers
		if tune != nil {
			tune(&cfgs[i])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i].srv, errs[i] = server.Start(ctx, cfgs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %s: %v", nodes[i].id, err)
		}
	}
	leader := -1
	waitFor(t, 60*time.Second, "a ready leader known to every node", func() bool {
		leader = -1
		for i, nd := range nodes {
			if nd.srv.Node().IsLeader() && nd.srv.Node().Healthy() {
				leader = i
			}
		}
		if leader < 0 {
			return false
		}
		for _, nd := range nodes {
			if id, _, _ := nd.srv.Node().Leader(); id != nodes[leader].id || !nd.srv.Node().Healthy() {
				return false
			}
		}
		return true
	})
	return nodes, leader
}

// startSingle starts a single real node (its own leader).
func startSingle(t *testing.T, tune func(*server.Config)) *realNode {
	t.Helper()
	nodes, _ := startNodes(t, 1, tune)
	return nodes[0]
}
