package cluster

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// snapshotStore is hashicorp/raft's FileSnapshotStore without its leak of
// unfinished snapshots. A snapshot is written into DIR/snapshots/NAME.tmp
// and renamed to NAME when its sink is closed; a .tmp directory is never a
// usable snapshot (raft's List skips it with "found temporary snapshot").
// Raft leaves them behind:
//
//   - FileSnapshotSink.Cancel flushes its buffered writer before removing
//     the directory, and returns at once when that flush fails. After any
//     failed Write the bufio.Writer keeps the error, so the flush always
//     fails: a snapshot receive that ran out of space (installSnapshot
//     cancels on the failed io.Copy) leaves its directory, one per retry
//     of the leader (15 directories, 24 MiB, on a 40 MiB volume).
//   - Create makes the directory, then writes meta.json and creates
//     state.bin, and returns an error without removing it when either
//     fails.
//   - Close removes it when flushing fails, but not when writing the
//     final meta.json or the rename fails.
//   - A process killed during a snapshot leaves it, and nothing ever
//     removes one.
//
// So openSnapshotStore removes every .tmp directory before raft opens the
// store (no sink exists yet), and the store's sinks remove their own
// directory whenever they end without becoming a snapshot. The state
// file raft leaves open on a failed Cancel is closed by Go's finalizer
// once raft drops the sink: its space comes back then.
type snapshotStore struct {
	*raft.FileSnapshotStore
	dir    string // the snapshots directory (raft's base/snapshots)
	retain int
	log    *slog.Logger

	mu   sync.Mutex
	live map[string]bool // .tmp directories of sinks not yet closed or cancelled
}

var _ raft.SnapshotStore = (*snapshotStore)(nil)

// snapshotsDir is where raft's FileSnapshotStore keeps snapshots under its
// base directory.
const snapshotsDir = "snapshots"

// tmpSnapshotSuffix is the suffix of raft's unfinished snapshot directories.
const tmpSnapshotSuffix = ".tmp"

// openSnapshotStore removes unfinished snapshots (.tmp directories) under
// raftDir/snapshots, logging each with its size, then opens raft's file
// snapshot store there keeping retain snapshots.
func openSnapshotStore(raftDir string, retain int, hcl hclog.Logger, log *slog.Logger) (*snapshotStore, error) {
	s := &snapshotStore{dir: filepath.Join(raftDir, snapshotsDir), retain: retain, log: log, live: map[string]bool{}}
	if err := s.removeUnfinished(""); err != nil {
		return nil, err
	}
	fs, err := raft.NewFileSnapshotStoreWithLogger(raftDir, retain, hcl)
	if err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	s.FileSnapshotStore = fs
	return s, nil
}

// removeUnfinished removes the .tmp directories whose names start with
// prefix ("" for all) and that belong to no live sink. A missing snapshots
// directory is nothing to remove.
func (s *snapshotStore) removeUnfinished(prefix string) error {
	entries, err := os.ReadDir(s.dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list snapshots in %s: %w", s.dir, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasSuffix(name, tmpSnapshotSuffix) || !strings.HasPrefix(name, prefix) {
			continue
		}
		path := filepath.Join(s.dir, name)
		if s.live[path] {
			continue
		}
		if err := s.remove(path, "left by an earlier run or a failed snapshot"); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes the unfinished snapshot at path and logs what it held.
func (s *snapshotStore) remove(path, why string) error {
	size, _ := diskspace.Allocated(path)
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove unfinished snapshot %s: %w", path, err)
	}
	s.log.Warn("removed an unfinished raft snapshot ("+why+")", "path", path, "bytes", size, "size", diskspace.Bytes(uint64(max(size, 0))))
	return nil
}

// Create is raft's Create, after the oldest snapshots are removed down to
// retain-1 (never the latest): raft's store removes them only once the new
// one is complete, so while one was written the directory held a copy of
// the whole store more than retain. When Create fails, the directory it
// may have made is removed. Its sink removes its directory when it is
// cancelled or its Close fails.
func (s *snapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	s.reapForNew()
	sink, err := s.FileSnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		// raft names the directory TERM-INDEX-MSEC.tmp and returns no sink
		// to learn the MSEC from: remove every unfinished one of this
		// term and index that no live sink writes.
		if rerr := s.removeUnfinished(fmt.Sprintf("%d-%d-", term, index)); rerr != nil {
			s.log.Error("failed snapshot left a directory behind", "err", rerr)
		}
		return nil, err
	}
	path := filepath.Join(s.dir, sink.ID()+tmpSnapshotSuffix)
	s.mu.Lock()
	s.live[path] = true
	s.mu.Unlock()
	return &cleanSink{SnapshotSink: sink, store: s, path: path}, nil
}

// reapForNew removes the complete snapshots beyond the newest retain-1
// (at least the newest one stays). raft opens only the newest to send or
// restore, so no reader loses its snapshot; raft reaps the same ones after
// the new snapshot is complete anyway. A failure is logged and the
// snapshot goes ahead: raft's reap tries again after it.
func (s *snapshotStore) reapForNew() {
	metas, err := s.FileSnapshotStore.List() // newest first
	if err != nil {
		return
	}
	for _, m := range metas[min(max(s.retain-1, 1), len(metas)):] {
		if err := os.RemoveAll(filepath.Join(s.dir, m.ID)); err != nil {
			s.log.Warn("could not remove an old raft snapshot before taking a new one", "id", m.ID, "err", err)
		}
	}
}

// end forgets a sink and, unless it became a snapshot, removes its
// directory.
func (s *snapshotStore) end(path string, finished bool, why string) {
	s.mu.Lock()
	delete(s.live, path)
	s.mu.Unlock()
	if finished {
		return
	}
	if _, err := os.Stat(path); err != nil {
		return // raft removed it itself
	}
	if err := s.remove(path, why); err != nil {
		s.log.Error("failed snapshot left a directory behind", "err", err)
	}
}

// cleanSink is a raft snapshot sink whose .tmp directory never outlives it
// unless it became a snapshot (see snapshotStore).
type cleanSink struct {
	raft.SnapshotSink
	store *snapshotStore
	path  string // the sink's .tmp directory
	once  sync.Once
}

// Close finalizes the snapshot; when that fails the directory is removed
// (raft's installSnapshot does not cancel after a failed Close).
func (c *cleanSink) Close() error {
	err := c.SnapshotSink.Close()
	c.once.Do(func() { c.store.end(c.path, err == nil, fmt.Sprintf("close failed: %v", err)) })
	return err
}

// Cancel abandons the snapshot and always removes its directory, which
// raft's Cancel skips after a failed write.
func (c *cleanSink) Cancel() error {
	err := c.SnapshotSink.Cancel()
	c.once.Do(func() { c.store.end(c.path, false, "cancelled") })
	return err
}
