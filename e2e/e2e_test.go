package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

const (
	numIDs = 10_000
	batch  = 1_000
)

func testIDs() []string {
	ids := make([]string, numIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("e2e-msg-%05d", i)
	}
	return ids
}

// expectAll sends ids through op in batches and fails unless every result
// has code want. op is called with one batch at a time.
func expectAll(t *testing.T, what string, ids []string, want client.Code, op func(ids [][]byte) ([]client.Result, error)) {
	t.Helper()
	bad, first := 0, ""
	for lo := 0; lo < len(ids); lo += batch {
		hi := min(lo+batch, len(ids))
		b := make([][]byte, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			b = append(b, []byte(id))
		}
		res, err := op(b)
		if err != nil {
			t.Fatalf("%s: batch %d-%d: %v", what, lo, hi, err)
		}
		for _, r := range res {
			if r.Code != want {
				if bad == 0 {
					first = fmt.Sprintf("%s=%v", r.ID, r.Code)
				}
				bad++
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d IDs did not answer %v (first: %s)", what, bad, len(ids), want, first)
	}
}

// checkAll verifies through c that every ID is seen (linearizable) and that
// marking it again answers duplicate.
func checkAll(t *testing.T, ctx context.Context, stage string, c *client.Client, ids []string) {
	t.Helper()
	expectAll(t, stage+": check", ids, client.CodeSeen, func(b [][]byte) ([]client.Result, error) {
		return c.Check(ctx, "", b, client.Linearizable)
	})
	expectAll(t, stage+": re-mark", ids, client.CodeDuplicate, func(b [][]byte) ([]client.Result, error) {
		items := make([]client.Item, len(b))
		for i, id := range b {
			items[i] = client.Item{ID: id}
		}
		return c.Mark(ctx, "", items, 0)
	})
}

// Three serve processes with a static --peers list; 10 000 IDs marked
// through the CLI; SIGKILL of the leader; every ID still seen and a
// duplicate through the survivors; then every node restarted (one after a
// clean SIGTERM, the others after SIGKILL) and the same checked again on
// each node. README Guarantees (2) (no lost marks) end to end.
//
// Run with each Raft log store (serve --raft-log-store).
func TestInvariant2_NoLostMarksAcrossLeaderKillAndFullRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	bin := buildBinary(t)
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) { testNoLostMarksAcrossKills(t, bin, store) })
	}
}

// logStores are the --raft-log-store values the kill -9 tests run with.
var logStores = []string{"wal", "boltdb"}

