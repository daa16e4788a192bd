package fsm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/storage"
)

// Snapshot stream format:
//
//	magic "DDNSNAP2" | applied index (8, BE) | applied term (8, BE)
//	entry*: uvarint key length (>0) | key | uvarint value length | value
//	uvarint 0 (end of entries)
//	entry count (8, BE) | SHA-256 of every preceding byte (32)
//
// The entries are the database's keys and values, so the magic names the
// key layout: "DDNSNAP1" streams (versions before write windows) hold
// legacy record keys only and are still restored; "DDNSNAP2" streams may
// hold windowed record keys, which a version that writes DDNSNAP1 would
// not read, so it refuses them by their magic (a node left on the old
// version during a rolling upgrade stays behind rather than losing
// records; docs/OPERATIONS.md).
const (
	snapshotMagic       = "DDNSNAP2"
	snapshotMagicLegacy = "DDNSNAP1"
)

// ErrBadSnapshot is returned by Restore for a stream that is truncated, has
// a wrong checksum or is otherwise malformed. The FSM is left untouched.
var ErrBadSnapshot = errors.New("bad snapshot")

// Snapshot returns a consistent point-in-time view (raft.FSM). Called on the
// FSM goroutine between applies; Persist then streams it from another
// goroutine while applies continue. Before returning, it commits the write
// buffer and syncs Pebble's WAL, so every entry up to the snapshot index is
// durable in Pebble: the Raft log may then be truncated up to that index
// (see DESIGN.md).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	if f.deferred {
		return nil, ErrApplyDeferred
	}
	f.flushLocked()
	if err := f.db.LogData(nil, pebble.Sync); err != nil {
		return nil, fmt.Errorf("sync before snapshot: %w", err)
	}
	snap, err := f.pinSnapshotLocked()
	if err != nil {
		return nil, err
	}
	return &snapshot{f: f, snap: snap, index: f.st.applied, term: f.st.appliedTerm}, nil
}

// ErrRestoring is returned by the whole-state readers (Snapshot,
// DigestState, Digest) while Restore swaps a restored database in.
var ErrRestoring = errors.New("fsm: a snapshot restore is swapping the database")

// pinSnapshotLocked opens a Pebble snapshot that Close and Restore wait for
// before they close the database; the caller calls f.persistWG.Done after
// closing it. Called with f.mu held, shared or exclusive. It refuses once
// Close or a restore's swap has begun: both wait for the pinned snapshots
// outside f.mu, so one pinned after their wait would be read from a closed
// database.
func (f *FSM) pinSnapshotLocked() (*pebble.Snapshot, error) {
	switch {
	case f.closed:
		return nil, ErrClosed
	case f.swapping:
		return nil, ErrRestoring
	}
	f.persistWG.Add(1)
	return f.db.NewSnapshot(), nil
}

// pinCommitted commits the write buffer and pins a Pebble snapshot of the
// result, for a whole-state reader that runs outside f.mu (DigestState,
// CountRecords). It returns the in-memory state the snapshot matches,
// read under the same lock. The caller calls f.persistWG.Done after
// closing the snapshot.
func (f *FSM) pinCommitted() (*pebble.Snapshot, state, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && !f.swapping {
		f.flushLocked()
	}
	snap, err := f.pinSnapshotLocked()
	return snap, f.st, err
}

type snapshot struct {
	f           *FSM
	snap        *pebble.Snapshot
	index, term uint64
	released    bool
}

// Persist streams the snapshot into sink (raft.FSMSnapshot).
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.writeStream(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot at index %d: %w", s.index, err)
	}
	return sink.Close()
}

// writeStream writes the stream format to w.
func (s *snapshot) writeStream(w io.Writer) error {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)
	var hdr [SnapshotHeaderLen]byte
	copy(hdr[:8], snapshotMagic)
	binary.BigEndian.PutUint64(hdr[8:], s.index)
	binary.BigEndian.PutUint64(hdr[16:], s.term)
	bw.Write(hdr[:])
	var n uint64
	var lb [binary.MaxVarintLen64]byte
	err := scanPrefix(s.snap, nil, func(k, v []byte) error {
		bw.Write(lb[:binary.PutUvarint(lb[:], uint64(len(k)))])
		bw.Write(k)
		bw.Write(lb[:binary.PutUvarint(lb[:], uint64(len(v)))])
		_, err := bw.Write(v)
		n++
		return err
	})
	if err != nil {
		return err
	}
	bw.WriteByte(0)
	var cnt [8]byte
	binary.BigEndian.PutUint64(cnt[:], n)
	bw.Write(cnt[:])
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err = w.Write(h.Sum(nil))
	return err
}

// Release frees the Pebble snapshot (raft.FSMSnapshot).
func (s *snapshot) Release() {
	if s.released {
		return
	}
	s.released = true
	s.snap.Close()
	s.f.persistWG.Done()
}

