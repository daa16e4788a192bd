package cluster

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"

	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// walStore is raft-wal with two repairs around it.
//
// An exclusive lock on its directory: raft-wal opens its meta file with
// bbolt's default of waiting forever for bbolt's own lock, so a second
// process on the same data dir would hang instead of failing (raft-boltdb
// fails after its 2 s Timeout).
//
// Recovery from a failed segment rotation. When a segment is full,
// raft-wal seals it and creates the next one, preallocated to the segment
// size, in the background. If that creation fails (the disk has less free
// space than a segment), raft-wal logs "rotate error" and never tries
// again: every later append fails with "segment is sealed" until the
// process restarts, so a disk that was full for a moment would wedge the
// node for good (a leader steps down at each append, a follower never
// catches up). The store reopens the WAL instead, once the disk has room
// for a segment: raft-wal commits the new segment to its meta store before
// it creates the file, and an open recovers that tail, whether its file is
// missing (created then) or was left empty by the failed creation.
type walStore struct {
	open func() (*wal.WAL, error)
	// room reports whether the disk has room for a new segment. Without
	// it a reopen would fail, and the wedged WAL, which still serves
	// reads, is kept meanwhile.
	room func() bool
	log  hclog.Logger
	lock *os.File // released by Close

	mu     sync.RWMutex // guards w: every call holds it shared, a reopen exclusively
	w      *wal.WAL     // nil after a reopen failed; the next append tries again
	broken error        // why w is nil
	closed bool         // Close was called: nothing reopens
	// sealed: an append of w found its tail sealed with no successor. Its
	// meta store then already lists the successor while w's memory does
	// not, and a head truncation (DeleteRange) would persist w's stale
	// view over it; so truncations wait for a reopen.
	sealed atomic.Bool
}

var (
	_ raft.LogStore          = (*walStore)(nil)
	_ raft.StableStore       = (*walStore)(nil)
	_ raft.MonotonicLogStore = (*walStore)(nil)
)

// openWALStore opens the WAL in dir with segments of segmentBytes, its
// segment files through vfs (fs.New(); tests inject failures).
func openWALStore(dir string, segmentBytes int, log hclog.Logger, vfs types.VFS) (*walStore, error) {
	room := func() bool {
		free, _, err := diskspace.Free(dir)
		return err == nil && free >= uint64(segmentBytes)
	}
	s := &walStore{log: log, room: room}
	s.open = func() (*wal.WAL, error) {
		// Our own meta store, so that a failed open can close it: raft-wal
		// leaves it open, and its bbolt lock would block the next open
		// forever.
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(dir, wal.WithLogger(log), wal.WithSegmentSize(segmentBytes),
			wal.WithSegmentFiler(segment.NewFiler(dir, vfs)), wal.WithMetaStore(meta))
		if err != nil {
			_ = meta.Close()
			return nil, fmt.Errorf("open raft log %s: %w", dir, err)
		}
		return w, nil
	}
	var err error
	if s.w, err = s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// errWALBroken wraps the error of a reopen that failed.
var errWALBroken = errors.New("raft log unavailable after a failed segment rotation")

// current returns the open WAL under s.mu held shared, or the reason there
// is none. The caller releases s.mu.
func (s *walStore) current() (*wal.WAL, error) {
	s.mu.RLock()
	if s.w == nil {
		return nil, fmt.Errorf("%w: %v", errWALBroken, s.broken)
	}
	return s.w, nil
}

// reopen replaces failed, the WAL whose append found its tail sealed (or
// nil when a reopen failed before), by a new one opened from disk, once the
// disk has room for the segment the open creates. Only one caller
// reopens; the others find it done.
func (s *walStore) reopen(failed *wal.WAL) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return wal.ErrClosed
	}
	if s.w != failed {
		return nil // reopened by another caller meanwhile
	}
	if !s.room() {
		return errors.New("no room on the disk for a new raft log segment")
	}
	if failed != nil {
		if err := failed.Close(); err != nil {
			s.log.Warn("closing the wedged raft log", "error", err)
		}
		s.w = nil
	}
	w, err := s.open()
	if err != nil {
		// Rare: the room measured above went meanwhile. Every call fails
		// until an append reopens the log (Raft panics if it cannot store
		// a new term meanwhile, and the process exits).
		s.broken = err
		s.log.Error("raft log segment rotation failed and the log cannot be reopened yet; appends fail until it can", "error", err)
		return err
	}
	s.w, s.broken = w, nil
	s.sealed.Store(false)
	s.log.Warn("raft log reopened after a failed segment rotation (the disk was full); appends go on")
	return nil
}

