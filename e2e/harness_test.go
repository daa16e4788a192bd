package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/logtail"
	"github.com/dedupnode/dedupnode/internal/portlock"
	"github.com/dedupnode/dedupnode/internal/testbin"
)

func TestMain(m *testing.M) { os.Exit(testbin.Main(m)) }

// buildBinary returns cmd/dedupnode built for this package's tests (once
// for all of them; testbin).
func buildBinary(t *testing.T) string {
	t.Helper()
	return testbin.Build(t, testbin.Module+"/cmd/dedupnode")
}

// freePorts returns n loopback addresses free now and reserved for the
// test: nodes are killed and restarted on them, so they come from below
// the kernel's ephemeral range, where no other process is handed them.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	p, err := portlock.Reserve(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release() })
	return p.Addrs()
}

// node is one `dedupnode serve` process.
type node struct {
	id, raft, grpc, dir string
	logPath             string

	mu   sync.Mutex
	cmd  *exec.Cmd
	proc *proc
}

// proc is one run of a node's process.
type proc struct {
	exited chan struct{} // closed when the process has exited
	err    error         // Wait's result, valid once exited is closed
}

// cluster is a set of serve processes started from one binary.
type cluster struct {
	t     *testing.T
	bin   string
	nodes []*node
	args  []string // mode flags (--peers ... or --bootstrap)
	// store, when set, is passed as --raft-log-store to every start.
	store string
}

// newPeersCluster prepares n nodes with a static --peers list.
func newPeersCluster(t *testing.T, bin string, n int) *cluster {
	ports := freePorts(t, 2*n)
	c := &cluster{t: t, bin: bin}
	var peers []string
	base := t.TempDir()
	for i := range n {
		nd := &node{
			id:   fmt.Sprintf("n%d", i+1),
			raft: ports[2*i],
			grpc: ports[2*i+1],
		}
		nd.dir = filepath.Join(base, nd.id)
		nd.logPath = filepath.Join(base, nd.id+".log")
		c.nodes = append(c.nodes, nd)
		peers = append(peers, nd.id+"="+nd.raft+"="+nd.grpc)
	}
	c.args = []string{"--peers", strings.Join(peers, ",")}
	return c
}

func (c *cluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.grpc)
	}
	return out
}

func (c *cluster) byID(id string) *node {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	c.t.Fatalf("no node %q", id)
	return nil
}

// start launches the node's process; it is SIGKILLed at test cleanup if
// still running.
func (c *cluster) start(n *node, extra ...string) {
	t := c.t
	t.Helper()
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve",
		"--node-id", n.id, "--data-dir", n.dir,
		"--raft-addr", n.raft, "--grpc-addr", n.grpc,
		"--log-level", "info"}, c.args...)
	if c.store != "" {
		args = append(args, "--raft-log-store", c.store)
	}
	args = append(args, extra...)
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", n.id, err)
	}
	p := &proc{exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	n.mu.Lock()
	n.cmd, n.proc = cmd, p
	n.mu.Unlock()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) did not exit after SIGKILL", n.id, cmd.Process.Pid)
		}
	})
}

func (c *cluster) startAll() {
	for _, n := range c.nodes {
		c.start(n)
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (c *cluster) kill(n *node) {
	c.t.Helper()
	n.mu.Lock()
	cmd, p := n.cmd, n.proc
	n.mu.Unlock()
	_ = cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s did not exit after SIGKILL", n.id)
	}
}

// stop sends SIGTERM and waits for a clean exit (status 0) within d.
func (c *cluster) stop(n *node, d time.Duration) {
	c.t.Helper()
	n.mu.Lock()
	cmd, p := n.cmd, n.proc
	n.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			c.t.Fatalf("%s exited with %v after SIGTERM, want status 0; log:\n%s", n.id, p.err, c.tail(n))
		}
	case <-time.After(d):
		c.t.Fatalf("%s did not exit within %v of SIGTERM", n.id, d)
	}
}

// tail returns the end of a node's log, for failure messages.
func (c *cluster) tail(n *node) string { return logtail.Read(n.logPath, 4000) }

func (c *cluster) dumpLogs() {
	for _, n := range c.nodes {
		c.t.Logf("---- %s log (end) ----\n%s", n.id, c.tail(n))
	}
}

// waitLeader polls Status on addrs until every one of them answers and they
// agree on a leader that is among them, and returns the leader's ID.
func (c *cluster) waitLeader(ctx context.Context, addrs []string, within time.Duration) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	cl, err := client.New(ctx, addrs, client.WithTimeout(time.Second), client.WithRetry(1, 0, 0))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cl.Close()
	var last string
	for {
		leader, ok := "", true
		for _, a := range addrs {
			st, err := cl.StatusOf(ctx, a)
			switch {
			case err != nil:
				ok, last = false, fmt.Sprintf("%s: %v", a, err)
			case st.LeaderID == "" || leader != "" && st.LeaderID != leader:
				ok, last = false, fmt.Sprintf("%s: leader %q", a, st.LeaderID)
			default:
				leader = st.LeaderID
				if !inAddrs(st.LeaderGRPCAddr, addrs) {
					ok, last = false, fmt.Sprintf("%s: leader %s at %s is not among %v", a, st.LeaderID, st.LeaderGRPCAddr, addrs)
				}
			}
		}
		if ok && leader != "" {
			return leader
		}
		select {
		case <-ctx.Done():
			c.dumpLogs()
			c.t.Fatalf("no agreed leader among %v within %v; last: %s", addrs, within, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func inAddrs(a string, addrs []string) bool {
	for _, x := range addrs {
		if x == a {
			return true
		}
	}
	return false
}

// cli runs the binary with args and stdin, and returns exit code, stdout
// and stderr.
func cli(t *testing.T, bin, stdin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("run %v: %v", args, err)
	return -1, "", ""
}
