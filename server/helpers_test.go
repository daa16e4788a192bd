package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
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
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pauseProxy forwards TCP to target; Pause drops every connection and
// refuses new ones until Resume. Tests put it in front of a node's Raft
// address to cut the leader's replication to that node.
type pauseProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newPauseProxy(t testing.TB, target string) *pauseProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pauseProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *pauseProxy) Addr() string { return p.ln.Addr().String() }

func (p *pauseProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.paused {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
		p.mu.Unlock()
	}
}

func (p *pauseProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *pauseProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *pauseProxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

func (p *pauseProxy) close() {
	p.ln.Close()
	p.Pause()
	p.wg.Wait()
}

// testNode is one in-process node with a client connection to it.
type testNode struct {
	id     string
	cfg    Config
	srv    *Server
	proxy  *pauseProxy // in front of the raft address, when proxied
	cc     *grpc.ClientConn
	dedup  dedupv1.DedupClient
	admin  dedupv1.AdminClient
	closed bool
}

type testCluster struct {
	t     testing.TB
	opts  clusterOpts
	log   *slog.Logger
	nodes []*testNode
}

type clusterOpts struct {
	n          int
	proxied    bool
	autoCreate bool
	maxBatch   int
	tune       func(*cluster.Config)
	serverTune func(*Config)
}

// fastRaft are timeouts that elect quickly yet stay stable on two loaded
// cores under -race.
func fastRaft(c *cluster.Config) {
	c.HeartbeatTimeout = 500 * time.Millisecond
	c.ElectionTimeout = 500 * time.Millisecond
	c.LeaderLeaseTimeout = 250 * time.Millisecond
	c.TickInterval = 200 * time.Millisecond
	c.PromoteAfter = 500 * time.Millisecond
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startCluster starts opts.n nodes bootstrapped from a static peer list
// (every address is bound first, so there is no port race), waits for a
// ready leader and every node healthy, and closes everything at cleanup.
func startCluster(t testing.TB, opts clusterOpts) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, opts: opts, log: newTestLogger(t)}
	root := t.TempDir()
	var peers []cluster.Peer
	raftLns := make([]net.Listener, opts.n)
	grpcLns := make([]net.Listener, opts.n)
	for i := range opts.n {
		id := fmt.Sprintf("n%d", i+1)
		raftLns[i], grpcLns[i] = listen(t), listen(t)
		nd := &testNode{id: id}
		advertise := raftLns[i].Addr().String()
		if opts.proxied {
			nd.proxy = newPauseProxy(t, advertise)
			advertise = nd.proxy.Addr()
		}
		nd.cfg = Config{
			Cluster: cluster.Config{
				NodeID:        id,
				DataDir:       filepath.Join(root, id),
				RaftAdvertise: advertise,
				RaftAddr:      raftLns[i].Addr().String(),
				GRPCAddr:      grpcLns[i].Addr().String(),
			},
			ListenAddr:           grpcLns[i].Addr().String(),
			AutoCreateNamespaces: opts.autoCreate,
			MaxBatch:             opts.maxBatch,
		}
		peers = append(peers, cluster.Peer{ID: id, RaftAddr: advertise, GRPCAddr: grpcLns[i].Addr().String()})
		tc.nodes = append(tc.nodes, nd)
	}
	t.Cleanup(tc.closeAll)
	for i, nd := range tc.nodes {
		nd.cfg.Cluster.Peers = peers
		tc.start(nd, raftLns[i], grpcLns[i])
	}
	tc.waitStable()
	return tc
}

// start starts nd (listeners nil: bind its configured addresses again).
func (tc *testCluster) start(nd *testNode, raftLn, grpcLn net.Listener) {
	t := tc.t
	t.Helper()
	cfg := nd.cfg
	cfg.Cluster.Logger = tc.log
	fastRaft(&cfg.Cluster)
	if tc.opts.tune != nil {
		tc.opts.tune(&cfg.Cluster)
	}
	if tc.opts.serverTune != nil {
		tc.opts.serverTune(&cfg)
	}
	cfg.Cluster.RaftListener = raftLn
	cfg.Listener = grpcLn
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start %s: %v", nd.id, err)
	}
	nd.srv, nd.closed = srv, false
	nd.cc, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	nd.dedup = dedupv1.NewDedupClient(nd.cc)
	nd.admin = dedupv1.NewAdminClient(nd.cc)
}

func (tc *testCluster) close(nd *testNode) {
	if nd.closed || nd.srv == nil {
		return
	}
	nd.closed = true
	nd.cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nd.srv.Close(ctx); err != nil {
		tc.t.Errorf("close %s: %v", nd.id, err)
	}
}

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
// node is healthy and knows that leader.
func (tc *testCluster) waitStable() *testNode {
	tc.t.Helper()
	var leader *testNode
	waitFor(tc.t, 60*time.Second, "a ready leader known to every live node", func() bool {
		leader = nil
		for _, nd := range tc.live() {
			if nd.srv.Node().IsLeader() && nd.srv.Node().Healthy() {
				leader = nd
			}
		}
		if leader == nil {
			return false
		}
		for _, nd := range tc.live() {
			if id, _, _ := nd.srv.Node().Leader(); id != leader.id || !nd.srv.Node().Healthy() {
				return false
			}
		}
		return true
	})
	return leader
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
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.Mark(actx, req)
		cancel()
		if err == nil {
			return resp, nil
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
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

func wantStatus(t testing.TB, err error, code codes.Code, msgContains string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msgContains) {
		t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), code, msgContains)
	}
}
