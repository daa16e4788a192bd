package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// A frozen (SIGSTOP) node hears but never answers: its TCP connections
// stay up and take requests. The client must abandon an attempt to it and
// try again elsewhere within the caller's deadline, and a command's
// --timeout must bound its wall time.

// freeze SIGSTOPs n's process until test cleanup (or the returned thaw).
func freeze(t *testing.T, n *node) (thaw func()) {
	t.Helper()
	n.mu.Lock()
	p := n.cmd.Process
	n.mu.Unlock()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = p.Signal(syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// frozenLeaderCluster starts 3 nodes, warms up cl (and its Batcher b)
// against the leader with one write each, and freezes the leader. It
// returns the cluster and the frozen leader.
func frozenLeaderCluster(t *testing.T, ctx context.Context, warm func(ctx context.Context, addrs []string)) (*cluster, string, *node) {
	bin := buildBinary(t)
	c := newPeersCluster(t, bin, 3)
	c.startAll()
	lid := c.waitLeader(ctx, c.addrs(), 60*time.Second)
	if warm != nil {
		warm(ctx, c.addrs())
	}
	leader := c.byID(lid)
	freeze(t, leader)
	return c, bin, leader
}

// The write in flight when the leader froze, and those sent while it is
// frozen, succeed within their deadline once the cluster has a new leader:
// a Mark through the Go client (unary), one through a Batcher (the
// streamed transport), and one through the CLI's `mark --timeout 8s`.
// Before the client abandoned unanswered attempts, each attempt was bounded
// by min(deadline, 10 s): the first one, to the frozen leader, used the
// whole deadline and the call failed "outcome unknown" with a new leader
// elected seconds before.
func TestFrozenLeader_WriteRetriedOnNewLeaderWithinDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		cl *client.Client
		b  *client.Batcher
	)
	c, bin, leader := frozenLeaderCluster(t, ctx, func(ctx context.Context, addrs []string) {
		var err error
		cl, err = client.New(ctx, addrs) // the default, automatic, attempt timeout
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		b = cl.NewBatcher() // streamed transport
		t.Cleanup(func() { b.Close() })
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if _, err := cl.Mark(wctx, "", []client.Item{{ID: []byte("warm-unary")}}, 0); err != nil {
			t.Fatalf("warm-up mark: %v", err)
		}
		if _, err := b.Mark(wctx, "", client.Item{ID: []byte("warm-batched")}, 0); err != nil {
			t.Fatalf("warm-up batched mark: %v", err)
		}
	})
	t.Logf("froze leader %s (%s)", leader.id, leader.grpc)
	if got := cl.Leader(); got != leader.grpc {
		t.Fatalf("client's leader is %q, want the frozen %s: the test would not send to the frozen node", got, leader.grpc)
	}

	const deadline = 10 * time.Second
	type outcome struct {
		what string
		took time.Duration
		err  error
	}
	var (
		mu  sync.Mutex
		out []outcome
		wg  sync.WaitGroup
	)
	run := func(what string, fn func(ctx context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, ccancel := context.WithTimeout(ctx, deadline)
			defer ccancel()
			t0 := time.Now()
			err := fn(cctx)
			mu.Lock()
			out = append(out, outcome{what, time.Since(t0), err})
			mu.Unlock()
		}()
	}
	run("unary mark", func(ctx context.Context) error {
		res, err := cl.Mark(ctx, "", []client.Item{{ID: []byte("frz-unary")}}, 0)
		if err == nil && res[0].Code != client.CodeNew {
			err = fmt.Errorf("answered %v, want new", res[0].Code)
		}
		return err
	})
	run("batched mark (stream)", func(ctx context.Context) error {
		res, err := b.Mark(ctx, "", client.Item{ID: []byte("frz-batched")}, 0)
		if err == nil && res.Code != client.CodeNew {
			err = fmt.Errorf("answered %v, want new", res.Code)
		}
		return err
	})
	run("batched check (stream)", func(ctx context.Context) error {
		res, err := b.Check(ctx, "", []byte("warm-batched"), client.Linearizable)
		if err == nil && res.Code != client.CodeSeen {
			err = fmt.Errorf("answered %v, want seen", res.Code)
		}
		return err
	})
	run("cli mark --timeout 8s", func(context.Context) error {
		code, stdout, stderr := cli(t, bin, "", "mark", "--addr", strings.Join(c.addrs(), ","), "--timeout", "8s", "frz-cli")
		if code != 0 || !strings.Contains(stdout, "new") {
			return fmt.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		return nil
	})
	wg.Wait()
	for _, o := range out {
		t.Logf("%s: %v after %v", o.what, o.err, o.took.Round(time.Millisecond))
		limit := deadline
		if strings.HasPrefix(o.what, "cli") {
			limit = 8*time.Second + time.Second // the process's start and exit
		}
		if o.err != nil {
			t.Errorf("%s with the leader frozen failed after %v: %v", o.what, o.took.Round(time.Millisecond), o.err)
		} else if o.took > limit {
			t.Errorf("%s took %v, past its deadline %v", o.what, o.took.Round(time.Millisecond), limit)
		}
	}
	if t.Failed() {
		for _, n := range c.nodes {
			if n != leader {
				t.Logf("%s: %v", n.id, statusLine(ctx, n.grpc))
			}
		}
	}
	// The writes were applied once: a repeat answers duplicate.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	res, err := cl.Mark(rctx, "", []client.Item{{ID: []byte("frz-unary")}, {ID: []byte("frz-batched")}, {ID: []byte("frz-cli")}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Code != client.CodeDuplicate {
			t.Errorf("%s: repeat answered %v, want duplicate", r.ID, r.Code)
		}
	}
	noPanic(t, c)
}

// statusLine is a node's own view, for failure messages.
func statusLine(ctx context.Context, addr string) string {
	cl, err := client.New(ctx, []string{addr}, client.WithPinnedNode(), client.WithRetry(1, 0, 0))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cl.StatusOf(sctx, addr)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("state %s, leader %s", st.State, st.LeaderID)
}

// --timeout bounds a command's wall time, finding the cluster included,
// against a node that never answers: each command fails, saying so, well
// before --timeout plus a second. (They took --timeout plus 2 s: the
// client's discovery at start, up to 2 s, ran before --timeout began.)
func TestFrozenNode_TimeoutBoundsWallTime(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, bin, frozen := frozenLeaderCluster(t, ctx, nil)
	const timeout = 3 * time.Second
	for _, args := range [][]string{
		{"status"},
		{"members"},
		{"check", "frz-1"},
		{"mark", "frz-1"},
		{"namespace", "list"},
	} {
		t0 := time.Now()
		code, stdout, stderr := cli(t, bin, "", append(args, "--addr", frozen.grpc, "--timeout", "3s")...)
		took := time.Since(t0)
		t.Logf("%s --addr <frozen> --timeout 3s: exit %d after %v: %s", strings.Join(args, " "), code, took.Round(time.Millisecond), firstLine(stderr))
		if code == 0 {
			t.Errorf("%s against a frozen node succeeded: %s", args[0], stdout)
		}
		if !strings.Contains(stderr, "--timeout 3s") {
			t.Errorf("%s: stderr does not name --timeout 3s: %s", args[0], stderr)
		}
		// The bound leaves 1.5 s for starting and ending a process on a
		// loaded CI machine; the overshoot it catches was 2 s.
		if slack := 1500 * time.Millisecond; took > timeout+slack {
			t.Errorf("%s --timeout 3s took %v, want at most %v", strings.Join(args, " "), took.Round(time.Millisecond), timeout+slack)
		}
	}
	noPanic(t, c)
}