// Restore replaces the whole state with a snapshot stream (raft.FSM). The
// stream is first written to a scratch database and verified (magic,
// entry count, SHA-256, applied index); only then is the live database
// swapped for it. On any error the FSM keeps its previous state: a snapshot
// is installed whole or not at all.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := filepath.Join(f.cfg.Dir, "db.restore")
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("restore: clear scratch dir: %w", err)
	}
	index, err := f.loadSnapshot(rc, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("restore: %w", err)
	}
	if err := f.swapIn(tmp); err != nil {
		return fmt.Errorf("restore snapshot at index %d: %w", index, err)
	}
	f.log.Info("restored snapshot", "index", index)
	return nil
}

// hashingReader hashes every byte read through it.
type hashingReader struct {
	r *bufio.Reader
	h hash.Hash
}

func (r *hashingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	return n, err
}

func (r *hashingReader) ReadByte() (byte, error) {
	b, err := r.r.ReadByte()
	if err == nil {
		r.h.Write([]byte{b})
	}
	return b, err
}

// SnapshotHeaderLen is the length of a snapshot stream's header (magic,
// applied index, applied term).
const SnapshotHeaderLen = 24

// SnapshotHeader is what a snapshot stream (a backup) starts with: the
// Raft index and term of the state it holds.
type SnapshotHeader struct {
	Index, Term uint64
}

// ParseSnapshotHeader reads the header from the first SnapshotHeaderLen
// bytes of a snapshot stream. Errors wrap ErrBadSnapshot. Other packages
// read the format only through this, WalkSnapshot and Restore.
func ParseSnapshotHeader(b []byte) (SnapshotHeader, error) {
	if len(b) < SnapshotHeaderLen {
		return SnapshotHeader{}, fmt.Errorf("%w: header of %d bytes", ErrBadSnapshot, len(b))
	}
	if m := string(b[:8]); m != snapshotMagic && m != snapshotMagicLegacy {
		return SnapshotHeader{}, fmt.Errorf("%w: magic %q", ErrBadSnapshot, b[:8])
	}
	return SnapshotHeader{Index: binary.BigEndian.Uint64(b[8:16]), Term: binary.BigEndian.Uint64(b[16:24])}, nil
}

// WalkSnapshot reads a snapshot stream from r and calls fn with every key
// and value (both valid only during the call), stopping at fn's first
// error. It returns the stream's header. It does not read the trailing
// entry count and checksum (Restore verifies them): it is meant for
// streams this process just took from its own FSM (Snapshot, Persist).
// Errors about the stream wrap ErrBadSnapshot.
func WalkSnapshot(r io.Reader, fn func(key, value []byte) error) (SnapshotHeader, error) {
	br, ok := r.(entryReader)
	if !ok {
		br = bufio.NewReaderSize(r, 1<<20)
	}
	var hdr [SnapshotHeaderLen]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return SnapshotHeader{}, fmt.Errorf("%w: header: %v", ErrBadSnapshot, err)
	}
	h, err := ParseSnapshotHeader(hdr[:])
	if err != nil {
		return h, err
	}
	_, err = readEntries(br, fn)
	return h, err
}

// entryReader is what readEntries reads from.
type entryReader interface {
	io.Reader
	io.ByteReader
}

// readEntries reads the entries of a snapshot stream up to and including
// the end marker, calling fn with each key and value (valid only during the
// call), and returns how many it read.
func readEntries(r entryReader, fn func(key, value []byte) error) (uint64, error) {
	var n uint64
	var k, v []byte
	for {
		kl, err := binary.ReadUvarint(r)
		if err != nil {
			return n, fmt.Errorf("%w: entry %d: %v", ErrBadSnapshot, n, err)
		}
		if kl == 0 {
			return n, nil
		}
		if kl > 1<<20 {
			return n, fmt.Errorf("%w: key length %d", ErrBadSnapshot, kl)
		}
		k = grow(k, int(kl))
		if _, err := io.ReadFull(r, k); err != nil {
			return n, fmt.Errorf("%w: entry %d key: %v", ErrBadSnapshot, n, err)
		}
		vl, err := binary.ReadUvarint(r)
		if err != nil || vl > 1<<24 {
			return n, fmt.Errorf("%w: entry %d value length", ErrBadSnapshot, n)
		}
		v = grow(v, int(vl))
		if _, err := io.ReadFull(r, v); err != nil {
			return n, fmt.Errorf("%w: entry %d value: %v", ErrBadSnapshot, n, err)
		}
		if err := fn(k, v); err != nil {
			return n, err
		}
		n++
	}
}

