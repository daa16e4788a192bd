package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

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

// fillLeaving writes zeros to path until the filesystem holding it has
// about leave bytes free.
func fillLeaving(t *testing.T, path string, leave uint64) {
	t.Helper()
	free, _, err := diskspace.Free(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if free <= leave {
		t.Fatalf("only %d bytes free, cannot leave %d", free, leave)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := free - leave; n > 0; {
		k := min(n, uint64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
}

// A snapshot restore on a node whose disk cannot hold the restored
// database fails with a *diskspace.RoomError before Pebble meets ENOSPC,
// and the node keeps its state and runs on. A joining node on a volume too
// small for the leader's snapshot used to log thousands of "background
// error: write .../fsm/db.restore/...sst: no space left on device" at
// 100 % CPU and die with "sync: unlock of unlocked mutex" in Pebble's
// rotateWAL.
func TestRestore_TooLittleDiskFailsCleanly(t *testing.T) {
	// The stream: about 9 MB of IDs from another FSM, on the ordinary disk.
	src, err := fsm.New(fsm.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var ops []fsm.Op
	for i := range 60_000 {
		ops = append(ops, fsm.Op{Kind: fsm.OpMark, DurationMs: 3_600_000,
			Items: []fsm.Item{{ID: []byte(fmt.Sprintf("src-%06d-%s", i, strings.Repeat("x", 80)))}}})
	}
	applyOps(t, src, ops)
	stream := fsmStream(t, src)

	mnt := mountTmpfs(t, 64<<20)
	cfg := testConfig(filepath.Join(mnt, "data"), true)
	cfg.FSM.Storage.MemTableBytes = 2 << 20 // reserve 8.2 MiB
	cfg.MinFreeDisk = MinFreeDiskFloor(cfg.FSM.Storage.MemTableBytes, LogStoreWAL)
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, []fsm.Op{markOp("mine")}); err != nil {
		t.Fatal(err)
	}
	// 10 MiB free: above the reserve, below the reserve plus one 4 MiB
	// batch of the restore.
	fillLeaving(t, filepath.Join(mnt, "fill"), 10<<20)

	done := make(chan error, 1)
	go func() { done <- n.FSM().Restore(io.NopCloser(bytes.NewReader(stream))) }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("restore onto a nearly full disk did not return within 60 s")
	}
	var room *diskspace.RoomError
	if !errors.As(err, &room) || !errors.Is(err, ErrLowDiskSpace) {
		t.Fatalf("restore onto a nearly full disk: %v, want a *diskspace.RoomError", err)
	}
	t.Logf("refused: %v", err)
	res, err := n.FSM().Check("", [][]byte{[]byte("mine")}, n.FSM().LastTimestamp())
	if err != nil || res[0].Code != fsm.CodeSeen {
		t.Fatalf("own ID after the refused restore: %v %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "fsm", "db.restore")); !os.IsNotExist(err) {
		t.Fatalf("scratch database after the refused restore: %v, want it removed", err)
	}
	if err := os.Remove(filepath.Join(mnt, "fill")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the disk guard to see the space back", func() bool { return !n.Disk().Low })
	if _, err := n.Propose(ctx, []fsm.Op{markOp("after")}); err != nil {
		t.Fatalf("write after space came back: %v", err)
	}
}

// applyOps applies ops to f as one Raft entry per 5,000 ops.
func applyOps(t *testing.T, f *fsm.FSM, ops []fsm.Op) {
	t.Helper()
	idx := f.AppliedIndex()
	for len(ops) > 0 {
		k := min(len(ops), 5000)
		idx++
		cmd := fsm.Command{TimestampMs: time.Now().UnixMilli(), Ops: ops[:k]}
		f.ApplyBatch([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: fsm.AppendCommand(nil, &cmd)}})
		ops = ops[k:]
	}
}

// fsmStream is f's snapshot stream, as raft would send it.
func fsmStream(t *testing.T, f *fsm.FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	dir := t.TempDir()
	store, err := raft.NewFileSnapshotStoreWithLogger(dir, 1, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	sink := createSnapshot(t, store, f.AppliedIndex())
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	_, rc, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
