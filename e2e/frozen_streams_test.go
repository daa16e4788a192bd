package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cliWithin runs the binary with args and reports whether it exited before
// within passed (it is killed then): a bound on hangs, not a timing
// assertion — the commands under test should end in seconds.
func cliWithin(t *testing.T, bin string, within time.Duration, args ...string) (code int, stdout, stderr string, exited bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		return -1, out.String(), errb.String(), false
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String(), true
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String(), true
	}
	t.Fatalf("run %v: %v", args, err)
	return
}

// backup and export against a frozen node fail within their --timeout (a
// bound on the wait for data, not on the stream), naming the node and
// what to do; before, both waited forever and ignored --timeout.
func TestBackupAndExportFromFrozenNodeFailNamingIt(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 3)
	cl.startAll()
	lid := cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	if code, _, errb := cli(t, bin, "", "mark", "--addr", strings.Join(cl.addrs(), ","), "a", "b", "c"); code != 0 {
		t.Fatalf("mark: exit %d: %s", code, errb)
	}
	var frozen *node
	for _, n := range cl.nodes {
		if n.id != lid {
			frozen = n
			break
		}
	}
	freeze(t, frozen)
	dir := t.TempDir()

	// Generous: the commands end about --timeout (3 s) after they start.
	const bound = 45 * time.Second
	for _, args := range [][]string{
		{"backup", "--addr", frozen.grpc, "--timeout", "3s", "--out", filepath.Join(dir, "y.snap")},
		{"export", "--addr", frozen.grpc, "--timeout", "3s", "-n", "default", "--out", filepath.Join(dir, "z.ndjson")},
	} {
		code, _, errb, exited := cliWithin(t, bin, bound, args...)
		if !exited {
			t.Fatalf("%s --addr <frozen %s> --timeout 3s still running after %v; stderr %q", args[0], frozen.id, bound, errb)
		}
		t.Logf("%s: exit %d: %s", args[0], code, errb)
		if code != 1 || !strings.Contains(errb, frozen.grpc) || !strings.Contains(errb, "--timeout 3s") || !strings.Contains(errb, "another node with --addr") {
			t.Fatalf("%s: exit %d, stderr %q; want exit 1 naming %s, --timeout 3s and another node with --addr", args[0], code, errb, frozen.grpc)
		}
	}
	// The flag is documented, with what it bounds.
	_, out, _ := cli(t, bin, "", "backup", "--help")
	if !strings.Contains(out, "--timeout") || !strings.Contains(out, "each wait for the next chunk") {
		t.Fatalf("backup --help does not say what --timeout bounds:\n%s", out)
	}

	// A live node as --addr: the backup completes.
	var live *node
	for _, n := range cl.nodes {
		if n != frozen {
			live = n
			break
		}
	}
	code, _, errb, exited := cliWithin(t, bin, bound, "backup", "--addr", live.grpc, "--timeout", "10s", "--out", filepath.Join(dir, "ok.snap"))
	if !exited || code != 0 {
		t.Fatalf("backup from live %s: exited=%v code %d: %s", live.id, exited, code, errb)
	}
}

// transfer-leader to a frozen voter fails saying the target did not catch
// up and take over in time, that the leader still leads and what to do;
// before, it said only "leadership transfer timeout".
func TestTransferLeaderToFrozenNodeSaysWhatFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 3)
	cl.startAll()
	lid := cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	var frozen *node
	for _, n := range cl.nodes {
		if n.id != lid {
			frozen = n
			break
		}
	}
	freeze(t, frozen)
	code, _, errb, exited := cliWithin(t, bin, 90*time.Second, "transfer-leader", "--addr", cl.byID(lid).grpc, "--timeout", "30s", frozen.id)
	if !exited {
		t.Fatalf("transfer-leader to frozen %s still running after 90s", frozen.id)
	}
	t.Logf("transfer-leader %s: exit %d: %s", frozen.id, code, errb)
	for _, want := range []string{frozen.id + " did not catch up and take over", lid + " still leads", "dedupnode members"} {
		if code != 1 || !strings.Contains(errb, want) {
			t.Fatalf("transfer-leader to frozen %s: exit %d, stderr %q; want exit 1 and %q", frozen.id, code, errb, want)
		}
	}
}
