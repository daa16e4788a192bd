// Package devcluster starts a dedupnode cluster of real nodes
// (server.Start: Raft, Pebble, gRPC) inside this process, on loopback. It
// is the one in-process cluster starter: `dedupnode dev`, the demo
// (demo.Run) and the tests (internal/testcluster) all use it.
//
// Nodes bootstrap from a static peer list; every address is bound before
// any node starts, so the peer list is complete and no other process can
// take a port meanwhile. Nodes can be stopped gracefully or killed
// abruptly and restarted on the same addresses and data; more nodes can
// join (as voters or read replicas); a cluster can start from a backup;
// with RaftProxies, the Raft traffic to a node can be cut and healed.
package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
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
	// before its first start; restarts reuse the result. Nodes added later
	// (Add) are tuned too.
	Tune func(i int, cfg *server.Config)
	// RaftProxies puts an in-process TCP proxy in front of every node's
	// Raft listener, on a fresh loopback port that the node advertises
	// (and the peer list names) instead: Cut(i) then stops the Raft
	// traffic to node i (the leader cannot replicate to it) until Heal(i).
	// Client and node-to-node gRPC go direct.
	RaftProxies bool
	// Backup, if not nil, is a backup (as Ops.Backup streams it) that the
	// cluster starts from: node 1's empty data directory is seeded from it
	// (cluster.SeedFromBackupStore, with LogStore) before its first start,
	// and it starts alone, with neither Bootstrap nor Peers, as a restored
	// node does. Requires Nodes 1; nodes added later (Add) join it and
	// receive the state. Seeded returns what the seeding found.
	Backup io.Reader
}

