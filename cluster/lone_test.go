package cluster

import (
	"context"
	"testing"
	"time"
)

// TestLoneVoter_ElectsItselfWithoutWaitingOutTheHeartbeatTimeout: a
// one-node cluster configured with a 60 s heartbeat timeout would wait
// 60–120 s after every start before electing itself; hurryLoneElection
// shortens the wait to the leader lease (150 ms here), so both the first
// start and a restart lead well within the 20 s deadline, and raft's
// configured timeouts are back once the node leads.
func TestLoneVoter_ElectsItselfWithoutWaitingOutTheHeartbeatTimeout(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, true)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = time.Minute, time.Minute

	for _, round := range []string{"first start", "restart"} {
		n, err := New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		waitFor(t, 20*time.Second, round+": leader", n.IsLeader)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = n.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		waitFor(t, 20*time.Second, round+": configured timeouts restored", func() bool {
			rc := n.raft.ReloadableConfig()
			return rc.HeartbeatTimeout == time.Minute && rc.ElectionTimeout == time.Minute
		})
		if err := n.Shutdown(context.Background()); err != nil {
			t.Fatalf("%s: shutdown: %v", round, err)
		}
		cfg.Bootstrap = false
	}
}
