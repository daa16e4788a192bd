package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/server"
)

// testLog collects every node's logs and prints them only when the test
// fails; lines logged after the test ended are dropped.
type testLog struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.buf.Write(p)
	}
	return len(p), nil
}

func newTestLogger(t testing.TB) *slog.Logger {
	l := &testLog{}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.done = true
		if t.Failed() {
			t.Logf("node logs:\n%s", l.buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testcluster.WaitFor(t, timeout, what, cond)
}

// testNode is one node of a testCluster with a client connection to its
// current server (redialled when it restarts).
type testNode struct {
	i      int // index in the devcluster
	id     string
	srv    *server.Server
	cc     *grpc.ClientConn
	dedup  dedupv1.DedupClient
	admin  dedupv1.AdminClient
	closed bool
}

// testCluster is a devcluster (testcluster.New) seen node by node, with
// a gRPC connection to each running node.
type testCluster struct {
	t     testing.TB
	c     *devcluster.Cluster
	nodes []*testNode
}

type clusterOpts struct {
	n          int
	proxied    bool // devcluster.Config.RaftProxies: tc.cut, tc.heal
	autoCreate bool
	maxBatch   int
	tune       func(*cluster.Config)
	serverTune func(*server.Config)
	dcTune     func(i int, c *server.Config) // any other devcluster Tune
	backup     []byte                        // devcluster.Config.Backup
	nodeIDs    []string                      // default n1..nN
}

// startCluster starts opts.n nodes (devcluster: a static peer list, every
// address bound first, Raft timings of testcluster.Election), waits until
// a ready leader is known to every node, and closes everything at cleanup.
func startCluster(t testing.TB, opts clusterOpts) *testCluster {
	t.Helper()
	cfg := devcluster.Config{
		Nodes:                opts.n,
		Logger:               newTestLogger(t),
		AutoCreateNamespaces: opts.autoCreate,
		RaftProxies:          opts.proxied,
		Tune: func(i int, c *server.Config) {
			c.MaxBatch = opts.maxBatch
			if opts.tune != nil {
				opts.tune(&c.Cluster)
			}
			if opts.serverTune != nil {
				opts.serverTune(c)
			}
			if opts.dcTune != nil {
				opts.dcTune(i, c)
			}
		},
	}
	for _, id := range opts.nodeIDs {
		cfg.Addrs = append(cfg.Addrs, devcluster.Node{ID: id, GRPC: "127.0.0.1:0", Raft: "127.0.0.1:0"})
	}
	if opts.backup != nil {
		cfg.Backup = bytes.NewReader(opts.backup)
	}
	tc := &testCluster{t: t, c: testcluster.New(t, cfg)}
	for i := range tc.c.Size() {
		tc.nodes = append(tc.nodes, tc.wrap(i))
	}
	t.Cleanup(func() {
		for _, nd := range tc.nodes {
			if nd.cc != nil {
				nd.cc.Close()
			}
		}
	})
	return tc
}

// wrap is node i of the devcluster, with a connection to it.
func (tc *testCluster) wrap(i int) *testNode {
	nd := &testNode{i: i, id: tc.c.NodeID(i)}
	tc.dial(nd)
	return nd
}

func (tc *testCluster) dial(nd *testNode) {
	tc.t.Helper()
	nd.srv, nd.closed = tc.c.Server(nd.i), false
	cc, err := grpc.NewClient(nd.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tc.t.Fatal(err)
	}
	nd.cc, nd.dedup, nd.admin = cc, dedupv1.NewDedupClient(cc), dedupv1.NewAdminClient(cc)
}

// start restarts the stopped node nd on its addresses and data
// (devcluster.Restart) and connects to it again.
func (tc *testCluster) start(nd *testNode) {
	t := tc.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := tc.c.Restart(ctx, nd.i); err != nil {
		t.Fatal(err)
	}
	tc.dial(nd)
}

// close stops nd gracefully (devcluster.Stop).
func (tc *testCluster) close(nd *testNode) {
	if nd.closed {
		return
	}
	nd.closed = true
	nd.cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tc.c.Stop(ctx, nd.i); err != nil {
		tc.t.Errorf("close %s: %v", nd.id, err)
	}
}

// closeAll stops every node gracefully, all at once.
func (tc *testCluster) closeAll() {
	var wg sync.WaitGroup
	for _, nd := range tc.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc.close(nd)
		}()
	}
	wg.Wait()
}

