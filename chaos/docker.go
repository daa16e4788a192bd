package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DockerConfig configures a run against the docker-compose cluster.
type DockerConfig struct {
	// Nodes: 3 (docker-compose.yml) or 5 (plus docker-compose.5nodes.yml).
	Nodes int
	// Dir holds the compose files (default: the working directory).
	Dir string
	// Project is the compose project name (default dedupnode-chaos). The
	// run recreates it with empty volumes and removes it at the end.
	Project string
	// Image to run (default dedupnode:local, built by scripts/cluster-up.sh).
	Image string
	// Keep leaves the cluster running after the run.
	Keep   bool
	Logger *slog.Logger
}

// dockerCluster drives the compose cluster through the Docker engine:
// docker kill/stop/start/pause/unpause, network disconnect/connect, and
// iptables rules inside a container's network namespace (entered from the
// host with nsenter) for one-way and full partitions between nodes.
type dockerCluster struct {
	cfg     DockerConfig
	compose []string
	files   []string
	ids     []string
	cid     map[string]string // container ID per node
	ip      map[string]string // address on the compose network
	network string
	log     *slog.Logger
	caps    Caps

	mu           sync.Mutex
	rules        []iptRule
	disconnected map[string]bool
}

type iptRule struct{ node, src string }

// StartDockerCluster recreates the compose project with fresh volumes and
// starts it. It does not wait for a leader.
func StartDockerCluster(ctx context.Context, cfg DockerConfig) (_ Cluster, err error) {
	if cfg.Nodes != 3 && cfg.Nodes != 5 {
		return nil, fmt.Errorf("docker mode runs 3 or 5 nodes, not %d", cfg.Nodes)
	}
	if cfg.Dir == "" {
		cfg.Dir = "."
	}
	if cfg.Project == "" {
		cfg.Project = "dedupnode-chaos"
	}
	if cfg.Image == "" {
		cfg.Image = "dedupnode:local"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &dockerCluster{cfg: cfg, cid: map[string]string{}, ip: map[string]string{}, log: cfg.Logger,
		disconnected: map[string]bool{}}
	if _, err := c.docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return nil, fmt.Errorf("docker engine not reachable: %w", err)
	}
	if _, err := c.docker(ctx, "image", "inspect", cfg.Image); err != nil {
		return nil, fmt.Errorf("image %s not found: build it with scripts/cluster-up.sh (or set --docker-image)", cfg.Image)
	}
	switch {
	case run(ctx, "docker-compose", "version") == nil:
		c.compose = []string{"docker-compose"}
	case run(ctx, "docker", "compose", "version") == nil:
		c.compose = []string{"docker", "compose"}
	default:
		return nil, errors.New("neither docker-compose nor 'docker compose' is installed")
	}
	c.files = []string{"-f", filepath.Join(cfg.Dir, "docker-compose.yml")}
	if cfg.Nodes == 5 {
		c.files = append(c.files, "-f", filepath.Join(cfg.Dir, "docker-compose.5nodes.yml"))
	}
	for _, f := range c.files[1:] {
		if f == "-f" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("compose file: %w (run from the repository root or give --compose-dir)", err)
		}
	}
	// Fresh state: down with volumes (both files, so node4/5 go too), up.
	all := []string{"-f", filepath.Join(cfg.Dir, "docker-compose.yml"), "-f", filepath.Join(cfg.Dir, "docker-compose.5nodes.yml")}
	c.unpauseAll(ctx)
	if _, err := c.composeRun(ctx, all, "down", "--volumes", "--remove-orphans"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := c.composeRun(ctx, c.files, "up", "-d"); err != nil {
		return nil, err
	}
	for i := 1; i <= cfg.Nodes; i++ {
		id := fmt.Sprintf("node%d", i)
		c.ids = append(c.ids, id)
		out, err := c.composeRun(ctx, c.files, "ps", "-q", id)
		if err != nil || strings.TrimSpace(out) == "" {
			return nil, fmt.Errorf("container of %s not found: %v", id, err)
		}
		c.cid[id] = strings.TrimSpace(out)
		nets, err := c.docker(ctx, "inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.IPAddress}}\n{{end}}", c.cid[id])
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(nets), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && strings.HasSuffix(f[0], "_dedup") {
				c.network, c.ip[id] = f[0], f[1]
			}
		}
		if c.ip[id] == "" {
			return nil, fmt.Errorf("%s has no address on the compose network: %q", id, nets)
		}
	}
	c.caps = c.probe(ctx)
	return c, nil
}

