package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
)

// Whole-state readers (DigestState, Digest, Snapshot) running while a
// restore swaps the database in either finish on the old database or are
// refused with ErrRestoring; none reads a closed database (Pebble panics on
// that). Restore waits for pinned snapshots outside f.mu, so a reader that
// pinned after that wait used to race with the close.
func TestWholeStateReadersDuringRestore(t *testing.T) {
	src, dst := newHarness(t), newHarness(t)
	for i := range 3000 {
		src.mark(t0, fmt.Sprint("s", i), 60_000)
		if i%3 == 0 {
			dst.mark(t0, fmt.Sprint("d", i), 60_000)
		}
	}
	stream := snapshotStream(t, src)
	want, err := src.f.DigestState(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served, refused atomic.Int64
	reader := func(read func() error) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			switch err := read(); {
			case err == nil:
				served.Add(1)
			case errors.Is(err, ErrRestoring):
				refused.Add(1)
			default:
				t.Error(err)
				return
			}
		}
	}
	wg.Add(3)
	go reader(func() error { _, err := dst.f.DigestState(context.Background()); return err })
	go reader(func() error { _, err := dst.f.Digest(); return err })
	go reader(func() error {
		s, err := dst.f.Snapshot()
		if err == nil {
			s.Release()
		}
		return err
	})
	for range 5 {
		if err := dst.f.Restore(io.NopCloser(bytes.NewReader(stream.Bytes()))); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	got, err := dst.f.DigestState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Digest, want.Digest) || got.AppliedIndex != want.AppliedIndex {
		t.Fatalf("after restore: digest %x at %d, want %x at %d", got.Digest, got.AppliedIndex, want.Digest, want.AppliedIndex)
	}
	t.Logf("%d whole-state reads served, %d refused during 5 restores", served.Load(), refused.Load())
}

// WalkSnapshot and ParseSnapshotHeader read what Snapshot writes: the
// header's index and term, and every key Restore would load; a stream that
// is not a snapshot is refused with ErrBadSnapshot.
func TestWalkSnapshotReadsWhatSnapshotWrites(t *testing.T) {
	h := newHarness(t)
	for i := range 500 {
		h.mark(t0, fmt.Sprint("w", i), 60_000)
	}
	stream := snapshotStream(t, h)
	hdr, err := ParseSnapshotHeader(stream.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Index != h.f.AppliedIndex() || hdr.Index == 0 {
		t.Fatalf("header index %d, applied %d", hdr.Index, h.f.AppliedIndex())
	}
	var keys int
	walked, err := WalkSnapshot(bytes.NewReader(stream.Bytes()), func(k, v []byte) error {
		keys++
		return nil
	})
	if err != nil || walked != hdr {
		t.Fatalf("walk: header %+v, err %v; want %+v", walked, err, hdr)
	}
	d, err := h.f.DigestState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if uint64(keys) != d.Keys {
		t.Fatalf("walked %d keys, the state has %d", keys, d.Keys)
	}
	stop := errors.New("stop")
	if _, err := WalkSnapshot(bytes.NewReader(stream.Bytes()), func(k, v []byte) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn's error: got %v", err)
	}
	for _, bad := range [][]byte{[]byte("short"), append([]byte("NOTSNAP!"), make([]byte, 16)...)} {
		if _, err := ParseSnapshotHeader(bad); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("ParseSnapshotHeader(%q): %v, want ErrBadSnapshot", bad, err)
		}
		if _, err := WalkSnapshot(bytes.NewReader(bad), func(k, v []byte) error { return nil }); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("WalkSnapshot(%q): %v, want ErrBadSnapshot", bad, err)
		}
	}
}

// snapshotStream is the snapshot stream of h's state.
func snapshotStream(t *testing.T, h *harness) *bytes.Buffer {
	t.Helper()
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var stream bytes.Buffer
	if err := snap.(*snapshot).writeStream(&stream); err != nil {
		t.Fatal(err)
	}
	return &stream
}
