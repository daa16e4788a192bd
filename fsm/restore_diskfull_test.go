package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// restoreWithin runs a restore of stream into h and returns its error, or
// fails the test when it has not returned within five minutes (a flush
// that Pebble retries forever; a restore of these streams takes seconds,
// more on two loaded cores under -race).
func restoreWithin(t *testing.T, h *harness, stream []byte) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.f.Restore(io.NopCloser(bytes.NewReader(stream))) }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Minute):
		t.Fatal("restore did not return within 5 minutes")
		return nil
	}
}

// A snapshot restore whose scratch database cannot be written (its
// sstables fail with ENOSPC, as on a full disk) fails with that error and
// keeps the current state, instead of waiting forever on a flush Pebble
// retries at once for as long as it fails (2,250 "background error" lines
// a minute at 100 % CPU on a joining node, then a crash in rotateWAL).
func TestRestore_ScratchWriteFailureAbortsAndKeepsState(t *testing.T) {
	full := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.Contains(op.Path, "db.restore") && strings.HasSuffix(op.Path, ".sst") {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	cfg := Config{
		Bloom:   bloom.Config{ExpectedPerBucket: 1000},
		Storage: storage.Options{MemTableBytes: 2 << 20, FS: errorfs.Wrap(vfs.Default, full)},
	}
	dst := newHarnessConfig(t, cfg)
	src := newHarness(t)
	for i := range 2000 {
		src.mark(t0, fmt.Sprint("s", i), 60_000)
		if i%4 == 0 {
			dst.mark(t0, fmt.Sprint("d", i), 60_000)
		}
	}
	before, err := dst.f.DigestState(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	err = restoreWithin(t, dst, snapshotStream(t, src).Bytes())
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("restore onto a disk that fails sstable writes: %v, want ENOSPC", err)
	}
	after, err := dst.f.DigestState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after.Digest, before.Digest) || after.AppliedIndex != before.AppliedIndex {
		t.Fatalf("state after the failed restore: %x at %d, want the previous %x at %d", after.Digest, after.AppliedIndex, before.Digest, before.AppliedIndex)
	}
	wantCode(t, "own ID after the failed restore", dst.check(t0, "d0"), CodeSeen)
	if _, err := os.Stat(filepath.Join(dst.dir, "db.restore")); !os.IsNotExist(err) {
		t.Fatalf("scratch database after the failed restore: %v, want it removed", err)
	}
}

// Restore asks RestoreRoom before it creates the scratch database and
// before every write to it, with the bytes about to be written, and fails
// with its answer, keeping the current state.
func TestRestore_StopsWhenRestoreRoomRefuses(t *testing.T) {
	src := newHarness(t)
	for from := 0; from < 60_000; from += 1000 { // ≈ 9 MB of stream: three 4 MiB batches
		ids := make([]string, 0, 1000)
		for i := from; i < from+1000; i++ {
			ids = append(ids, fmt.Sprintf("id-%06d-%s", i, strings.Repeat("x", 80)))
		}
		src.markMany(t0, 60_000, ids)
	}
	stream := snapshotStream(t, src).Bytes()
	var asked []uint64
	noRoom := errors.New("no room")
	dst := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 1000}, RestoreRoom: func(need uint64) error {
		asked = append(asked, need)
		if len(asked) == 3 {
			return noRoom
		}
		return nil
	}})
	dst.mark(t0, "mine", 60_000)
	if err := restoreWithin(t, dst, stream); !errors.Is(err, noRoom) {
		t.Fatalf("restore: %v, want RestoreRoom's error", err)
	}
	if asked[0] != 0 || asked[1] < 4<<20 || asked[2] < 4<<20 {
		t.Fatalf("RestoreRoom asked for %v: want 0 before opening, then at least each 4 MiB batch", asked)
	}
	wantCode(t, "own ID after the refused restore", dst.check(t0, "mine"), CodeSeen)
	if _, err := os.Stat(filepath.Join(dst.dir, "db.restore")); !os.IsNotExist(err) {
		t.Fatalf("scratch database after the refused restore: %v, want it removed", err)
	}
	// With room, the same stream restores.
	asked = asked[:0]
	dst.f.cfg.RestoreRoom = func(uint64) error { return nil }
	if err := restoreWithin(t, dst, stream); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "restored ID", dst.check(t0, "id-000001-"+strings.Repeat("x", 80)), CodeSeen)
}
