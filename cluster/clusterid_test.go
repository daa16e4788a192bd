package cluster

import (
	"context"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// A cluster gets its ID once, from the node that first leads it, through
// the log: a node that joins later applies the same ID, and a restart
// keeps it (no second ID is drawn when the state already has one).
func TestClusterID_AssignedOnceReplicatedAndKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	lead := testConfig(t.TempDir(), true)
	lead.NodeID = "n1"
	n1 := startNode(t, lead)
	id := n1.ClusterID()
	if b, err := hex.DecodeString(id); err != nil || len(b) != 16 {
		t.Fatalf("cluster ID after bootstrap %q: want 128 bits in hex", id)
	}
	if st, _ := n1.Status(); st.ClusterID != id {
		t.Fatalf("Status().ClusterID %q, want %q", st.ClusterID, id)
	}

	cfg := testConfig(t.TempDir(), false)
	cfg.NodeID = "n2"
	n2 := startNode(t, cfg)
	if got := n2.ClusterID(); got != "" {
		t.Fatalf("an empty node knows cluster ID %q before joining", got)
	}
	if err := n1.Join(ctx, "n2", n2.RaftAddr(), "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "n2 applies the cluster ID", func() bool { return n2.ClusterID() == id })

	stopNode(t, n2)
	stopNode(t, n1)
	lead.Bootstrap = false
	n1, n2 = startNode(t, lead), startNode(t, cfg)
	for _, n := range []*Node{n1, n2} {
		if got := n.ClusterID(); got != id {
			t.Fatalf("%s: cluster ID read from its data dir at restart %q, want %q", n.ID(), got, id)
		}
	}
	// The next leader's term start finds the ID and draws no other.
	waitFor(t, 60*time.Second, "a leader again", func() bool { return n1.IsLeader() || n2.IsLeader() })
	leader := n1
	if n2.IsLeader() {
		leader = n2
	}
	if err := leader.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := leader.ClusterID(); got != id {
		t.Fatalf("cluster ID after a new term %q, want %q", got, id)
	}
}

// A data dir written before cluster IDs existed (the v1 fixture) gets one
// on the first start of this version, and keeps it on the next.
func TestClusterID_LegacyDataDirGetsOneAtFirstStart(t *testing.T) {
	dir := v1DataDir(t)
	cfg := testConfig(dir, false)
	cfg.NodeID = "v1"
	cfg.LogStore = LogStoreBoltDB
	n := startNode(t, cfg)
	waitFor(t, 60*time.Second, "the old cluster gets an ID", func() bool { return n.ClusterID() != "" })
	id := n.ClusterID()
	stopNode(t, n)
	n = startNode(t, cfg)
	waitFor(t, 60*time.Second, "the restarted node applies its state", func() bool { return n.ClusterID() != "" })
	waitFor(t, 60*time.Second, "leader", n.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.ClusterID(); got != id {
		t.Fatalf("cluster ID after restart %q, want the one assigned at first start %q", got, id)
	}
}

// Join asks the joining node its cluster ID and refuses a node of another
// cluster (its data dir holds another cluster's state) before the Raft
// configuration changes; a node without an ID is let in.
func TestJoin_RefusesNodeOfAnotherCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	other := testConfig(t.TempDir(), true)
	other.NodeID = "b1"
	b1 := startNode(t, other)

	fresh := testConfig(t.TempDir(), false)
	fresh.NodeID = "a2"
	a2 := startNode(t, fresh)

	// The probe the server wires to Admin.Status, answered here by the
	// nodes themselves: cluster holds no gRPC.
	byAddr := map[string]*Node{"127.0.0.1:2": b1, "127.0.0.1:3": a2}
	lead := testConfig(t.TempDir(), true)
	lead.NodeID = "a1"
	lead.ClusterIDProbe = func(_ context.Context, id, grpcAddr string) (string, error) {
		return byAddr[grpcAddr].ClusterID(), nil
	}
	a1 := startNode(t, lead)
	if a1.ClusterID() == b1.ClusterID() {
		t.Fatalf("two clusters drew the same ID %s", a1.ClusterID())
	}

	err := a1.Join(ctx, "b1", b1.RaftAddr(), "127.0.0.1:2")
	var mm *ClusterMismatchError
	if !errors.Is(err, ErrClusterMismatch) || !errors.As(err, &mm) {
		t.Fatalf("join of another cluster's node: %v, want a *ClusterMismatchError", err)
	}
	if mm.Ours != a1.ClusterID() || mm.Theirs != b1.ClusterID() || mm.Addr != "127.0.0.1:2" || mm.NodeID != "b1" {
		t.Fatalf("mismatch error %+v: want both IDs, the address and the node", mm)
	}
	st, err := a1.Status()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 1 {
		t.Fatalf("members after the refused join: %+v", st.Members)
	}
	if _, ok := a1.FSM().Nodes()["b1"]; ok {
		t.Fatal("the refused node is in the node table")
	}

	if err := a1.Join(ctx, "a2", a2.RaftAddr(), "127.0.0.1:3"); err != nil {
		t.Fatalf("join of an empty node: %v", err)
	}
	waitFor(t, 60*time.Second, "a2 takes a1's cluster ID", func() bool { return a2.ClusterID() == a1.ClusterID() })
	if _, err := a1.Propose(ctx, []fsm.Op{markOp("after-join")}); err != nil {
		t.Fatal(err)
	}
}
