package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
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

// serve --raft-log-max-bytes bounds the Raft log in bytes whatever the
// entry-count retention says: with raft's count defaults (10240 entries
// kept, a snapshot every 8192 entries checked every 2-4 minutes), 40
// entries of 200 KiB (8 MiB) leave at most 1 MiB of log, as the node's
// dedup_raft_log_bytes reports, behind a snapshot it took by itself.
func TestServeRaftLogMaxBytesFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	ports := freePorts(t, 3)
	cl := &cluster{t: t, bin: bin, args: []string{"--bootstrap"}}
	n := &node{id: "n1", raft: ports[0], grpc: ports[1], dir: filepath.Join(t.TempDir(), "n1"), logPath: filepath.Join(t.TempDir(), "n1.log")}
	cl.nodes = []*node{n}
	const maxLog = 1 << 20
	cl.start(n, "--admin-addr", ports[2], "--max-entry-bytes", "256KiB", "--raft-log-max-bytes", "1MiB")
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	cc := dial(t, n.grpc)
	if _, err := dedupv1.NewAdminClient(cc).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{
		Namespace: &dedupv1.Namespace{Name: "big", MaxIdBytes: 4096}}); err != nil {
		t.Fatal(err)
	}
	dc := dedupv1.NewDedupClient(cc)
	// One call at a time: one entry each. The same IDs every time, so the
	// store (and a snapshot) stays small while the log grows.
	for range 40 {
		if _, err := dc.Mark(ctx, &dedupv1.MarkRequest{Namespace: "big", Items: markItems("same", 50, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	var logBytes, entries, snapIndex float64
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, metrics, err := httpGet(ctx, "http://"+ports[2]+"/metrics")
		if err == nil {
			for _, l := range strings.Split(metrics, "\n") {
				fmt.Sscanf(l, "dedup_raft_log_bytes %g", &logBytes)
				fmt.Sscanf(l, "dedup_raft_log_entries %g", &entries)
				fmt.Sscanf(l, "dedup_raft_last_snapshot_index %g", &snapIndex)
			}
			if logBytes > 0 && logBytes <= maxLog && snapIndex > 0 {
				t.Logf("log of %.0f entries, %.0f bytes; snapshot at %.0f", entries, logBytes, snapIndex)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("log of %.0f entries, %.0f bytes, snapshot at %.0f after 8 MiB of entries with --raft-log-max-bytes 1MiB (err %v)\n%s", entries, logBytes, snapIndex, err, cl.tail(n))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
