package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// TestRollingRestartZeroFailedRequests restarts every node of a 3-node
// cluster in turn (leadership transferred away first when the node leads,
// then SIGTERM, then start again and wait until it has caught up) while
// clients keep marking new IDs. No client call may fail and no
// acknowledged mark may be lost: what a rolling upgrade must guarantee.
func TestRollingRestartZeroFailedRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	bin := buildBinary(t)
	c := newPeersCluster(t, bin, 3)
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c.waitLeader(ctx, c.addrs(), 90*time.Second)

	cl, err := client.New(ctx, c.addrs(), client.WithTimeout(5*time.Second), client.WithRetry(200, 50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var (
		stop     atomic.Bool
		failed   atomic.Int64
		progress atomic.Int64
		mu       sync.Mutex
		acked    []string
		wg       sync.WaitGroup
	)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("rolling-w%d-%06d", w, i)
				cctx, ccancel := context.WithTimeout(ctx, 90*time.Second)
				res, err := cl.Mark(cctx, "", []client.Item{{ID: []byte(id)}}, 0)
				ccancel()
				if err != nil || res[0].Code != client.CodeNew {
					failed.Add(1)
					t.Errorf("mark %s: %v %v", id, res, err)
					continue
				}
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
				progress.Add(1)
			}
		}()
	}
	waitProgress := func(what string, n int64) {
		t.Helper()
		target := progress.Load() + n
		deadline := time.Now().Add(60 * time.Second)
		for progress.Load() < target {
			if time.Now().After(deadline) {
				c.dumpLogs()
				t.Fatalf("%s: writes stalled at %d", what, progress.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitProgress("before the first restart", 50)

	for _, n := range c.nodes {
		st, err := cl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.LeaderID == n.id {
			tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
			newLeader, err := cl.TransferLeadership(tctx, "")
			tcancel()
			if err != nil {
				t.Fatalf("transfer leadership away from %s: %v", n.id, err)
			}
			t.Logf("leadership moved from %s to %s", n.id, newLeader)
		}
		c.stop(n, 60*time.Second)
		waitProgress("with "+n.id+" down", 50)
		c.start(n)
		waitCaughtUp(t, ctx, c, cl, n)
		waitProgress("after restarting "+n.id, 50)
		t.Logf("%s restarted; %d marks acknowledged so far", n.id, progress.Load())
	}
	stop.Store(true)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		c.dumpLogs()
		t.Fatalf("%d client calls failed during the rolling restart", n)
	}
	checkAll(t, ctx, "after the rolling restart", cl, acked)
	t.Logf("rolling restart of 3 nodes: %d marks, 0 failed calls, none lost", len(acked))
}

// waitCaughtUp waits until node n answers Status, knows the leader and has
// applied what the leader had committed when n came back.
func waitCaughtUp(t *testing.T, ctx context.Context, c *cluster, cl *client.Client, n *node) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var target uint64
	for {
		if target == 0 {
			if st, err := cl.Status(ctx); err == nil && st.LeaderID != "" && st.LeaderID != n.id {
				if ls, err := cl.StatusOf(ctx, st.LeaderGRPCAddr); err == nil {
					target = ls.CommitIndex
				}
			}
		}
		if target > 0 {
			sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := cl.StatusOf(sctx, n.grpc)
			scancel()
			if err == nil && st.LeaderID != "" && st.AppliedIndex >= target {
				return
			}
		}
		if time.Now().After(deadline) {
			c.dumpLogs()
			t.Fatalf("%s did not catch up within 90s (target index %d)", n.id, target)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
