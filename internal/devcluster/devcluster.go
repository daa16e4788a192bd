// Package devcluster starts a dedupnode cluster of real nodes
// (server.Start: Raft, Pebble, gRPC) inside this process, on loopback. It
// is the one in-process cluster starter: `dedupnode dev`, the demo
// (demo.Run) and the tests (internal/testcluster) all use it.
//
// Nodes bootstrap from a static peer list; every address is bound before
// any node starts, so the peer list is complete and no other process can
// take a port meanwhile. Nodes can be killed abruptly and restarted on the
// same addresses and data.
package devcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/server"
)

// Node is one node's identity and addresses. The JSON form is what
// `dedupnode dev` keeps in DIR/dev-ports.json.
type Node struct {
	ID   string `json:"id"`
	GRPC string `json:"grpc"`
	Raft string `json:"raft"`
}

// FastElection is the election timeout of the demo's and the tests'
// clusters: a killed leader is replaced within about a second, yet the
// cluster stays stable on two loaded cores under -race.
const FastElection = 500 * time.Millisecond

// Config configures a cluster. Zero values take the defaults.
type Config struct {
	// Nodes is the number of nodes (default 3; len(Addrs) when Addrs is
	// set).
	Nodes int
	// Dir holds node i's data in Dir/<its ID>. Required.
	Dir string
	// Addrs fixes the nodes' IDs and addresses; nil: IDs n1..nN and free
	// loopback ports from the OS.
	Addrs []Node
	// Logger receives every node's logs, with a "node" attribute
	// (default: discarded).
	Logger *slog.Logger
	// ElectionTimeout, when set, is Raft's heartbeat and election timeout
	// (lease half of it, promotion of a caught-up non-voter after it); 0
	// keeps cluster.Config's defaults.
	ElectionTimeout time.Duration
	// LogStore is every node's Raft log store ("" = cluster's default).
	LogStore cluster.LogStore
	// AutoCreateNamespaces creates namespaces on first use.
	AutoCreateNamespaces bool
	// Tune, if not nil, adjusts node i's config (peers already set) once,
	// before its first start; restarts reuse the result.
	Tune func(i int, cfg *server.Config)
}

// NodeConfig is node id's config with dir as its data directory, serving
// Raft on raftLn and gRPC on grpcLn, with Raft timings from election (0:
// cluster's defaults). Peers, logger and the rest are the caller's.
func NodeConfig(id, dir string, raftLn, grpcLn net.Listener, election time.Duration) server.Config {
	cfg := server.Config{
		Cluster: cluster.Config{
			NodeID:       id,
			DataDir:      dir,
			RaftListener: raftLn,
			RaftAddr:     raftLn.Addr().String(),
			GRPCAddr:     grpcLn.Addr().String(),
		},
		Listener:   grpcLn,
		ListenAddr: grpcLn.Addr().String(),
	}
	setTimings(&cfg.Cluster, election)
	return cfg
}

func setTimings(c *cluster.Config, election time.Duration) {
	if election <= 0 {
		return
	}
	c.HeartbeatTimeout = election
	c.ElectionTimeout = election
	c.LeaderLeaseTimeout = election / 2
	c.TickInterval = 200 * time.Millisecond
	c.PromoteAfter = election
}

// Cluster is a running in-process cluster. Safe for concurrent use.
type Cluster struct {
	mu    sync.Mutex
	nodes []*node
}

type node struct {
	Node
	cfg server.Config // addresses fixed; listeners not set
	srv *server.Server
}

// StartError is Start's error when nodes failed to start: Errs[i] is node
// i's error (nil if it started).
type StartError struct {
	Errs []error
}

func (e *StartError) Error() string { return errors.Join(e.Errs...).Error() }

// Unwrap returns the nodes' errors.
func (e *StartError) Unwrap() []error { return e.Errs }

// First returns the first node's error and how many nodes failed.
func (e *StartError) First() (error, int) {
	var first error
	failed := 0
	for _, err := range e.Errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return first, failed
}

