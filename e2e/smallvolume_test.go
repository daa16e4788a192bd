package e2e

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// On a 64 MiB volume the automatic --min-free-disk (64 MiB with an empty
// store, writes resuming at 68 MiB) can never be met: serve refuses at
// once, in one line naming the flag, as it does a fixed size the volume
// cannot have free; the fixed sizes it suggests instead start a node that
// takes writes. Before, serve started and refused every write.
func TestSmallVolume_ServeRefusesMinFreeDiskItCanNeverMeet(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	fs := mountTmpfs(t, 64<<20)
	ports := freePorts(t, 2)
	base := []string{"serve", "--node-id", "d1", "--data-dir", filepath.Join(fs, "d1"), "--raft-addr", ports[0], "--grpc-addr", ports[1], "--bootstrap"}

	var suggested string
	for _, extra := range [][]string{nil, {"--min-free-disk", "60MiB"}} {
		code, _, errb, exited := cliWithin(t, bin, 60*time.Second, append(base, extra...)...)
		if !exited {
			t.Fatalf("serve %v on a 64 MiB volume is running (it never takes a write); want it refused", extra)
		}
		t.Logf("serve %v: exit %d: %s", extra, code, errb)
		if code != 2 || strings.Count(strings.TrimSpace(errb), "\n") != 0 || !strings.Contains(errb, "--min-free-disk") || !strings.Contains(errb, "never take a write") {
			t.Fatalf("serve %v on a 64 MiB volume: exit %d, stderr %q; want exit 2 and one line naming --min-free-disk", extra, code, errb)
		}
		m := regexp.MustCompile(`fixed --min-free-disk from [0-9.]+ MiB to ([0-9.]+) MiB`).FindStringSubmatch(errb)
		if m == nil {
			t.Fatalf("no fixed --min-free-disk suggested: %q", errb)
		}
		suggested = m[1] + "MiB"
	}

	// The largest suggested size fits: the node takes a write.
	cl := &cluster{t: t, bin: bin, args: []string{"--bootstrap"}}
	n := &node{id: "d1", raft: ports[0], grpc: ports[1], dir: filepath.Join(fs, "d1"), logPath: filepath.Join(t.TempDir(), "d1.log")}
	cl.nodes = []*node{n}
	cl.start(n, "--min-free-disk", suggested)
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	if code, _, errb := cli(t, bin, "", "mark", "--addr", n.grpc, "--timeout", "30s", "x"); code != 0 {
		cl.dumpLogs()
		t.Fatalf("mark on a node with --min-free-disk %s: exit %d: %s", suggested, code, errb)
	}
}
