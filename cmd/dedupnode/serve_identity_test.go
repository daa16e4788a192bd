package main

import (
	"bufio"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// running is a dev or serve command running in process until stop.
type running struct {
	out, errs *syncBuffer
	cancel    context.CancelFunc
	done      chan int
}

func startCmd(args ...string) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{out: &syncBuffer{}, errs: &syncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() { r.done <- run(ctx, args, strings.NewReader(""), r.out, r.errs) }()
	return r
}

// stop cancels the command and waits (60 s at most) for its exit code.
func (r *running) stop(t *testing.T) int {
	t.Helper()
	r.cancel()
	select {
	case code := <-r.done:
		r.done <- code // a second stop (cleanup) gets it too
		return code
	case <-time.After(60 * time.Second):
		t.Fatalf("command did not stop within 60s of cancel; stderr %q", r.errs.String())
		return -1
	}
}

// wait polls found (a stdout line such as dev's "addrs: ", a log line
// on stderr) for up to 60 s and returns what it found.
func (r *running) wait(t *testing.T, what string, found func() (string, bool)) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if s, ok := found(); ok {
			return s
		}
		select {
		case code := <-r.done:
			r.done <- code
			t.Fatalf("exited %d before %s: stdout %q stderr %q", code, what, r.out.String(), r.errs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no %s within 60s; stdout %q stderr %q", what, r.out.String(), r.errs.String())
	return ""
}

func (r *running) addrs(t *testing.T) string {
	t.Helper()
	return r.wait(t, "addrs line", func() (string, bool) {
		sc := bufio.NewScanner(strings.NewReader(r.out.String()))
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "addrs: "); ok {
				return a, true
			}
		}
		return "", false
	})
}

// TestServeRefusesAnotherNodesDataDir: serve with --node-id n9 on n3's
// data dir exits 1 with one line naming the data dir, the recorded ID and
// the flag, instead of serving as a member nobody writes to.
func TestServeRefusesAnotherNodesDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n3")
	r := startCmd("serve", "--node-id", "n3", "--data-dir", dir, "--bootstrap",
		"--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-level", "info")
	t.Cleanup(func() { r.stop(t) })
	r.wait(t, "serving log line", func() (string, bool) {
		return "", strings.Contains(r.errs.String(), "dedupnode serving")
	})
	if code := r.stop(t); code != 0 {
		t.Fatalf("n3 exited %d: %s", code, r.errs.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, _, errs := runCLI(t, ctx, "", "serve", "--node-id", "n9", "--data-dir", dir,
		"--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
	want := "data dir " + dir + ` belongs to node "n3" (recorded at first start), not "n9": start it with --node-id n3, or use an empty --data-dir for a new node`
	if code != exitError || !strings.Contains(errs, want) {
		t.Fatalf("serve n9 on n3's data dir: exit %d, stderr %q; want exit %d with %q", code, errs, exitError, want)
	}
	assertOneLine(t, errs)

	// D7: with a --peers list that lacks n9 (the list of n3's cluster),
	// whose own error came first, the data dir's owner is still what is
	// said, and no "--peers is ignored" warning precedes it.
	code, _, errs = runCLI(t, ctx, "", "serve", "--node-id", "n9", "--data-dir", dir,
		"--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--peers", "n1=127.0.0.1:1=127.0.0.1:2,n3=127.0.0.1:3=127.0.0.1:4")
	if code != exitError || !strings.Contains(errs, want) || strings.Contains(errs, "ignored") {
		t.Fatalf("serve n9 with --peers on n3's data dir: exit %d, stderr %q; want exit %d with only %q", code, errs, exitError, want)
	}
	assertOneLine(t, errs)
}
