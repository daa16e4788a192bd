package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// mountTmpfs mounts a tmpfs of size bytes (root only: the test skips
// where mounting is not permitted) and unmounts it at cleanup.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs for the data dir")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Logf("unmount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes zeros to path until the filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	// The last partial page: fill it byte by byte in small writes.
	small := make([]byte, 512)
	for {
		if _, err := f.Write(small); err != nil {
			break
		}
	}
}

// treeState lists every file under dir with its size and modification
// time, to show that nothing was written.
func treeState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s\n", strings.TrimPrefix(p, dir), fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A node restarted on a full data volume refuses to start with a
// *diskspace.RoomError naming the data dir, its free space and the floor,
// and writes nothing: Pebble's open would replay its WAL, flush it and
// panic on the failed MANIFEST write ("pebble: MANIFEST flush failed: ...
// no space left on device"). Once space is freed it starts and holds every
// entry committed before.
func TestNew_FullDiskRefusesToStartAndWritesNothing(t *testing.T) {
	mnt := mountTmpfs(t, 64<<20)
	dir := filepath.Join(mnt, "data")
	cfg := testConfig(dir, true)
	cfg.FSM.Storage.MemTableBytes = 2 << 20 // reserve 8.2 MiB, floor 24.2 MiB with wal
	cfg.MinFreeDisk = MinFreeDiskFloor(cfg.FSM.Storage.MemTableBytes, LogStoreWAL)
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([][]byte, 200)
	for i := range ids {
		ids[i] = []byte(fmt.Sprintf("id-%03d", i))
		if _, err := n.Propose(ctx, []fsm.Op{markOp(string(ids[i]))}); err != nil {
			t.Fatal(err)
		}
	}
	stopNode(t, n)

	fill := filepath.Join(mnt, "fill")
	fillDisk(t, fill)
	before := treeState(t, dir)
	// Before the check, New never returned here: Pebble's open waited for
	// a flush that failed with ENOSPC and was retried at once, forever
	// (or panicked when the sstable fit and the MANIFEST did not).
	done := make(chan error, 1)
	go func() {
		n, err := New(cfg)
		if err == nil {
			_ = n.Shutdown(context.Background())
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("New on a full disk did not return within 60 s")
	}
	var room *diskspace.RoomError
	if !errors.As(err, &room) || !errors.Is(err, ErrLowDiskSpace) {
		t.Fatalf("start on a full disk: %v, want a *diskspace.RoomError", err)
	}
	floor := MinFreeDiskFloor(cfg.FSM.Storage.MemTableBytes, LogStoreWAL)
	if room.Path != dir || room.Need != floor || room.Free >= floor {
		t.Fatalf("RoomError %+v: want path %s, need %d (the floor), free below it", room, dir, floor)
	}
	for _, want := range []string{dir, diskspace.Bytes(room.Free) + " free", diskspace.Bytes(floor)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	if after := treeState(t, dir); after != before {
		t.Fatalf("refused start changed the data dir:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	n2 := startNode(t, cfg)
	res, err := n2.FSM().Check("", ids, n2.FSM().LastTimestamp())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Code != fsm.CodeSeen {
			t.Fatalf("%s after the restart with room: %v", ids[i], r.Code)
		}
	}
}
