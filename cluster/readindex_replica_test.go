package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestReadIndex_ReplicaAloneDoesNotConfirmLeader: a leader that lost every
// other voter must not confirm a read index on the strength of a read
// replica's answer. raft.VerifyLeader counts non-voters toward its quorum,
// so with the replica the old leader would go on answering "linearizable"
// reads until its lease check stepped it down — the window in which a
// majority elsewhere could elect a new leader and acknowledge writes this
// one never saw. The lease here is long (3 s), so that window is wide open
// when the read is made.
func TestReadIndex_ReplicaAloneDoesNotConfirmLeader(t *testing.T) {
	timing := func(cfg Config) Config {
		cfg.HeartbeatTimeout = 3 * time.Second
		cfg.ElectionTimeout = 3 * time.Second
		cfg.LeaderLeaseTimeout = 3 * time.Second
		return cfg
	}
	lead := testConfig(t.TempDir(), true)
	lead.NodeID = "n1"
	n1 := startNode(t, timing(lead))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	others := map[string]*Node{}
	for _, id := range []string{"n2", "n3", "r1"} {
		cfg := testConfig(t.TempDir(), false)
		cfg.NodeID = id
		n := startNode(t, timing(cfg))
		others[id] = n
		var err error
		if id == "r1" {
			err = n1.JoinReplica(ctx, id, n.RaftAddr(), "127.0.0.1:1")
		} else if err = n1.Join(ctx, id, n.RaftAddr(), "127.0.0.1:1"); err == nil {
			err = n1.Promote(ctx, id, true)
		}
		if err != nil {
			t.Fatalf("add %s: %v", id, err)
		}
	}
	waitFor(t, 30*time.Second, "n2 and n3 voters, r1 a non-voter", func() bool {
		cf := n1.Raft().GetConfiguration()
		if cf.Error() != nil {
			return false
		}
		got := map[string]raft.ServerSuffrage{}
		for _, s := range cf.Configuration().Servers {
			got[string(s.ID)] = s.Suffrage
		}
		return got["n2"] == raft.Voter && got["n3"] == raft.Voter && got["r1"] == raft.Nonvoter
	})
	if _, err := n1.ReadIndex(ctx); err != nil {
		t.Fatalf("read index with every voter up: %v", err)
	}

	for _, id := range []string{"n2", "n3"} {
		if err := others[id].Shutdown(ctx); err != nil {
			t.Fatalf("shut down %s: %v", id, err)
		}
	}
	if !n1.IsLeader() {
		t.Skip("n1 stepped down before the read; nothing to test (lease 3 s)")
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	idx, err := n1.ReadIndex(rctx)
	if err == nil {
		t.Fatalf("read index %d confirmed with no other voter up (only the read replica answered)", idx)
	}
	if rctx.Err() != nil {
		t.Fatalf("read index neither confirmed nor refused within 30 s: %v", err)
	}
	t.Logf("refused as expected: %v", err)
}
