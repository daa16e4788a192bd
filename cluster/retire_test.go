package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// TestRemovedIDIsNeverAdmittedAgain: n2 is removed from a 2-node
// cluster. A node started under n2's ID with an empty data dir asks to
// join: the leader refuses it naming the ID and the fix, and nothing
// changes (otherwise n2's old data dir, holding a log and votes the
// cluster has forgotten, could come back and vote as the new n2 — the
// way a tester lost acknowledged marks). A new ID joins as before. The
// retirement is replicated state: a leader restarted from its data dir
// still refuses the ID.
func TestRemovedIDIsNeverAdmittedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leadCfg := testConfig(t.TempDir(), true)
	leadCfg.NodeID = "n1"
	n1 := startNode(t, leadCfg)

	cfg2 := testConfig(t.TempDir(), false)
	cfg2.NodeID = "n2"
	n2 := startNode(t, cfg2)
	if err := n1.Join(ctx, "n2", n2.RaftAddr(), "127.0.0.1:1"); err != nil {
		t.Fatalf("join n2: %v", err)
	}
	if err := n1.Remove(ctx, "n2"); err != nil {
		t.Fatalf("remove n2: %v", err)
	}
	stopNode(t, n2)
	if !n1.FSM().Retired("n2") {
		t.Fatal("n2 removed but not retired")
	}

	again := testConfig(t.TempDir(), false)
	again.NodeID = "n2"
	n2b := startNode(t, again)
	err := n1.Join(ctx, "n2", n2b.RaftAddr(), "127.0.0.1:1")
	var inv *fsm.InvalidError
	if !errors.As(err, &inv) || inv.Field != "node_id" || !strings.Contains(err.Error(), "new --node-id") {
		t.Fatalf("join of a removed ID: %v, want an invalid node_id naming the fix", err)
	}
	st, err := n1.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.ID == "n2" {
			t.Fatalf("refused join left n2 in the configuration: %+v", st.Members)
		}
	}
	stopNode(t, n2b)

	cfg3 := testConfig(t.TempDir(), false)
	cfg3.NodeID = "n3"
	n3 := startNode(t, cfg3)
	if err := n1.Join(ctx, "n3", n3.RaftAddr(), "127.0.0.1:1"); err != nil {
		t.Fatalf("join of a new ID: %v", err)
	}
	if err := n1.Remove(ctx, "n3"); err != nil {
		t.Fatalf("remove n3: %v", err)
	}
	stopNode(t, n3)

	stopNode(t, n1)
	leadCfg.Bootstrap = false
	n1 = startNode(t, leadCfg)
	waitFor(t, 30*time.Second, "n1 leads again", n1.IsLeader)
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n1.Join(ctx, "n2", "127.0.0.1:1", "127.0.0.1:1"); !errors.As(err, &inv) {
		t.Fatalf("after a restart, join of the removed n2: %v, want refused", err)
	}
}

// TestTermStartDoesNotReaddARetiredStaticPeer: a leader started with
// static peers fills the node table with their client addresses at each
// term start. A peer removed since is retired; a later term must not put
// it back (it would reappear in members and be dialled by clients).
func TestTermStartDoesNotReaddARetiredStaticPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := testConfig(t.TempDir(), true)
	cfg.NodeID = "n1"
	n1 := startNode(t, cfg)
	waitFor(t, 30*time.Second, "n1 leads", n1.IsLeader)
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Propose(ctx, []fsm.Op{{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: "n2", GRPCAddr: "127.0.0.1:2"}}}); err != nil {
		t.Fatal(err)
	}
	if err := n1.Remove(ctx, "n2"); err != nil {
		t.Fatalf("remove n2: %v", err)
	}
	raftAddr := n1.RaftAddr()
	stopNode(t, n1)

	// Restarted with the static peers it was first started with (a node
	// restarted from its data dir ignores them for bootstrapping, not for
	// the node table): a new term starts.
	cfg.Bootstrap = false
	cfg.RaftAddr = raftAddr
	cfg.Peers = []Peer{{ID: "n1", RaftAddr: raftAddr, GRPCAddr: cfg.GRPCAddr}, {ID: "n2", RaftAddr: "127.0.0.1:1", GRPCAddr: "127.0.0.1:2"}}
	n1 = startNode(t, cfg)
	defer stopNode(t, n1)
	waitFor(t, 30*time.Second, "n1 leads again", n1.IsLeader)
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !n1.FSM().Retired("n2") {
		t.Fatal("n2 is no longer retired after the restart")
	}
	if addr, ok := n1.FSM().Nodes()["n2"]; ok {
		t.Fatalf("the new term put retired n2 back in the node table at %s", addr)
	}
}