// wedged reports whether an append's error means the WAL must be reopened.
func wedged(err error) bool {
	return errors.Is(err, types.ErrSealed) || errors.Is(err, errWALBroken)
}

// StoreLogs appends logs. An append refused because the tail is sealed
// with no successor (or because an earlier reopen failed) reopens the WAL
// and tries once more: the entries were not written (raft-wal checks the
// seal before it writes anything).
func (s *walStore) StoreLogs(logs []*raft.Log) error {
	w, err := s.current()
	if err == nil {
		err = w.StoreLogs(logs)
	}
	s.mu.RUnlock()
	if !wedged(err) {
		return err
	}
	if errors.Is(err, types.ErrSealed) {
		s.sealed.Store(true)
	}
	if rerr := s.reopen(w); rerr != nil {
		return fmt.Errorf("%w (reopening: %v)", err, rerr)
	}
	w, err = s.current()
	defer s.mu.RUnlock()
	if err != nil {
		return err
	}
	if err = w.StoreLogs(logs); errors.Is(err, types.ErrSealed) {
		s.sealed.Store(true)
		s.log.Error("raft log still refuses appends after a reopen (its tail segment is sealed); restart the node, and if that does not help, replace its data dir from a snapshot (docs/OPERATIONS.md)", "error", err)
	}
	return err
}

func (s *walStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// use calls f with the open WAL, holding s.mu shared.
func use[T any](s *walStore, f func(*wal.WAL) (T, error)) (T, error) {
	w, err := s.current()
	defer s.mu.RUnlock()
	if err != nil {
		var zero T
		return zero, err
	}
	return f(w)
}

// do is use for calls that return only an error.
func do(s *walStore, f func(*wal.WAL) error) error {
	_, err := use(s, func(w *wal.WAL) (struct{}, error) { return struct{}{}, f(w) })
	return err
}

func (s *walStore) FirstIndex() (uint64, error) { return use(s, (*wal.WAL).FirstIndex) }
func (s *walStore) LastIndex() (uint64, error)  { return use(s, (*wal.WAL).LastIndex) }

func (s *walStore) GetLog(index uint64, l *raft.Log) error {
	return do(s, func(w *wal.WAL) error { return w.GetLog(index, l) })
}

// DeleteRange truncates the log. A wedged WAL is reopened first, or the
// truncation is refused (Raft tries again after its next snapshot).
func (s *walStore) DeleteRange(lo, hi uint64) error {
	if s.sealed.Load() {
		s.mu.RLock()
		w := s.w
		s.mu.RUnlock()
		if err := s.reopen(w); err != nil {
			return fmt.Errorf("raft log truncation deferred until the log is reopened: %w", err)
		}
	}
	return do(s, func(w *wal.WAL) error { return w.DeleteRange(lo, hi) })
}

func (s *walStore) Set(k, v []byte) error {
	return do(s, func(w *wal.WAL) error { return w.Set(k, v) })
}

func (s *walStore) Get(k []byte) ([]byte, error) {
	return use(s, func(w *wal.WAL) ([]byte, error) { return w.Get(k) })
}

func (s *walStore) SetUint64(k []byte, v uint64) error {
	return do(s, func(w *wal.WAL) error { return w.SetUint64(k, v) })
}

func (s *walStore) GetUint64(k []byte) (uint64, error) {
	return use(s, func(w *wal.WAL) (uint64, error) { return w.GetUint64(k) })
}

// IsMonotonic: raft-wal keeps consecutive indexes only.
func (s *walStore) IsMonotonic() bool { return true }

// Close closes the WAL (it waits for a write in progress and closes its
// meta store), then releases the directory lock.
func (s *walStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.w != nil {
		err = s.w.Close()
		s.w = nil
	}
	s.broken, s.closed = wal.ErrClosed, true
	if s.lock != nil {
		if cerr := s.lock.Close(); err == nil { // closing releases the flock
			err = cerr
		}
		s.lock = nil
	}
	return err
}