func (f *FSM) loadSnapshot(rc io.Reader, dir string) (uint64, error) {
	hr := &hashingReader{r: bufio.NewReaderSize(rc, 1<<20), h: sha256.New()}
	var hdr [SnapshotHeaderLen]byte
	if _, err := io.ReadFull(hr, hdr[:]); err != nil {
		return 0, fmt.Errorf("%w: header: %v", ErrBadSnapshot, err)
	}
	h, err := ParseSnapshotHeader(hdr[:])
	if err != nil {
		return 0, err
	}
	index, term := h.Index, h.Term
	room := f.cfg.RestoreRoom
	if room == nil {
		room = func(uint64) error { return nil }
	}
	// Opening writes (MANIFEST, OPTIONS): not on a disk already below the
	// reserve.
	if err := room(0); err != nil {
		return 0, err
	}
	// The scratch database runs without a WAL (it is flushed before the
	// swap, and a crash meanwhile discards it), and the first error of
	// its background work (a flush or compaction that hit ENOSPC, which
	// Pebble would retry forever) aborts the restore.
	bg := newFirstError()
	o := f.storageOptions()
	o.DisableWAL = true
	o.BackgroundError = bg.set
	db, err := storage.Open(dir, o)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	b := db.NewBatch()
	defer func() { b.Close() }()
	// commit writes b once the disk has room for it and for what the
	// memtables hold (the flushes to come), and Pebble's background work
	// has not failed.
	commit := func() error {
		if err := bg.get(); err != nil {
			return fmt.Errorf("write scratch database %s: %w", dir, err)
		}
		if err := room(uint64(b.Len()) + db.Metrics().MemTable.Size); err != nil {
			return err
		}
		return b.Commit(pebble.NoSync)
	}
	var sawApplied bool
	n, err := readEntries(hr, func(k, v []byte) error {
		if bytes.Equal(k, storage.MetaKey(metaApplied)) {
			ai, at, err := decodeApplied(v)
			if err != nil || ai != index || at != term {
				return fmt.Errorf("%w: applied index in data (%d/%d) differs from header (%d/%d)", ErrBadSnapshot, ai, at, index, term)
			}
			sawApplied = true
		}
		if err := b.Set(k, v, nil); err != nil {
			return err
		}
		if b.Len() > 4<<20 {
			if err := commit(); err != nil {
				return err
			}
			b.Close()
			b = db.NewBatch()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var cnt [8]byte
	if _, err := io.ReadFull(hr, cnt[:]); err != nil {
		return 0, fmt.Errorf("%w: trailer: %v", ErrBadSnapshot, err)
	}
	if got := binary.BigEndian.Uint64(cnt[:]); got != n {
		return 0, fmt.Errorf("%w: trailer counts %d entries, stream had %d", ErrBadSnapshot, got, n)
	}
	want := hr.h.Sum(nil)
	var sum [32]byte
	if _, err := io.ReadFull(hr.r, sum[:]); err != nil {
		return 0, fmt.Errorf("%w: checksum: %v", ErrBadSnapshot, err)
	}
	if !bytes.Equal(sum[:], want) {
		return 0, fmt.Errorf("%w: checksum mismatch", ErrBadSnapshot)
	}
	if index > 0 && !sawApplied {
		return 0, fmt.Errorf("%w: no applied index in data", ErrBadSnapshot)
	}
	if err := commit(); err != nil {
		return 0, err
	}
	// The flush makes the scratch database durable (no WAL). Pebble's
	// Flush would wait for ever on a flush that keeps failing.
	if err := room(db.Metrics().MemTable.Size); err != nil {
		return 0, err
	}
	flushed, err := db.AsyncFlush()
	if err != nil {
		return 0, err
	}
	select {
	case <-flushed:
	case <-bg.done:
	}
	if err := bg.get(); err != nil {
		return 0, fmt.Errorf("flush scratch database %s: %w", dir, err)
	}
	return index, nil
}

// firstError keeps the first error reported to it (from any goroutine)
// and closes done then.
type firstError struct {
	once sync.Once
	err  error
	done chan struct{}
}

func newFirstError() *firstError { return &firstError{done: make(chan struct{})} }

func (e *firstError) set(err error) {
	e.once.Do(func() {
		e.err = err
		close(e.done)
	})
}

// get returns the first error, nil if none was reported yet.
func (e *firstError) get() error {
	select {
	case <-e.done:
		return e.err
	default:
		return nil
	}
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// swapIn replaces the live database directory with dir and reloads state.
func (f *FSM) swapIn(dir string) error {
	f.mu.Lock()
	bg := f.bg
	f.swapping = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.swapping = false
		f.mu.Unlock()
	}()
	bg.stop()
	// In-flight snapshot persists and digests read the old database: let
	// them finish (no new one starts while swapping).
	f.persistWG.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	// The write buffers hold changes to the state being replaced: the one
	// in flight lands in the old database, the active one is dropped.
	f.awaitFlushLocked()
	f.applier.discard()
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("close live db: %w", err)
	}
	live := filepath.Join(f.cfg.Dir, dbDirName)
	old := filepath.Join(f.cfg.Dir, "db.old")
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Rename(live, old); err != nil {
		return fmt.Errorf("move live db aside: %w", err)
	}
	if err := os.Rename(dir, live); err != nil {
		return fmt.Errorf("move restored db in: %w", err)
	}
	if err := syncDir(f.cfg.Dir); err != nil {
		return err
	}
	os.RemoveAll(old)
	// Saved filters describe the replaced state: never load them.
	os.Remove(filepath.Join(f.cfg.Dir, filtersFile))
	if err := f.open(); err != nil {
		return err
	}
	close(f.notify)
	f.notify = make(chan struct{})
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