// nodeConfig is node id's config with dir as its data directory, serving
// Raft on raftLn and gRPC on grpcLn, with Raft timings from election (0:
// cluster's defaults). Peers, logger and the rest are the caller's.
func nodeConfig(id, dir string, raftLn, grpcLn net.Listener, election time.Duration) server.Config {
	cfg := server.Config{
		Cluster: cluster.Config{
			NodeID:       id,
			DataDir:      dir,
			RaftListener: raftLn,
			RaftAddr:     raftLn.Addr().String(),
			GRPCAddr:     grpcLn.Addr().String(),
			// Its nodes never move alone: a data dir recording other
			// addresses is a cluster started on other ports, whose nodes
			// could never reach each other.
			RefuseRaftAddrChange: true,
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
	cfg    Config // defaults applied; Backup consumed
	addMu  sync.Mutex
	seeded cluster.SeedResult

	mu    sync.Mutex
	nodes []*node
}

type node struct {
	Node
	dir   string
	cfg   server.Config // addresses fixed; listeners not set
	proxy *raftProxy    // with RaftProxies: in front of Node.Raft
	srv   *server.Server
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
	if cfg.Backup != nil && cfg.Nodes != 1 {
		return nil, fmt.Errorf("devcluster: a cluster starts from a backup with 1 node, not %d (add more with Add)", cfg.Nodes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	backup := cfg.Backup
	cfg.Backup = nil
	c := &Cluster{cfg: cfg}
	lns := make([]net.Listener, 2*cfg.Nodes)
	defer func() {
		if err != nil {
			for _, l := range lns {
				if l != nil {
					l.Close()
				}
			}
			c.closeProxies()
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
		var nd *node
		if nd, errs[i] = c.newNode(n, lns[2*i], lns[2*i+1]); errs[i] != nil {
			continue
		}
		peers = append(peers, cluster.Peer{ID: nd.ID, RaftAddr: nd.advertised(), GRPCAddr: nd.GRPC})
		c.nodes = append(c.nodes, nd)
	}
	if failedToBind(errs) {
		return nil, &StartError{Errs: errs}
	}
	for i, nd := range c.nodes {
		nd.cfg.Cluster.Peers = peers
		if backup != nil {
			// A restored node starts alone, its configuration in the seed.
			nd.cfg.Cluster.Peers = nil
			if c.seeded, err = cluster.SeedFromBackupStore(nd.dir, nd.ID, nd.advertised(), cfg.LogStore, backup, nd.cfg.Cluster.Logger, time.Now()); err != nil {
				return nil, fmt.Errorf("devcluster: seed %s from the backup: %w", nd.ID, err)
			}
		}
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

// newNode is node n's config, serving gRPC on grpcLn and Raft on raftLn
// (both with their bound addresses in n), behind a Raft proxy with
// RaftProxies. Peers, Join and Tune are the caller's.
func (c *Cluster) newNode(n Node, grpcLn, raftLn net.Listener) (*node, error) {
	n.GRPC, n.Raft = grpcLn.Addr().String(), raftLn.Addr().String()
	nd := &node{Node: n, dir: filepath.Join(c.cfg.Dir, n.ID)}
	nd.cfg = nodeConfig(n.ID, nd.dir, raftLn, grpcLn, c.cfg.ElectionTimeout)
	nd.cfg.Listener, nd.cfg.Cluster.RaftListener = nil, nil
	nd.cfg.Cluster.Logger = c.cfg.Logger.With("node", n.ID)
	nd.cfg.Cluster.LogStore = c.cfg.LogStore
	nd.cfg.AutoCreateNamespaces = c.cfg.AutoCreateNamespaces
	if c.cfg.RaftProxies {
		p, err := newRaftProxy(n.Raft)
		if err != nil {
			return nil, fmt.Errorf("raft proxy for %s: %w", n.ID, err)
		}
		nd.proxy = p
		nd.cfg.Cluster.RaftAdvertise = p.addr()
	}
	return nd, nil
}

// advertised is the Raft address other nodes dial: the proxy's, if any.
func (nd *node) advertised() string {
	if nd.proxy != nil {
		return nd.proxy.addr()
	}
	return nd.Raft
}

func failedToBind(errs []error) bool { return errors.Join(errs...) != nil }

// Addrs returns the nodes' gRPC addresses, node order.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.GRPC
	}
	return out
}

// Nodes returns the nodes' IDs and addresses, node order.
func (c *Cluster) Nodes() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Node, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.Node
	}
	return out
}

// Size returns the number of nodes (stopped ones included).
func (c *Cluster) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// NodeID returns node i's ID ("n1", ...).
func (c *Cluster) NodeID(i int) string { return c.node(i).ID }

// DataDir returns node i's data directory.
func (c *Cluster) DataDir(i int) string { return c.node(i).dir }

// Seeded returns what seeding node 1 from Config.Backup found (zero
// without a Backup).
func (c *Cluster) Seeded() cluster.SeedResult { return c.seeded }

func (c *Cluster) node(i int) *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

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
		if i := c.Leader(); i >= 0 && c.allKnow(c.NodeID(i)) {
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

// Stop stops node i gracefully (Server.Close bounded by ctx: in-flight
// calls drain, a leader hands off leadership first). No-op when the node
// is down.
func (c *Cluster) Stop(ctx context.Context, i int) error {
	nd, srv := c.detach(i)
	if srv == nil {
		return nil
	}
	if err := srv.Close(ctx); err != nil {
		return fmt.Errorf("stop %s: %w", nd.ID, err)
	}
	return nil
}

// Kill stops node i abruptly: Raft stops at once (no leadership transfer;
// proposals in flight end with "outcome unknown"), then the gRPC server is
// stopped without draining and the stores are closed. Requests that were
// committed but not yet answered get no answer from this node. No-op when
// the node is down.
func (c *Cluster) Kill(i int) error {
	nd, srv := c.detach(i)
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

// detach marks node i down and returns its server (nil when it was down
// already), for the caller to stop outside the lock.
func (c *Cluster) detach(i int) (*node, *server.Server) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	srv := nd.srv
	nd.srv = nil
	return nd, srv
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

// Cut stops the Raft traffic to node i (Config.RaftProxies): its proxy
// drops every connection and refuses new ones until Heal(i), so no node
// can send it a Raft RPC (the leader cannot replicate to it); node i's own
// RPCs to the others still get through. Client and node-to-node gRPC go
// direct and are not cut.
func (c *Cluster) Cut(i int) error {
	nd := c.node(i)
	if nd.proxy == nil {
		return fmt.Errorf("cut %s: the cluster runs without RaftProxies", nd.ID)
	}
	nd.proxy.pause()
	return nil
}

// Heal lets the Raft traffic to node i through again after Cut.
func (c *Cluster) Heal(i int) error {
	nd := c.node(i)
	if nd.proxy == nil {
		return fmt.Errorf("heal %s: the cluster runs without RaftProxies", nd.ID)
	}
	nd.proxy.resume()
	return nil
}

// AddConfig configures a node that Add starts.
type AddConfig struct {
	// ID is the node's ID (default n<k>, k its position); it must be new.
	ID string
	// Join lists the gRPC addresses the node joins through (Admin.Join, in
	// turn, until one succeeds or Add's ctx ends); nil: every running
	// node's.
	Join []string
	// NoJoin starts the node without joining: it holds no Raft state and
	// waits until a member adds it (Admin.Join naming its addresses).
	// Until then WaitLeader waits in vain.
	NoJoin bool
	// ReadReplica joins the node as a read replica (server.Config).
	ReadReplica bool
	// Tune, if not nil, adjusts the node's config after Config.Tune, once;
	// restarts reuse the result.
	Tune func(cfg *server.Config)
}

// Add starts one more node, on fresh loopback ports and in Dir/<its ID>,
// that joins the running cluster (see AddConfig), and returns its index
// once server.Start has returned (for a joiner: once a member accepted
// it). On error nothing is added and the node's data directory is
// removed.
func (c *Cluster) Add(ctx context.Context, ac AddConfig) (_ int, err error) {
	c.addMu.Lock()
	defer c.addMu.Unlock()
	c.mu.Lock()
	i := len(c.nodes)
	if ac.ID == "" {
		ac.ID = fmt.Sprintf("n%d", i+1)
	}
	join := ac.Join
	for _, nd := range c.nodes {
		if nd.ID == ac.ID {
			c.mu.Unlock()
			return -1, fmt.Errorf("add %s: the ID is taken", ac.ID)
		}
		if ac.Join == nil && nd.srv != nil {
			join = append(join, nd.GRPC)
		}
	}
	c.mu.Unlock()
	if ac.NoJoin {
		join = nil
	} else if len(join) == 0 {
		return -1, fmt.Errorf("add %s: no running node to join", ac.ID)
	}
	var g, r net.Listener
	var nd *node
	defer func() {
		if err != nil {
			for _, l := range []net.Listener{g, r} {
				if l != nil {
					l.Close() // already closed if the server took it
				}
			}
			if nd != nil {
				if nd.proxy != nil {
					nd.proxy.close()
				}
				os.RemoveAll(nd.dir)
			}
			err = fmt.Errorf("add %s: %w", ac.ID, err)
		}
	}()
	if g, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return -1, err
	}
	if r, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return -1, err
	}
	if nd, err = c.newNode(Node{ID: ac.ID}, g, r); err != nil {
		return -1, err
	}
	nd.cfg.Join, nd.cfg.ReadReplica = join, ac.ReadReplica
	if c.cfg.Tune != nil {
		c.cfg.Tune(i, &nd.cfg)
	}
	if ac.Tune != nil {
		ac.Tune(&nd.cfg)
	}
	cfg := nd.cfg
	cfg.Listener, cfg.Cluster.RaftListener = g, r
	if nd.srv, err = server.Start(ctx, cfg); err != nil {
		return -1, err
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, nd)
	c.mu.Unlock()
	return i, nil
}

func (c *Cluster) closeProxies() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		if nd.proxy != nil {
			nd.proxy.close()
		}
	}
}

// Close stops every running node gracefully, all at once (bounded by ctx),
// closes the Raft proxies, and returns the nodes' errors.
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
	c.closeProxies()
	return errors.Join(errs...)
}
