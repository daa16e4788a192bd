package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// The Raft log retention flags reach raft: with a snapshot threshold of 8
// entries checked every second, a node that applied more than 8 entries
// takes a snapshot (status shows its index) without any operator action.
func TestServeRaftSnapshotThresholdFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 1)
	cl.args = nil
	n := cl.nodes[0]
	cl.start(n, "--bootstrap", "--raft-snapshot-threshold", "8", "--raft-snapshot-interval", "1s", "--raft-trailing-logs", "4")
	cl.waitLeader(ctx, []string{n.grpc}, 60*time.Second)

	c, err := client.New(ctx, []string{n.grpc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One call at a time: each mark is its own log entry.
	for i := range 30 {
		if _, err := c.Mark(ctx, "", []client.Item{{ID: fmt.Appendf(nil, "retention-%d", i)}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		st, err := c.Status(ctx)
		if err == nil && st.LastSnapshotIndex > 0 {
			t.Logf("snapshot at index %d, applied %d", st.LastSnapshotIndex, st.AppliedIndex)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot within 90 s of 30 entries with --raft-snapshot-threshold 8 (last status %+v, err %v)\n%s", st, err, cl.tail(n))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