// Start binds every node's addresses, starts the nodes at once (with a
// static peer list each waits for the others to elect a leader), and waits,
// bounded by ctx, until one is a ready leader known to all. On error
// everything started is closed; a node that failed to bind or start makes
// the error a *StartError.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Dir == "" {
		return nil, errors.New("devcluster: Dir is required")
	}
	if cfg.Addrs != nil {
		cfg.Nodes = len(cfg.Addrs)
	}
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{}
	lns := make([]net.Listener, 2*cfg.Nodes)
	defer func() {
		if err != nil {
			for _, l := range lns {
				if l != nil {
					l.Close()
				}
			}
		}
	}()
	errs := make([]error, cfg.Nodes)
	var peers []cluster.Peer
	for i := range cfg.Nodes {
		n := Node{ID: fmt.Sprintf("n%d", i+1), GRPC: "127.0.0.1:0", Raft: "127.0.0.1:0"}
		if cfg.Addrs != nil {
			n = cfg.Addrs[i]
		}
		if lns[2*i], errs[i] = net.Listen("tcp", n.GRPC); errs[i] == nil {
			lns[2*i+1], errs[i] = net.Listen("tcp", n.Raft)
		}
		if errs[i] != nil {
			continue
		}
		n.GRPC, n.Raft = lns[2*i].Addr().String(), lns[2*i+1].Addr().String()
		nd := &node{Node: n, cfg: NodeConfig(n.ID, filepath.Join(cfg.Dir, n.ID), lns[2*i+1], lns[2*i], cfg.ElectionTimeout)}
		nd.cfg.Listener, nd.cfg.Cluster.RaftListener = nil, nil
		nd.cfg.Cluster.Logger = cfg.Logger.With("node", n.ID)
		nd.cfg.Cluster.LogStore = cfg.LogStore
		nd.cfg.AutoCreateNamespaces = cfg.AutoCreateNamespaces
		peers = append(peers, cluster.Peer{ID: n.ID, RaftAddr: n.Raft, GRPCAddr: n.GRPC})
		c.nodes = append(c.nodes, nd)
	}
	if failedToBind(errs) {
		return nil, &StartError{Errs: errs}
	}
	for i, nd := range c.nodes {
		nd.cfg.Cluster.Peers = peers
		if cfg.Tune != nil {
			cfg.Tune(i, &nd.cfg)
		}
	}
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := nd.cfg
			cfg.Listener, cfg.Cluster.RaftListener = lns[2*i], lns[2*i+1]
			nd.srv, errs[i] = server.Start(ctx, cfg)
		}()
	}
	wg.Wait()
	lns = nil // owned by the servers now
	if failedToBind(errs) {
		c.Close(context.Background())
		return nil, &StartError{Errs: errs}
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		c.Close(context.Background())
		return nil, err
	}
	return c, nil
}

func failedToBind(errs []error) bool { return errors.Join(errs...) != nil }

// Addrs returns the nodes' gRPC addresses, node order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.GRPC
	}
	return out
}

// Nodes returns the nodes' IDs and addresses, node order.
func (c *Cluster) Nodes() []Node {
	out := make([]Node, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.Node
	}
	return out
}

// Size returns the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// NodeID returns node i's ID ("n1", ...).
func (c *Cluster) NodeID(i int) string { return c.nodes[i].ID }

// Server returns node i's server, nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// Servers returns every node's server (nil for a node that is down).
func (c *Cluster) Servers() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*server.Server, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.srv
	}
	return out
}

// Leader returns the index of the node that is a ready leader, or -1.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, nd := range c.nodes {
		if nd.srv != nil && nd.srv.Node().IsLeader() && nd.srv.Node().Healthy() {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a ready leader is known to every running node and
// every running node is healthy, and returns the leader's index.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if i := c.Leader(); i >= 0 && c.allKnow(c.nodes[i].ID) {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("in-process cluster: no ready leader known to every node: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func (c *Cluster) allKnow(leader string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		if nd.srv == nil {
			continue
		}
		if id, _, _ := nd.srv.Node().Leader(); id != leader || !nd.srv.Node().Healthy() {
			return false
		}
	}
	return true
}

// Kill stops node i abruptly: Raft stops at once (no leadership transfer;
// proposals in flight end with "outcome unknown"), then the gRPC server is
// stopped without draining and the stores are closed. Requests that were
// committed but not yet answered get no answer from this node. No-op when
// the node is down.
func (c *Cluster) Kill(i int) error {
	c.mu.Lock()
	nd := c.nodes[i]
	srv := nd.srv
	nd.srv = nil
	c.mu.Unlock()
	if srv == nil {
		return nil
	}
	// With Raft already shut down, Server.Close skips the leadership
	// transfer; a cancelled context makes it Stop gRPC instead of draining.
	_ = srv.Node().Raft().Shutdown().Error()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := srv.Close(ctx); err != nil {
		return fmt.Errorf("kill %s: %w", nd.ID, err)
	}
	return nil
}

// KillLeader waits for a ready leader, kills it (see Kill) and returns its
// index.
func (c *Cluster) KillLeader(ctx context.Context) (int, error) {
	i, err := c.WaitLeader(ctx)
	if err != nil {
		return -1, err
	}
	return i, c.Kill(i)
}

// Restart starts node i again on its addresses and data. Binding the old
// ports is retried until ctx ends (another process may hold one briefly).
func (c *Cluster) Restart(ctx context.Context, i int) error {
	c.mu.Lock()
	nd := c.nodes[i]
	running := nd.srv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("restart %s: still running", nd.ID)
	}
	var lastErr error
	for {
		srv, err := c.tryStart(ctx, nd)
		if err == nil {
			c.mu.Lock()
			nd.srv = srv
			c.mu.Unlock()
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart %s: %w (last error: %v)", nd.ID, ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) tryStart(ctx context.Context, nd *node) (*server.Server, error) {
	cfg := nd.cfg
	g, err := net.Listen("tcp", nd.GRPC)
	if err != nil {
		return nil, err
	}
	r, err := net.Listen("tcp", nd.Raft)
	if err != nil {
		g.Close()
		return nil, err
	}
	cfg.Listener, cfg.Cluster.RaftListener = g, r
	return server.Start(ctx, cfg)
}

// Close stops every running node gracefully, all at once (bounded by ctx),
// and returns their errors.
func (c *Cluster) Close(ctx context.Context) error {
	c.mu.Lock()
	var srvs []*server.Server
	for _, nd := range c.nodes {
		if nd.srv != nil {
			srvs = append(srvs, nd.srv)
			nd.srv = nil
		}
	}
	c.mu.Unlock()
	errs := make([]error, len(srvs))
	var wg sync.WaitGroup
	for i, s := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Close(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
