package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"
)

// fullDisk is raft-wal's file system with a switch that makes creating a
// segment fail the way a full disk does: the file is created, then its
// preallocation fails with ENOSPC and the file stays behind, empty (as
// fs.FS leaves it on a full disk).
type fullDisk struct {
	types.VFS
	full    atomic.Bool
	refused atomic.Int32
}

func (d *fullDisk) Create(dir, name string, size uint64) (types.WritableFile, error) {
	if d.full.Load() {
		d.refused.Add(1)
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			return nil, err
		}
		f.Close()
		return nil, fmt.Errorf("preallocate %s: %w", name, syscall.ENOSPC)
	}
	return d.VFS.Create(dir, name, size)
}

func entries(from, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	for i := range logs {
		logs[i] = &raft.Log{Index: uint64(from + i), Term: 1, Type: raft.LogCommand, Data: make([]byte, 1024)}
	}
	return logs
}

// A disk that is full when a segment fills makes raft-wal's rotation fail;
// raft-wal alone would refuse every later append until a restart. The
// store fails the appends while the disk is full, goes on by itself once
// space is back, and keeps every entry, across a reopen from disk too.
func TestWALStore_AppendsResumeAfterARotationFailedOnAFullDisk(t *testing.T) {
	dir := t.TempDir()
	disk := &fullDisk{VFS: fs.New()}
	const segment = 64 << 10 // 1 KiB entries: a rotation every ~60 appends
	open := func() *walStore {
		s, err := openWALStore(dir, segment, hclog.NewNullLogger(), disk)
		if err != nil {
			t.Fatal(err)
		}
		s.room = func() bool { return !disk.full.Load() }
		return s
	}
	s := open()
	next := 1
	for ; next <= 40; next++ {
		if err := s.StoreLogs(entries(next, 1)); err != nil {
			t.Fatalf("append %d on a disk with room: %v", next, err)
		}
	}

	disk.full.Store(true)
	var failed int
	for tries := 0; failed == 0 && tries < 200; tries++ {
		if err := s.StoreLogs(entries(next, 1)); err != nil {
			failed = next
			t.Logf("append %d with the disk full: %v", next, err)
			break
		}
		next++
	}
	if failed == 0 || disk.refused.Load() == 0 {
		t.Fatalf("no segment rotation met the full disk (appended up to %d, %d creations refused)", next-1, disk.refused.Load())
	}
	// While the disk stays full, appends keep failing and reads go on.
	if err := s.StoreLogs(entries(next, 1)); err == nil {
		t.Fatal("an append succeeded with the disk still full")
	}
	var l raft.Log
	if last, err := s.LastIndex(); err != nil || last != uint64(next-1) {
		t.Fatalf("last index while the disk is full: %d, %v; want %d", last, err, next-1)
	}
	if err := s.GetLog(1, &l); err != nil {
		t.Fatalf("read while the disk is full: %v", err)
	}
	// A snapshot's head truncation now would persist raft-wal's stale view
	// of the segments over the meta store that lists the new one: refused.
	if err := s.DeleteRange(1, 10); err == nil {
		t.Fatal("a head truncation went through while the log was wedged")
	}

	// The failed creation left the new segment's file empty. Had it left
	// nothing, the reopen would create it, and with the disk still full
	// (but said to have room) fail: then the log is closed and every call
	// fails until an append reopens it with space back.
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) == 0 {
		t.Fatal("no segment files")
	}
	orphan := segs[len(segs)-1]
	if fi, err := os.Stat(orphan); err != nil || fi.Size() != 0 {
		t.Fatalf("the newest segment %s should be the empty file of the failed creation: %v", orphan, err)
	}
	if err := os.Remove(orphan); err != nil {
		t.Fatal(err)
	}
	s.room = func() bool { return true }
	if err := s.StoreLogs(entries(next, 1)); err == nil {
		t.Fatal("an append succeeded while the segment could not be created")
	}
	if _, err := s.LastIndex(); err == nil {
		t.Fatal("the log answered although its reopen failed")
	}
	disk.full.Store(false)
	s.room = func() bool { return !disk.full.Load() }
	for i := 0; i < 200; i++ { // across several more rotations
		if err := s.StoreLogs(entries(next, 1)); err != nil {
			t.Fatalf("append %d after space came back: %v", next, err)
		}
		next++
	}
	check := func(s *walStore, when string, from uint64) {
		t.Helper()
		first, err1 := s.FirstIndex()
		last, err2 := s.LastIndex()
		if err1 != nil || err2 != nil || first != from || last != uint64(next-1) {
			t.Fatalf("%s: entries %d..%d (%v, %v), want %d..%d", when, first, last, err1, err2, from, next-1)
		}
		for i := from; i < uint64(next); i++ {
			var l raft.Log
			if err := s.GetLog(i, &l); err != nil || l.Index != i || len(l.Data) != 1024 {
				t.Fatalf("%s: entry %d: %v (index %d, %d bytes)", when, i, err, l.Index, len(l.Data))
			}
		}
	}
	check(s, "after space came back", 1)
	if err := s.DeleteRange(1, 10); err != nil {
		t.Fatalf("head truncation once the log is reopened: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(next, 1)); err == nil {
		t.Fatal("an append succeeded on a closed log")
	}
	s = open()
	defer s.Close()
	check(s, "reopened from disk", 11)
}
