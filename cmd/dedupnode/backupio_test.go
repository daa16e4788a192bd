package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// TestBackupToStdoutRestoreFromStdin: 'backup --out -' writes the backup
// to stdout and what it says about it to stderr (it wrote a file named
// "-"); 'restore --from -' seeds a data dir from stdin. A restore of a
// truncated backup, from a file or from stdin, exits 1 and leaves the
// data dir as it was, absent or empty (it left the ID store it had
// written, tens of MB).
func TestBackupToStdoutRestoreFromStdin(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := startDev(t, "--nodes", "1")
	ids := make([]string, 200)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%03d", i)
	}
	if code, _, errb := runCLI(t, ctx, strings.Join(ids, "\n"), "mark", "--addr", src, "--namespace", "events", "-"); code != 0 {
		t.Fatalf("mark: %s", errb)
	}

	code, backup, errb := runCLI(t, ctx, "", "backup", "--addr", src, "--out", "-")
	if code != 0 {
		t.Fatalf("backup --out -: exit %d, stderr %q", code, errb)
	}
	if _, err := os.Stat("-"); !os.IsNotExist(err) {
		t.Fatalf("backup --out - wrote a file named -")
	}
	if _, err := fsm.ParseSnapshotHeader([]byte(backup)); err != nil {
		t.Fatalf("stdout is not a backup: %v (%d bytes, stderr %q)", err, len(backup), errb)
	}
	if want := fmt.Sprintf("wrote stdout (%d bytes, state as of Raft index ", len(backup)); !strings.HasPrefix(errb, want) {
		t.Fatalf("stderr %q, want it to start %q", errb, want)
	}

	dir := filepath.Join(t.TempDir(), "r1")
	code, out, errb := runCLI(t, ctx, backup, "restore", "--from", "-", "--node-id", "r1", "--data-dir", dir, "--raft-addr", "127.0.0.1:7000")
	if code != 0 || !strings.Contains(out, "restored stdin into "+dir) || !strings.Contains(out, "records: 200 restored") {
		t.Fatalf("restore --from -: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	if !hasState(dir) {
		t.Fatalf("restore --from - left no Raft state in %s", dir)
	}

	truncated := filepath.Join(t.TempDir(), "truncated.snap")
	if err := os.WriteFile(truncated, []byte(backup[:len(backup)/2]), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, from, stdin string
		exists            bool
	}{
		{"file into a new dir", truncated, "", false},
		{"file into an empty dir", truncated, "", true},
		{"stdin into a new dir", "-", backup[:len(backup)/2], false},
		{"stdin into an empty dir", "-", backup[:len(backup)/2], true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data", "r2")
			if c.exists {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			code, out, errb := runCLI(t, ctx, c.stdin, "restore", "--from", c.from, "--node-id", "r2", "--data-dir", dir, "--raft-addr", "127.0.0.1:7000")
			if code != exitError || !strings.Contains(errb, dir+" is as it was") {
				t.Fatalf("restore of a truncated backup: exit %d, stdout %q, stderr %q; want exit 1 saying the data dir is as it was", code, out, errb)
			}
			assertOneLine(t, errb)
			if !c.exists {
				if _, err := os.Stat(filepath.Dir(dir)); !os.IsNotExist(err) {
					t.Fatalf("%s was created and left behind (%v)", filepath.Dir(dir), err)
				}
				return
			}
			ents, err := os.ReadDir(dir)
			if err != nil || len(ents) != 0 {
				t.Fatalf("%s holds %v after the failed restore (%v), want it empty", dir, ents, err)
			}
		})
	}
}