func testNoLostMarksAcrossKills(t *testing.T, bin, store string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cl := newPeersCluster(t, bin, 3)
	cl.store = store
	cl.startAll()
	all := cl.addrs()
	cl.waitLeader(ctx, all, 60*time.Second)

	// Mark every ID through the CLI, IDs on stdin, 1 000 per request.
	ids := testIDs()
	code, out, errs := cli(t, bin, strings.Join(ids, "\n")+"\n",
		"mark", "--addr", strings.Join(all, ","), "--batch", fmt.Sprint(batch), "--timeout", "60s", "-")
	if code != 0 {
		cl.dumpLogs()
		t.Fatalf("mark: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != numIDs {
		t.Fatalf("mark printed %d lines, want %d", len(lines), numIDs)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, ids[i]+"\tnew\t") {
			t.Fatalf("mark line %d = %q, want %s<TAB>new<TAB>...", i, l, ids[i])
		}
	}

	// Kill -9 the leader.
	leaderID := cl.waitLeader(ctx, all, 30*time.Second)
	leader := cl.byID(leaderID)
	cl.kill(leader)
	var survivors []string
	var alive []*node
	for _, n := range cl.nodes {
		if n != leader {
			survivors = append(survivors, n.grpc)
			alive = append(alive, n)
		}
	}
	newLeader := cl.waitLeader(ctx, survivors, 60*time.Second)
	t.Logf("killed leader %s; new leader %s", leaderID, newLeader)

	c, err := client.New(ctx, survivors)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, ctx, "after leader kill", c, ids)
	c.Close()

	// The CLI through the survivors answers duplicate too.
	code, out, errs = cli(t, bin, strings.Join(ids[:batch], "\n"), "mark", "--addr", strings.Join(survivors, ","), "-")
	if code != 0 || strings.Count(out, "\tduplicate\t") != batch {
		t.Fatalf("CLI re-mark via survivors: exit %d, %d duplicates of %d; stderr %s", code, strings.Count(out, "\tduplicate\t"), batch, errs)
	}

	// Restart everything: one survivor stops cleanly, the other is killed.
	cl.stop(alive[0], 60*time.Second)
	cl.kill(alive[1])
	cl.startAll()
	cl.waitLeader(ctx, all, 60*time.Second)

	c, err = client.New(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkAll(t, ctx, "after full restart", c, ids)

	// Each node, once caught up, holds every ID itself (stale reads answer
	// from the contacted node alone).
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.nodes {
		nc, err := client.New(ctx, []string{n.grpc})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			ns, err := nc.StatusOf(ctx, n.grpc)
			if err == nil && ns.AppliedIndex >= st.CommitIndex {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not apply up to %d within 60s (last: %+v, %v)", n.id, st.CommitIndex, ns, err)
			}
			time.Sleep(50 * time.Millisecond) // poll interval, not a proof
		}
		expectAll(t, "after restart, stale check on "+n.id, ids, client.CodeSeen, func(b [][]byte) ([]client.Result, error) {
			return nc.Check(ctx, "", b, client.Stale)
		})
		nc.Close()
	}

	// And the three replicas — one restarted after a clean stop, two after
	// kill -9 — hold byte-identical state: the same digest at one applied
	// index.
	code, out, errs = cli(t, bin, "", "digest", "--addr", strings.Join(all, ","), "--timeout", "60s")
	if code != 0 || !strings.Contains(out, "agree: 3 replicas, same digest at applied index") {
		cl.dumpLogs()
		t.Fatalf("digest: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("digest:\n%s", out)
}

// The binary's command-line contract: exit codes, one-line errors, JSON
// shapes, and a restart that needs no mode flag once the data dir holds
// state.
func TestCLIContract(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildBinary(t)

	oneLine := func(what, stderr string) {
		t.Helper()
		if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
			t.Fatalf("%s: stderr must be one line, got %q", what, stderr)
		}
	}

	// Usage errors: exit 2, one line on stderr, nothing on stdout.
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"mark", "--bogus", "x"},
		{"mark"},
		{"serve", "--node-id", "n1", "--data-dir", t.TempDir()},
		{"check", "--consistency", "sometimes", "x"},
	} {
		code, out, errs := cli(t, bin, "", args...)
		if code != 2 || out != "" {
			t.Fatalf("%v: exit %d stdout %q, want 2 and nothing", args, code, out)
		}
		oneLine(fmt.Sprint(args), errs)
	}

	// Operational error: exit 1, one line naming the address and what to do.
	dead := freePorts(t, 1)[0]
	code, _, errs := cli(t, bin, "", "check", "--addr", dead, "--timeout", "1s", "x")
	if code != 1 || !strings.Contains(errs, dead) || !strings.Contains(errs, "dedupnode dev") {
		t.Fatalf("unreachable: exit %d stderr %q", code, errs)
	}
	oneLine("unreachable", errs)

	// A single --bootstrap node.
	cl := newPeersCluster(t, bin, 1)
	cl.args = []string{"--bootstrap"}
	cl.startAll()
	n := cl.nodes[0]
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)

	code, out, errs := cli(t, bin, "", "mark", "--addr", n.grpc, "--output", "json", "--ttl", "1h", "a", "b")
	if code != 0 {
		t.Fatalf("mark json: %d %s", code, errs)
	}
	for i, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("mark json line %q: %v", l, err)
		}
		if m["id"] != []string{"a", "b"}[i] || m["result"] != "new" || m["expires_at"] == nil || m["first_seen"] == nil {
			t.Fatalf("mark json line %q lacks id/result/expires_at/first_seen", l)
		}
		first, _ := time.Parse(time.RFC3339, m["first_seen"].(string))
		exp, _ := time.Parse(time.RFC3339, m["expires_at"].(string))
		if exp.Sub(first) != time.Hour {
			t.Fatalf("--ttl 1h gave first_seen %v expires_at %v", first, exp)
		}
	}

	code, out, _ = cli(t, bin, "", "claim", "--addr", n.grpc, "--output", "json", "job")
	var claim struct {
		Result       string `json:"result"`
		Lease        string `json:"lease"`
		FencingToken uint64 `json:"fencing_token"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &claim) != nil || claim.Result != "acquired" || claim.FencingToken == 0 || claim.Lease == "" {
		t.Fatalf("claim json: %d %q", code, out)
	}
	code, out, _ = cli(t, bin, "", "commit", "--addr", n.grpc, "job="+claim.Lease)
	if code != 0 || !strings.HasPrefix(out, "job\tok") {
		t.Fatalf("commit: %d %q", code, out)
	}

	code, out, _ = cli(t, bin, "", "status", "--addr", n.grpc, "--output", "json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status json: %d %q", code, out)
	}
	for _, k := range []string{"leader_id", "members", "term", "commit_index", "applied_index", "ids_stored", "bloom"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("status json lacks %q: %s", k, out)
		}
	}
	members, _ := st["members"].([]any)
	if st["leader_id"] != n.id || len(members) != 1 {
		t.Fatalf("status json: leader %v members %v", st["leader_id"], members)
	}
	m := members[0].(map[string]any)
	if m["id"] != n.id || m["raft_addr"] != n.raft || m["grpc_addr"] != n.grpc || m["suffrage"] != "voter" {
		t.Fatalf("member = %v", m)
	}

	// Clean stop, then a restart without --bootstrap: the data dir holds
	// state, so no mode flag is needed, and the marks are still there.
	cl.stop(n, 60*time.Second)
	cl.args = nil
	cl.start(n)
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	code, out, errs = cli(t, bin, "", "check", "--addr", n.grpc, "a", "b", "c")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "a\tseen\t") ||
		!strings.HasPrefix(lines[1], "b\tseen\t") || lines[2] != "c\tnot_seen" {
		t.Fatalf("check after restart: exit %d out %q stderr %s", code, out, errs)
	}
}

// A cluster grown by `serve --join`: one --bootstrap node, two joiners that
// enter as non-voters and are promoted once caught up; then the original
// leader is killed and the joined nodes carry on with every mark.
//
// Run with each Raft log store (serve --raft-log-store).
func TestJoinedNodesBecomeVotersAndSurviveLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	bin := buildBinary(t)
	for _, store := range logStores {
		t.Run(store, func(t *testing.T) { testJoinedSurviveLeaderKill(t, bin, store) })
	}
}

func testJoinedSurviveLeaderKill(t *testing.T, bin, store string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := newPeersCluster(t, bin, 3)
	cl.args = nil
	cl.store = store
	seed := cl.nodes[0]
	cl.start(seed, "--bootstrap")
	cl.waitLeader(ctx, []string{seed.grpc}, 60*time.Second)
	for _, n := range cl.nodes[1:] {
		cl.start(n, "--join", seed.grpc)
	}

	// Wait until the CLI lists three voters.
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, out, errs := cli(t, bin, "", "members", "--addr", seed.grpc, "--output", "json")
		voters := 0
		if code == 0 {
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				var m struct {
					ID       string `json:"id"`
					Suffrage string `json:"suffrage"`
				}
				if json.Unmarshal([]byte(l), &m) == nil && m.Suffrage == "voter" {
					voters++
				}
			}
		}
		if voters == 3 {
			break
		}
		if time.Now().After(deadline) {
			cl.dumpLogs()
			t.Fatalf("no 3 voters within 90s; last members: exit %d %q %s", code, out, errs)
		}
		time.Sleep(200 * time.Millisecond) // poll interval, not a proof
	}

	all := cl.addrs()
	ids := testIDs()[:2000]
	code, out, errs := cli(t, bin, strings.Join(ids, "\n"), "mark", "--addr", strings.Join(all, ","), "-")
	if code != 0 || strings.Count(out, "\tnew\t") != len(ids) {
		t.Fatalf("mark: exit %d, %d new of %d; stderr %s", code, strings.Count(out, "\tnew\t"), len(ids), errs)
	}

	leader := cl.byID(cl.waitLeader(ctx, all, 30*time.Second))
	cl.kill(leader)
	var survivors []string
	for _, n := range cl.nodes {
		if n != leader {
			survivors = append(survivors, n.grpc)
		}
	}
	cl.waitLeader(ctx, survivors, 60*time.Second)
	c, err := client.New(ctx, survivors)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkAll(t, ctx, "after killing "+leader.id, c, ids)
}