// cut stops the Raft traffic to nd until heal (devcluster.Cut).
func (tc *testCluster) cut(nd *testNode) {
	tc.t.Helper()
	if err := tc.c.Cut(nd.i); err != nil {
		tc.t.Fatal(err)
	}
}

func (tc *testCluster) heal(nd *testNode) {
	tc.t.Helper()
	if err := tc.c.Heal(nd.i); err != nil {
		tc.t.Fatal(err)
	}
}

// add starts one more node (devcluster.Add) and connects to it.
func (tc *testCluster) add(ac devcluster.AddConfig) *testNode {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	i, err := tc.c.Add(ctx, ac)
	if err != nil {
		tc.t.Fatal(err)
	}
	nd := tc.wrap(i)
	tc.nodes = append(tc.nodes, nd)
	return nd
}

func (tc *testCluster) live() []*testNode {
	var out []*testNode
	for _, nd := range tc.nodes {
		if !nd.closed {
			out = append(out, nd)
		}
	}
	return out
}

// waitStable waits until one live node is a ready leader and every live
// node is healthy and knows that leader (devcluster.WaitLeader).
func (tc *testCluster) waitStable() *testNode {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	i, err := tc.c.WaitLeader(ctx)
	if err != nil {
		tc.t.Fatal(err)
	}
	return tc.nodes[i]
}

func (tc *testCluster) leader() *testNode {
	tc.t.Helper()
	return tc.waitStable()
}

func (tc *testCluster) followers() []*testNode {
	l := tc.leader()
	var out []*testNode
	for _, nd := range tc.live() {
		if nd != l {
			out = append(out, nd)
		}
	}
	return out
}

func rpcCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ids(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%05d", prefix, i)
	}
	return out
}

func markItems(idList [][]byte) []*dedupv1.MarkItem {
	out := make([]*dedupv1.MarkItem, len(idList))
	for i, id := range idList {
		out[i] = &dedupv1.MarkItem{Id: id}
	}
	return out
}

// markRetrying marks with one request token, retrying on Unavailable (safe:
// the token makes a retry return the original answer), until ctx ends.
func markRetrying(ctx context.Context, c dedupv1.DedupClient, req *dedupv1.MarkRequest) (*dedupv1.MarkResponse, error) {
	return retrying(ctx, func(actx context.Context) (*dedupv1.MarkResponse, error) { return c.Mark(actx, req) })
}

// claimRetrying is markRetrying for Claim.
func claimRetrying(ctx context.Context, c dedupv1.DedupClient, req *dedupv1.ClaimRequest) (*dedupv1.ClaimResponse, error) {
	return retrying(ctx, func(actx context.Context) (*dedupv1.ClaimResponse, error) { return c.Claim(actx, req) })
}

// retrying repeats call (same request, so same request token) while it
// fails with Unavailable or DeadlineExceeded, until ctx ends.
func retrying[R any](ctx context.Context, call func(context.Context) (R, error)) (R, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := call(actx)
		cancel()
		if err == nil {
			return resp, nil
		}
		var zero R
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			return zero, err
		}
		select {
		case <-ctx.Done():
			return zero, errors.Join(err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func wantMarkCodes(t testing.TB, resp *dedupv1.MarkResponse, n int, want dedupv1.MarkResult_Code) {
	t.Helper()
	if len(resp.Results) != n {
		t.Fatalf("got %d results, want %d", len(resp.Results), n)
	}
	for i, r := range resp.Results {
		if r.Code != want {
			t.Fatalf("result %d: %v, want %v", i, r.Code, want)
		}
	}
}

func wantCheckCodes(t testing.TB, resp *dedupv1.CheckResponse, n int, want dedupv1.CheckResult_Code) {
	t.Helper()
	if len(resp.Results) != n {
		t.Fatalf("got %d results, want %d", len(resp.Results), n)
	}
	for i, r := range resp.Results {
		if r.Code != want {
			t.Fatalf("result %d: %v, want %v", i, r.Code, want)
		}
	}
}

// reasonOf returns the ErrorInfo reason of err ("" if none).
func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == dedupv1.ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

func wantStatus(t testing.TB, err error, code codes.Code, msgContains string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msgContains) {
		t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), code, msgContains)
	}
}
