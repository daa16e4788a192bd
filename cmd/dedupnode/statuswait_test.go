package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// D8: status --wait waits for the node to be healthy too. Its condition,
// case by case: a node that knows a leader and has caught up but is not
// healthy (a new leader before its term barrier, a low disk), or whose
// health check does not answer SERVING yet, is not done.
func TestStatusWaitConditionIncludesHealth(t *testing.T) {
	ok := client.Status{LeaderID: "n1", AppliedIndex: 10, Healthy: true}
	if !waitDone(ok, 10, true, true) {
		t.Fatal("a caught-up, healthy, serving node is not done")
	}
	notReady := ok
	notReady.Healthy, notReady.HealthReason = false, "new leader not ready yet"
	for name, done := range map[string]bool{
		"no leader":             waitDone(client.Status{AppliedIndex: 10, Healthy: true}, 10, true, true),
		"target unknown":        waitDone(ok, 0, false, true),
		"behind":                waitDone(ok, 11, true, true),
		"new leader not ready":  waitDone(notReady, 10, true, true),
		"health NOT_SERVING":    waitDone(ok, 10, true, false),
		"unhealthy and serving": waitDone(notReady, 10, true, true),
	} {
		if done {
			t.Errorf("%s: --wait would return success", name)
		}
	}
}

// D8 against a real node that is caught up and knows its leader (itself)
// but reports NOT_SERVING (its disk is "low": --min-free-disk above its
// free space): status --wait must not return success, and says why. The old
// code returned 0 here.
func TestStatusWaitRefusesAnUnhealthyNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	grpcAddr := closedAddr(t)
	dataDir := t.TempDir()
	r := startCmd("serve", "--node-id", "n1", "--data-dir", dataDir, "--bootstrap",
		"--grpc-addr", grpcAddr, "--raft-addr", closedAddr(t), "--min-free-disk", strconv.FormatUint(unmetMinFree(t, dataDir), 10)+"B")
	t.Cleanup(func() {
		if code := r.stop(t); code != exitOK {
			t.Errorf("serve exited %d: %s", code, r.errs.String())
		}
	})
	c := testcluster.Client(t, []string{grpcAddr})
	testcluster.WaitFor(t, 60*time.Second, "the node leads, caught up and unhealthy for its disk", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := c.StatusOf(ctx, grpcAddr)
		return err == nil && st.LeaderID == "n1" && st.AppliedIndex >= st.CommitIndex && !st.Healthy && strings.Contains(st.HealthReason, "disk space low")
	})
	code, out, errs := runCLI(t, context.Background(), "", "status", "--wait", "--addr", grpcAddr, "--timeout", "3s")
	if code != exitError || out != "" || !strings.Contains(errs, grpcAddr+" has caught up but is not healthy after --timeout 3s: disk space low") {
		t.Fatalf("status --wait on an unhealthy node: exit %d, stdout %q, stderr %q; want exit %d naming the health reason", code, out, errs, exitError)
	}
	assertOneLine(t, errs)
}

// D8 on a fresh 3-node serve cluster (where the tester saw 'status --wait'
// return 0 while the node logged "health NOT_SERVING: new leader not ready
// yet"): once --wait returns for a node, its status says healthy and its
// gRPC health check answers SERVING (health never goes back on an idle
// cluster, so asking right after is fair).
func TestStatusWaitOnAFreshClusterReturnsOnlyWhenServing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	var raft, grpcAddrs, peers []string
	for i := range 3 {
		raft, grpcAddrs = append(raft, closedAddr(t)), append(grpcAddrs, closedAddr(t))
		peers = append(peers, fmt.Sprintf("n%d=%s=%s", i+1, raft[i], grpcAddrs[i]))
	}
	for i := range 3 {
		r := startCmd("serve", "--node-id", fmt.Sprintf("n%d", i+1), "--data-dir", t.TempDir(),
			"--raft-addr", raft[i], "--grpc-addr", grpcAddrs[i], "--peers", strings.Join(peers, ","))
		t.Cleanup(func() {
			if code := r.stop(t); code != exitOK {
				t.Errorf("n%d exited %d: %s", i+1, code, r.errs.String())
			}
		})
	}
	c := testcluster.Client(t, grpcAddrs)
	// The leader's node first: the one where "new leader not ready yet"
	// shows; the others after.
	for _, addr := range grpcAddrs {
		code, out, errs := runCLI(t, context.Background(), "", "status", "--wait", "--addr", addr, "--timeout", "60s", "--output", "json")
		if code != exitOK {
			t.Fatalf("status --wait --addr %s: exit %d, stderr %q", addr, code, errs)
		}
		var st struct {
			Healthy      bool   `json:"healthy"`
			HealthReason string `json:"health_reason"`
		}
		if err := json.NewDecoder(strings.NewReader(out)).Decode(&st); err != nil {
			t.Fatalf("status --wait --output json: %v in %q", err, out)
		}
		if !st.Healthy {
			t.Fatalf("status --wait --addr %s returned with the node unhealthy: %s", addr, st.HealthReason)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		serving, err := c.HealthOf(ctx, addr)
		cancel()
		if err != nil || !serving {
			t.Fatalf("right after status --wait --addr %s returned: health serving=%v, err %v", addr, serving, err)
		}
	}
}
