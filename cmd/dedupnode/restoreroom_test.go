package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/diskspace"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// A backup restored onto a volume too small for it is refused before
// anything is written, in one line naming the backup's size, the free
// space, the --min-free-disk reserve and what to do. Before the check,
// the restore wrote the ID store, then failed part way through the Raft
// snapshot (no space left on device) and left both behind.
func TestRestore_RefusesAVolumeTooSmallUpFront(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs for the data dir")
	}
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := startDev(t, "--nodes", "1")
	c := testcluster.Client(t, []string{src})
	for b := range 5 {
		items := make([]client.Item, 10_000)
		for i := range items {
			items[i].ID = []byte(fmt.Sprintf("restore-room-%d-%05d-padding-padding", b, i))
		}
		if _, err := c.Mark(ctx, "", items, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The client's Backup, not the CLI's: the CLI's progress bar
	// (schollz/progressbar) races with itself under -race on a backup
	// this large.
	file := filepath.Join(t.TempDir(), "dedup.snap")
	var buf bytes.Buffer
	if _, err := c.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	size := uint64(buf.Len())
	t.Logf("backup: %s", diskspace.Bytes(size))

	// A volume one and a half times the backup: the ID store fits, the
	// Raft snapshot of the seeded state does not.
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size*3/2), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Logf("unmount %s: %v: %s", mnt, err, out)
		}
	})
	dir := filepath.Join(mnt, "r1")
	code, out, errb := runCLI(t, ctx, "", "restore", "--from", file, "--node-id", "r1", "--data-dir", dir,
		"--raft-addr", "127.0.0.1:1", "--min-free-disk", "1MiB")
	t.Logf("refusal: %s", errb)
	if code != exitError || out != "" || strings.Count(errb, "\n") != 1 {
		t.Fatalf("restore onto %s free: exit %d, stdout %q, stderr %q; want exit %d and one line", diskspace.Bytes(size*3/2), code, out, errb, exitError)
	}
	for _, want := range []string{"restoring a backup of " + diskspace.Bytes(size), dir, "MiB free", "Raft snapshot " + diskspace.Bytes(size),
		"reserve", "--min-free-disk", "larger volume", "nothing was written"} {
		if !strings.Contains(errb, want) {
			t.Errorf("refusal %q lacks %q", errb, want)
		}
	}
	if ents, err := os.ReadDir(mnt); err != nil || len(ents) != 0 {
		t.Errorf("refused restore left %v in the volume (%v)", ents, err)
	}
}
