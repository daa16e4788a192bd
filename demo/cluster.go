package demo

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

// ClusterConfig configures an in-process cluster.
type ClusterConfig struct {
	// Nodes is the number of nodes (default 3).
	Nodes int
	// Dir holds node i's data in Dir/n<i+1>. Required.
	Dir string
	// Logger receives every node's logs (default: discarded).
	Logger *slog.Logger
	// ElectionTimeout is Raft's heartbeat and election timeout (default
	// 500 ms: a killed leader is replaced within about a second, yet stays
	// stable on two loaded cores).
	ElectionTimeout time.Duration
	// NoAutoCreate makes a namespace unknown to the cluster an error
	// (default: namespaces are created on first use, as in dev mode).
	NoAutoCreate bool
}

// Cluster is a dedupnode cluster of real nodes (server.Start: Raft, Pebble,
// gRPC) inside this process, on loopback ports chosen by the OS. Nodes can
// be killed abruptly and restarted on the same addresses and data. Safe for
// concurrent use.
type Cluster struct {
	cfg   ClusterConfig
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	id  string
	cfg server.Config // addresses fixed; listeners not set
	srv *server.Server
}

// StartCluster starts cfg.Nodes nodes bootstrapped from a static peer list
// and waits, bounded by ctx, until one is a ready leader known to all. On
// error everything started is closed.
func StartCluster(ctx context.Context, cfg ClusterConfig) (_ *Cluster, err error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 3
	}
	if cfg.Dir == "" {
		return nil, errors.New("demo cluster: Dir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ElectionTimeout <= 0 {
		cfg.ElectionTimeout = 500 * time.Millisecond
	}
	c := &Cluster{cfg: cfg}
	// Bind every address first, so that the peer list is complete and no
	// other process can take a port meanwhile.
	var lns []net.Listener
	defer func() {
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
		}
	}()
	var peers []cluster.Peer
	for i := range cfg.Nodes {
		id := fmt.Sprintf("n%d", i+1)
		g, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, g)
		r, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, r)
		nd := &clusterNode{id: id, cfg: server.Config{
			Cluster: cluster.Config{
				NodeID:             id,
				DataDir:            filepath.Join(cfg.Dir, id),
				RaftAddr:           r.Addr().String(),
				GRPCAddr:           g.Addr().String(),
				Logger:             cfg.Logger.With("node", id),
				HeartbeatTimeout:   cfg.ElectionTimeout,
				ElectionTimeout:    cfg.ElectionTimeout,
				LeaderLeaseTimeout: cfg.ElectionTimeout / 2,
				TickInterval:       200 * time.Millisecond,
				PromoteAfter:       cfg.ElectionTimeout,
			},
			ListenAddr:           g.Addr().String(),
			AutoCreateNamespaces: !cfg.NoAutoCreate,
		}}
		peers = append(peers, cluster.Peer{ID: id, RaftAddr: r.Addr().String(), GRPCAddr: g.Addr().String()})
		c.nodes = append(c.nodes, nd)
	}
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		nd.cfg.Cluster.Peers = peers
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
	if err := errors.Join(errs...); err != nil {
		c.Close(context.Background())
		return nil, fmt.Errorf("start demo cluster: %w", err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		c.Close(context.Background())
		return nil, err
	}
	return c, nil
}

// Addrs returns the nodes' gRPC addresses, node order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.cfg.ListenAddr
	}
	return out
}

// Size returns the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// NodeID returns node i's ID ("n1", ...).
func (c *Cluster) NodeID(i int) string { return c.nodes[i].id }

// Server returns node i's server, nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
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
// returns its index.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if i := c.Leader(); i >= 0 && c.allKnow(c.nodes[i].id) {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("demo cluster: no ready leader: %w", ctx.Err())
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
		return fmt.Errorf("kill %s: %w", nd.id, err)
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
		return fmt.Errorf("restart %s: still running", nd.id)
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
			return fmt.Errorf("restart %s: %w (last error: %v)", nd.id, ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) tryStart(ctx context.Context, nd *clusterNode) (*server.Server, error) {
	cfg := nd.cfg
	g, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, err
	}
	r, err := net.Listen("tcp", cfg.Cluster.RaftAddr)
	if err != nil {
		g.Close()
		return nil, err
	}
	cfg.Listener, cfg.Cluster.RaftListener = g, r
	return server.Start(ctx, cfg)
}

// Close stops every running node gracefully (bounded by ctx) and returns
// the errors.
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