// probe finds out which network faults work on this host.
func (c *dockerCluster) probe(ctx context.Context) Caps {
	caps := Caps{Disconnect: true}
	pid, err := c.pid(ctx, c.ids[0])
	if err == nil {
		err = run(ctx, "nsenter", "-t", pid, "-n", "iptables", "-w", "-L", "INPUT", "-n")
	}
	if err == nil {
		caps.Cut = true
	} else {
		caps.Notes = append(caps.Notes, "partitions unavailable: iptables in the containers' network namespaces (nsenter, root) failed: "+oneLine(err))
	}
	if err == nil {
		err = run(ctx, "nsenter", "-t", pid, "-n", "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms")
		if err == nil {
			_ = run(ctx, "nsenter", "-t", pid, "-n", "tc", "qdisc", "del", "dev", "eth0", "root")
			caps.Slow = true
		} else {
			caps.Notes = append(caps.Notes, "latency/loss unavailable: tc netem failed (the kernel may lack sch_netem): "+oneLine(err))
		}
	}
	caps.Notes = append(caps.Notes, "clock offsets are not injected (containers share the host kernel's clock)")
	return caps
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, name, args...)
	return err
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

func (c *dockerCluster) docker(ctx context.Context, args ...string) (string, error) {
	return output(ctx, "docker", args...)
}

func (c *dockerCluster) composeRun(ctx context.Context, files []string, args ...string) (string, error) {
	full := append(append(append([]string{}, c.compose[1:]...), "-p", c.cfg.Project), files...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, c.compose[0], full...)
	cmd.Env = append(os.Environ(), "DEDUPNODE_IMAGE="+c.cfg.Image)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", c.compose[0], strings.Join(full, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

func (c *dockerCluster) unpauseAll(ctx context.Context) {
	out, err := c.docker(ctx, "ps", "-q", "--filter", "label=com.docker.compose.project="+c.cfg.Project, "--filter", "status=paused")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = c.docker(ctx, "unpause", id)
	}
}

func (c *dockerCluster) pid(ctx context.Context, id string) (string, error) {
	out, err := c.docker(ctx, "inspect", "-f", "{{.State.Pid}}", c.cid[id])
	pid := strings.TrimSpace(out)
	if err == nil && (pid == "" || pid == "0") {
		err = fmt.Errorf("%s is not running", id)
	}
	return pid, err
}

func (c *dockerCluster) Nodes() []string { return append([]string(nil), c.ids...) }

func (c *dockerCluster) Addr(id string) string {
	for i, n := range c.ids {
		if n == id {
			return fmt.Sprintf("127.0.0.1:%d", 7070+i)
		}
	}
	return ""
}

func (c *dockerCluster) Describe() string {
	return fmt.Sprintf("docker-compose project %s, %d containers (logs: %s -p %s logs)", c.cfg.Project, len(c.ids),
		strings.Join(c.compose, " "), c.cfg.Project)
}

func (c *dockerCluster) Caps() Caps { return c.caps }

func (c *dockerCluster) Running(id string) bool {
	out, err := c.docker(context.Background(), "inspect", "-f", "{{.State.Running}}", c.cid[id])
	return err == nil && strings.TrimSpace(out) == "true"
}

func (c *dockerCluster) Kill(ctx context.Context, id string) error {
	_, _ = c.docker(ctx, "unpause", c.cid[id]) // a paused container cannot be killed
	if !c.Running(id) {
		return nil
	}
	_, err := c.docker(ctx, "kill", "-s", "KILL", c.cid[id])
	return err
}

func (c *dockerCluster) Stop(ctx context.Context, id string) error {
	_, _ = c.docker(ctx, "unpause", c.cid[id])
	_, err := c.docker(ctx, "stop", "-t", "40", c.cid[id])
	return err
}

