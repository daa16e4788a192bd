package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// members returns the IDs in n's latest Raft configuration.
func members(t *testing.T, n *Node) []string {
	t.Helper()
	cf := n.Raft().GetConfiguration()
	if err := cf.Error(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range cf.Configuration().Servers {
		ids = append(ids, string(s.ID))
	}
	return ids
}

// TestJoin_RefusesNodeIDTheFSMCannotRecord: a join under an ID longer than
// fsm.MaxNodeIDBytes is refused as an invalid node_id before the
// configuration changes. (It used to be added to Raft, then its OpSetNode
// was rejected by the decoder: a member no command could name, promoted
// to a dead voter.) The same holds for read replicas and for an ID with a
// control character; an ID of exactly the limit joins.
func TestJoin_RefusesNodeIDTheFSMCannotRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t.TempDir(), true)
	cfg.NodeID = "n1"
	n1 := startNode(t, cfg)
	before := n1.Raft().LastIndex()

	long := strings.Repeat("x", fsm.MaxNodeIDBytes+1)
	for _, c := range []struct {
		id      string
		replica bool
	}{{long, false}, {long, true}, {"n\n2", false}} {
		join := n1.Join
		if c.replica {
			join = n1.JoinReplica
		}
		err := join(ctx, c.id, "127.0.0.1:1", "127.0.0.1:1")
		var inv *fsm.InvalidError
		if !errors.As(err, &inv) || inv.Field != "node_id" {
			t.Fatalf("join %.20q (replica %v): %v, want an invalid node_id", c.id, c.replica, err)
		}
		if got := members(t, n1); len(got) != 1 {
			t.Fatalf("refused join changed the configuration: %.40q", got)
		}
	}
	if after := n1.Raft().LastIndex(); after != before {
		t.Fatalf("refused joins wrote log entries %d..%d", before+1, after)
	}

	limit := strings.Repeat("y", fsm.MaxNodeIDBytes)
	if err := n1.Join(ctx, limit, "127.0.0.1:1", "127.0.0.1:1"); err != nil {
		t.Fatalf("join of a %d-byte ID: %v", len(limit), err)
	}
	if addr := n1.FSM().Nodes()[limit]; addr != "127.0.0.1:1" {
		t.Fatalf("node table address of the %d-byte ID: %q", len(limit), addr)
	}
	if err := n1.Remove(ctx, limit); err != nil {
		t.Fatalf("remove the %d-byte ID: %v", len(limit), err)
	}
	if !n1.FSM().Retired(limit) {
		t.Fatal("the removed 128-byte ID is not retired")
	}
}

// TestRemove_MemberWhoseIDTheFSMCannotRecord: a cluster that an older
// version let a 129-byte ID into (here added straight through Raft, as
// that version did) can remove it: every command naming the ID is
// rejected, so Remove takes it out of the configuration alone, and the
// cluster goes on committing. (Remove used to fail on the rejected
// OpRemoveNode, leaving the member, as a dead voter, for good.)
func TestRemove_MemberWhoseIDTheFSMCannotRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t.TempDir(), true)
	cfg.NodeID = "n1"
	n1 := startNode(t, cfg)

	long := strings.Repeat("x", fsm.MaxNodeIDBytes+1)
	if err := n1.Raft().AddNonvoter(raft.ServerID(long), "127.0.0.1:1", 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if got := members(t, n1); len(got) != 2 {
		t.Fatalf("members %.40q, want n1 and the long ID", got)
	}
	if err := n1.Remove(ctx, long); err != nil {
		t.Fatalf("remove of the %d-byte ID: %v", len(long), err)
	}
	if got := members(t, n1); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("after remove: members %.40q, want n1 alone", got)
	}
	if err := n1.Remove(ctx, long); !errors.Is(err, fsm.ErrNodeNotFound) {
		t.Fatalf("second remove: %v, want not found", err)
	}
	// The commit index rests on an applied entry (Remove ends with a
	// command), and writes go on.
	if _, err := n1.Propose(ctx, []fsm.Op{markOp("after")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "applied index reaches the commit index", func() bool {
		return n1.FSM().AppliedIndex() >= n1.Raft().CommitIndex()
	})
}

// TestConfig_RefusesInvalidNodeIDs: a node started under an ID the FSM
// cannot record never became ready (its term-start OpSetNode was rejected
// forever); New refuses it, and a static peer's, before creating anything.
func TestConfig_RefusesInvalidNodeIDs(t *testing.T) {
	long := strings.Repeat("z", fsm.MaxNodeIDBytes+1)
	cfg := testConfig(t.TempDir(), true)
	cfg.NodeID = long
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "longer than the 128 bytes") {
		t.Fatalf("New with a %d-byte NodeID: %v", len(long), err)
	}
	cfg = testConfig(t.TempDir(), false)
	cfg.Peers = []Peer{{ID: "solo", RaftAddr: "127.0.0.1:1"}, {ID: long, RaftAddr: "127.0.0.1:2"}}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Peers[1]") {
		t.Fatalf("New with a %d-byte peer ID: %v", len(long), err)
	}
	cfg = testConfig(t.TempDir(), true)
	cfg.NodeID = "n1 "
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "ends with a space") {
		t.Fatalf("New with NodeID %q: %v", cfg.NodeID, err)
	}
}
