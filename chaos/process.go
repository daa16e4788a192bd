package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dedupnode/dedupnode/chaos/netproxy"
	"github.com/dedupnode/dedupnode/internal/logtail"
	"github.com/dedupnode/dedupnode/internal/portlock"
)

// ProcessConfig configures a cluster of local `dedupnode serve` processes.
type ProcessConfig struct {
	// Binary is the dedupnode executable to run (os.Executable() for the
	// chaos command itself).
	Binary string
	// Nodes is the cluster size (at least 1).
	Nodes int
	// Dir holds each node's data directory and log; a fresh temporary
	// directory when empty (removed by Close unless KeepDir).
	Dir     string
	KeepDir bool
	// ServeArgs are extra flags for every `serve` (e.g. a test-only knob).
	ServeArgs []string
	Logger    *slog.Logger
	// Replicas read replicas (r1..rN) join the voters with
	// `serve --join --read-replica`, their Raft address proxied like the
	// voters'.
	Replicas int
	// Regions groups the nodes: voter n_i and replica r_i are in region
	// ((i-1) mod Regions)+1, named "region1".. (0 or 1: one region).
	Regions int
	// WANDelay is added one way on every Raft link between two regions,
	// also while faults hold (a fault's rule on a link replaces it).
	WANDelay time.Duration
}

// processCluster runs N `dedupnode serve` processes on loopback. Each
// node's peer-list Raft address is a netproxy listener that forwards to the
// node's real Raft port, so Raft links can be cut, slowed and reset.
type processCluster struct {
	cfg     ProcessConfig
	dir     string
	ownDir  bool
	ids     []string
	voters  []string
	region  map[string]string
	raft    map[string]string // real Raft listener
	grpc    map[string]string
	proxied map[string]string // Raft address in the peer list
	peers   string
	ports   *portlock.Ports // the real Raft and gRPC ports, kept for restarts
	net     *netproxy.Net
	log     *slog.Logger

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
	logf   *os.File
}