// Start starts a stopped container, retrying for a while: right after a
// kill the engine may still hold the published port ("address already in
// use" from its userland proxy).
func (c *dockerCluster) Start(ctx context.Context, id string) error {
	var err error
	for try := 0; try < 10; try++ {
		if c.Running(id) {
			return nil
		}
		if _, err = c.docker(ctx, "start", c.cid[id]); err == nil {
			return nil
		}
		c.log.Debug("docker start failed; retrying", "node", id, "err", err)
		if !wait(ctx, time.Duration(try+1)*500*time.Millisecond) {
			break
		}
	}
	return err
}

func (c *dockerCluster) Pause(ctx context.Context, id string) error {
	_, err := c.docker(ctx, "pause", c.cid[id])
	return err
}

func (c *dockerCluster) Resume(ctx context.Context, id string) error {
	out, err := c.docker(ctx, "inspect", "-f", "{{.State.Paused}}", c.cid[id])
	if err != nil || strings.TrimSpace(out) != "true" {
		return nil
	}
	_, err = c.docker(ctx, "unpause", c.cid[id])
	return err
}

// Cut drops every packet from → to in to's network namespace.
func (c *dockerCluster) Cut(ctx context.Context, from, to string) error {
	pid, err := c.pid(ctx, to)
	if err != nil {
		return err
	}
	if err := run(ctx, "nsenter", "-t", pid, "-n", "iptables", "-w", "-I", "INPUT", "-s", c.ip[from], "-j", "DROP"); err != nil {
		return err
	}
	c.mu.Lock()
	c.rules = append(c.rules, iptRule{node: to, src: c.ip[from]})
	c.mu.Unlock()
	return nil
}

func (c *dockerCluster) Slow(ctx context.Context, delay, jitter time.Duration, loss float64) error {
	var errs []error
	for _, id := range c.ids {
		pid, err := c.pid(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, run(ctx, "nsenter", "-t", pid, "-n", "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
			"delay", fmt.Sprintf("%dms", delay.Milliseconds()), fmt.Sprintf("%dms", jitter.Milliseconds()),
			"loss", fmt.Sprintf("%.2f%%", loss*100)))
	}
	return errors.Join(errs...)
}

func (c *dockerCluster) Disconnect(ctx context.Context, id string) error {
	if _, err := c.docker(ctx, "network", "disconnect", "-f", c.network, c.cid[id]); err != nil {
		return err
	}
	c.mu.Lock()
	c.disconnected[id] = true
	c.mu.Unlock()
	return nil
}

func (c *dockerCluster) HealNet(ctx context.Context) error {
	c.mu.Lock()
	rules, disc := c.rules, c.disconnected
	c.rules, c.disconnected = nil, map[string]bool{}
	c.mu.Unlock()
	var errs []error
	for _, r := range rules {
		pid, err := c.pid(ctx, r.node)
		if err != nil {
			continue // not running: its namespace, and the rule, are gone
		}
		_ = run(ctx, "nsenter", "-t", pid, "-n", "iptables", "-w", "-D", "INPUT", "-s", r.src, "-j", "DROP")
	}
	if c.caps.Slow {
		for _, id := range c.ids {
			if pid, err := c.pid(ctx, id); err == nil {
				_ = run(ctx, "nsenter", "-t", pid, "-n", "tc", "qdisc", "del", "dev", "eth0", "root")
			}
		}
	}
	for id := range disc {
		if _, err := c.docker(ctx, "network", "connect", "--ip", c.ip[id], "--alias", id, c.network, c.cid[id]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *dockerCluster) Close(ctx context.Context) error {
	_ = c.HealNet(ctx)
	c.unpauseAll(ctx)
	if c.cfg.Keep {
		return nil
	}
	all := []string{"-f", filepath.Join(c.cfg.Dir, "docker-compose.yml"), "-f", filepath.Join(c.cfg.Dir, "docker-compose.5nodes.yml")}
	_, err := c.composeRun(ctx, all, "down", "--volumes", "--remove-orphans")
	return err
}