// StartProcessCluster allocates loopback ports, starts the proxies and
// starts every node. It does not wait for a leader.
func StartProcessCluster(ctx context.Context, cfg ProcessConfig) (_ Cluster, err error) {
	if cfg.Nodes < 1 {
		return nil, errors.New("process cluster: need at least one node")
	}
	if cfg.Binary == "" {
		return nil, errors.New("process cluster: no dedupnode binary given")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &processCluster{cfg: cfg, dir: cfg.Dir, raft: map[string]string{}, grpc: map[string]string{},
		proxied: map[string]string{}, procs: map[string]*proc{}, log: cfg.Logger, region: map[string]string{}}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "dedupnode-chaos-*"); err != nil {
			return nil, fmt.Errorf("process cluster: %w", err)
		}
		c.ownDir = !cfg.KeepDir
	}
	c.net = netproxy.New(cfg.Logger.With("component", "netproxy"))
	defer func() {
		if err != nil {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	// A killed node restarts on its ports, so they come from below the
	// kernel's ephemeral range: no other process is handed them meanwhile.
	if c.ports, err = portlock.Reserve(2 * (cfg.Nodes + cfg.Replicas)); err != nil {
		return nil, fmt.Errorf("process cluster: %w", err)
	}
	ports := c.ports.Addrs()
	var peers []string
	regions := max(cfg.Regions, 1)
	for i := 1; i <= cfg.Nodes+cfg.Replicas; i++ {
		id := fmt.Sprintf("n%d", i)
		if i > cfg.Nodes {
			id = fmt.Sprintf("r%d", i-cfg.Nodes)
			c.region[id] = fmt.Sprintf("region%d", (i-cfg.Nodes-1)%regions+1)
		} else {
			c.voters = append(c.voters, id)
			c.region[id] = fmt.Sprintf("region%d", (i-1)%regions+1)
		}
		c.ids = append(c.ids, id)
		c.raft[id], c.grpc[id] = ports[2*(i-1)], ports[2*(i-1)+1]
		if c.proxied[id], err = c.net.Add(id, "127.0.0.1:0", c.raft[id]); err != nil {
			return nil, err
		}
		if i <= cfg.Nodes {
			peers = append(peers, fmt.Sprintf("%s=%s=%s", id, c.proxied[id], c.grpc[id]))
		}
	}
	c.peers = strings.Join(peers, ",")
	c.wan()
	for _, id := range c.ids {
		if err := c.Start(ctx, id); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// wan sets the base delay on every Raft link between two regions.
func (c *processCluster) wan() {
	if c.cfg.WANDelay <= 0 {
		return
	}
	for _, a := range c.ids {
		for _, b := range c.ids {
			if c.region[a] != c.region[b] {
				c.net.Set(a, b, netproxy.Rule{Delay: c.cfg.WANDelay})
			}
		}
	}
}

// isReplica reports whether id is one of the read replicas.
func (c *processCluster) isReplica(id string) bool { return strings.HasPrefix(id, "r") }

// Regions returns each region's nodes, regions in name order (nil with
// one region).
func (c *processCluster) Regions() [][]string {
	if c.cfg.Regions < 2 {
		return nil
	}
	out := make([][]string, c.cfg.Regions)
	for _, id := range c.ids {
		var k int
		fmt.Sscanf(c.region[id], "region%d", &k)
		out[k-1] = append(out[k-1], id)
	}
	return out
}

func (c *processCluster) Nodes() []string       { return append([]string(nil), c.ids...) }
func (c *processCluster) Addr(id string) string { return c.grpc[id] }

func (c *processCluster) Describe() string {
	d := fmt.Sprintf("%d local processes", len(c.ids))
	if c.cfg.Replicas > 0 {
		d = fmt.Sprintf("%d voters + %d read replicas as local processes", len(c.voters), c.cfg.Replicas)
	}
	if c.cfg.Regions > 1 {
		d += fmt.Sprintf(" in %d regions (%s)", c.cfg.Regions, c.layout())
		if c.cfg.WANDelay > 0 {
			d += fmt.Sprintf(", %v one way between regions on Raft links", c.cfg.WANDelay)
		}
	}
	return d + ", data and logs in " + c.dir
}

func (c *processCluster) layout() string {
	var parts []string
	for i, g := range c.Regions() {
		parts = append(parts, fmt.Sprintf("region%d: %s", i+1, strings.Join(g, ",")))
	}
	return strings.Join(parts, "; ")
}

func (c *processCluster) Caps() Caps {
	return Caps{Cut: true, Slow: true, Regions: c.cfg.Regions > 1, Notes: []string{
		"network faults act on Raft links only (fault-injecting proxy); clients and node-to-node gRPC reach every node",
		"packet loss is emulated by connection resets (a TCP proxy cannot drop single packets)",
		"clock offsets are not injected (the nodes share the host clock)",
	}}
}

func (c *processCluster) Start(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[id]; p != nil && !exited(p) {
		return nil
	}
	dataDir := filepath.Join(c.dir, id)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	args := []string{"serve", "--node-id", id, "--data-dir", dataDir,
		"--raft-addr", c.raft[id], "--grpc-addr", c.grpc[id], "--peers", c.peers}
	if c.isReplica(id) {
		var join []string
		for _, v := range c.voters {
			join = append(join, c.grpc[v])
		}
		args = []string{"serve", "--node-id", id, "--data-dir", dataDir, "--raft-addr", c.raft[id],
			"--raft-advertise", c.proxied[id], "--grpc-addr", c.grpc[id], "--join", strings.Join(join, ","), "--read-replica"}
	}
	if c.cfg.Regions > 1 {
		args = append(args, "--region", c.region[id]) // shown in status, members, metrics
	}
	args = append(args, c.cfg.ServeArgs...)
	cmd := exec.Command(c.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = procAttr()
	fmt.Fprintf(logf, "=== chaos: starting %s %s\n", c.cfg.Binary, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", id, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), logf: logf}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	c.procs[id] = p
	c.log.Debug("node started", "node", id, "pid", cmd.Process.Pid)
	return nil
}

// cleanEnv drops DEDUPNODE_* variables so that the parent's environment
// cannot change the nodes' flags.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEDUPNODE_") {
			env = append(env, kv)
		}
	}
	return env
}

func exited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (c *processCluster) running(id string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[id]; p != nil && !exited(p) {
		return p
	}
	return nil
}

func (c *processCluster) Running(id string) bool { return c.running(id) != nil }

func (c *processCluster) signal(id string, sig syscall.Signal) (*proc, error) {
	p := c.running(id)
	if p == nil {
		return nil, nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return p, fmt.Errorf("signal %s to %s: %w", sig, id, err)
	}
	return p, nil
}

func (c *processCluster) Kill(ctx context.Context, id string) error {
	p, err := c.signal(id, syscall.SIGKILL)
	if err != nil || p == nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kill %s: %w", id, ctx.Err())
	}
}

func (c *processCluster) Stop(ctx context.Context, id string) error {
	_ = c.Resume(ctx, id) // a stopped process cannot handle SIGTERM
	p, err := c.signal(id, syscall.SIGTERM)
	if err != nil || p == nil {
		return err
	}
	t := time.NewTimer(45 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		c.log.Warn("node did not stop within 45 s of SIGTERM; killing it", "node", id)
		return c.Kill(ctx, id)
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", id, ctx.Err())
	}
}

func (c *processCluster) Pause(_ context.Context, id string) error {
	p, err := c.signal(id, syscall.SIGSTOP)
	if p != nil && err == nil {
		c.mu.Lock()
		p.paused = true
		c.mu.Unlock()
	}
	return err
}

func (c *processCluster) Resume(_ context.Context, id string) error {
	p, err := c.signal(id, syscall.SIGCONT)
	if p != nil && err == nil {
		c.mu.Lock()
		p.paused = false
		c.mu.Unlock()
	}
	return err
}

func (c *processCluster) Cut(_ context.Context, from, to string) error {
	c.net.Set(from, to, netproxy.Rule{Drop: true})
	return nil
}

func (c *processCluster) Slow(_ context.Context, delay, jitter time.Duration, loss float64) error {
	c.net.Set(netproxy.Any, netproxy.Any, netproxy.Rule{Delay: delay, Jitter: jitter, ResetProb: loss})
	return nil
}

func (c *processCluster) Disconnect(context.Context, string) error {
	return errors.New("disconnect: not available for local processes (use a partition)")
}

func (c *processCluster) HealNet(context.Context) error {
	c.net.Heal()
	c.wan()
	return nil
}

// Delay sets delay one way on every Raft link between two regions (a
// delay spike; HealNet restores the base WAN delay).
func (c *processCluster) Delay(delay time.Duration) {
	for _, a := range c.ids {
		for _, b := range c.ids {
			if c.region[a] != c.region[b] {
				c.net.Set(a, b, netproxy.Rule{Delay: delay})
			}
		}
	}
}

// ProxyStats returns the Raft proxies' counters.
func (c *processCluster) ProxyStats() netproxy.Stats { return c.net.Stats() }

func (c *processCluster) Close(ctx context.Context) error {
	c.mu.Lock()
	var ps []*proc
	for _, p := range c.procs {
		ps = append(ps, p)
	}
	c.mu.Unlock()
	for _, p := range ps {
		if exited(p) {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	c.net.Close()
	if c.ports != nil {
		_ = c.ports.Release()
	}
	if c.ownDir {
		return os.RemoveAll(c.dir)
	}
	return nil
}

// logTails logs the last maxBytes of every node's server log. A run that
// did not converge calls it, so the reason a node never caught up is in
// the test output even after the run's directory is removed.
func (c *processCluster) logTails(log *slog.Logger, maxBytes int) {
	for _, id := range c.ids {
		log.Warn("node log tail", "node", id, "lines", logtail.Read(filepath.Join(c.dir, id+".log"), maxBytes))
	}
}
