package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
)

// LogStore names the store that keeps a node's Raft log and its stable
// state (current term, vote). Both are supported; a data dir holds one of
// them for its whole life (see LogStoreMismatchError).
type LogStore string

const (
	// LogStoreWAL is hashicorp/raft-wal: append-only segment files, one
	// fsync per append, truncation behind a snapshot deletes whole
	// segments, so the disk comes back. DataDir/raft/wal/.
	LogStoreWAL LogStore = "wal"
	// LogStoreBoltDB is hashicorp/raft-boltdb/v2 (bbolt): two fdatasyncs
	// per append, and a file that never shrinks (freed pages are reused).
	// DataDir/raft/raft.db.
	LogStoreBoltDB LogStore = "boltdb"

	// DefaultLogStore is the store a node uses when Config.LogStore is
	// empty. Chosen by measurement (docs/PERFORMANCE.md).
	DefaultLogStore = LogStoreWAL
)

// defaultWALSegmentBytes is Config.WALSegmentBytes' default.
const defaultWALSegmentBytes = 16 << 20

// LogStores lists the supported stores, default first.
var LogStores = []LogStore{LogStoreWAL, LogStoreBoltDB}

// ParseLogStore accepts "wal" or "boltdb"; "" means DefaultLogStore.
func ParseLogStore(s string) (LogStore, error) {
	switch ls := LogStore(strings.ToLower(strings.TrimSpace(s))); ls {
	case "":
		return DefaultLogStore, nil
	case LogStoreWAL, LogStoreBoltDB:
		return ls, nil
	}
	return "", fmt.Errorf("unknown raft log store %q: want wal or boltdb", s)
}

// Where each store keeps its files under DataDir.
func boltPath(dataDir string) string { return filepath.Join(dataDir, "raft", "raft.db") }
func walDir(dataDir string) string   { return filepath.Join(dataDir, "raft", "wal") }

// LogStorePath is the file (boltdb) or directory (wal) holding the Raft log
// of a node using store ls in dataDir.
func LogStorePath(dataDir string, ls LogStore) string {
	if ls == LogStoreBoltDB {
		return boltPath(dataDir)
	}
	return walDir(dataDir)
}

// DetectLogStore reports which store's files dataDir holds: "" when none
// (a new node). Both at once is an error (someone copied files around).
func DetectLogStore(dataDir string) (LogStore, error) {
	bolt := false
	if fi, err := os.Stat(boltPath(dataDir)); err == nil && fi.Size() > 0 {
		bolt = true
	}
	w := false
	if _, err := os.Stat(filepath.Join(walDir(dataDir), metadb.FileName)); err == nil {
		w = true
	}
	switch {
	case bolt && w:
		return "", fmt.Errorf("%s holds both a boltdb Raft log (%s) and a wal one (%s): keep the one the node last ran with and move the other away",
			dataDir, boltPath(dataDir), walDir(dataDir))
	case bolt:
		return LogStoreBoltDB, nil
	case w:
		return LogStoreWAL, nil
	}
	return "", nil
}

// LogStoreMismatchError: the data dir holds the other store's Raft log. The
// node refuses to start rather than begin an empty log next to a full one
// (it would forget its term, vote and every entry). Moving a node from one
// store to the other: docs/OPERATIONS.md.
type LogStoreMismatchError struct {
	DataDir    string
	Found      LogStore // what the data dir holds
	Configured LogStore // what the node was asked to use
}

func (e *LogStoreMismatchError) Error() string {
	return fmt.Sprintf("%s holds a %s Raft log (%s) but the node is configured with --raft-log-store %s: start it with --raft-log-store %s, or move it to %s by removing it from the cluster, wiping the data dir and joining it again (docs/OPERATIONS.md)",
		e.DataDir, e.Found, LogStorePath(e.DataDir, e.Found), e.Configured, e.Found, e.Configured)
}

// CheckLogStore returns a *LogStoreMismatchError when dataDir holds the
// Raft log of a store other than ls, nil when it holds ls's or none.
func CheckLogStore(dataDir string, ls LogStore) error {
	found, err := DetectLogStore(dataDir)
	if err != nil {
		return err
	}
	if found != "" && found != ls {
		return &LogStoreMismatchError{DataDir: dataDir, Found: found, Configured: ls}
	}
	return nil
}

// raftStore is what a node needs of its log store: the log, the stable
// store (term and vote) and Close. Both stores keep both.
type raftStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// openLogStore opens (creating if missing) the store ls in dataDir, after
// refusing a data dir that holds the other store's files.
func openLogStore(dataDir string, ls LogStore, segmentBytes int, hcl hclog.Logger) (raftStore, error) {
	if err := CheckLogStore(dataDir, ls); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dataDir, "raft"), 0o755); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}
	switch ls {
	case LogStoreBoltDB:
		s, err := raftboltdb.New(raftboltdb.Options{Path: boltPath(dataDir), BoltOptions: boltOptions()})
		if err != nil {
			return nil, fmt.Errorf("open raft log %s: %w", boltPath(dataDir), err)
		}
		return s, nil
	case LogStoreWAL:
		dir := walDir(dataDir)
		if err := os.MkdirAll(dir, 0o755); err != nil { // wal.Open needs it
			return nil, fmt.Errorf("create raft log dir: %w", err)
		}
		lock, err := lockDir(dir)
		if err != nil {
			return nil, err
		}
		if segmentBytes <= 0 {
			segmentBytes = defaultWALSegmentBytes
		}
		s, err := openWALStore(dir, segmentBytes, hcl.Named("wal"), fs.New())
		if err != nil {
			lock.Close()
			return nil, err
		}
		s.lock = lock
		return s, nil
	}
	return nil, fmt.Errorf("unknown raft log store %q", ls)
}

// lockDir takes an exclusive, non-blocking flock on dir/LOCK.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open raft log lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("raft log %s is in use by another process (lock: %w)", dir, err)
	}
	return f, nil
}

// LogInfo describes a stopped node's Raft log (InspectLog).
type LogInfo struct {
	Store      LogStore
	Path       string // the log's file (boltdb) or directory (wal)
	FirstIndex uint64 // 0 when the log is empty
	LastIndex  uint64
	Entries    uint64
	// EntryBytes sums the entries' data and extensions: what the log must
	// keep, before any store's framing.
	EntryBytes uint64
}

// InspectLog opens the Raft log of a STOPPED node in dataDir (whichever
// store it holds) and reads every entry in it. For tools and scale runs:
// how many bytes of entries a log directory of a given size keeps.
func InspectLog(dataDir string) (LogInfo, error) {
	ls, err := DetectLogStore(dataDir)
	if err != nil {
		return LogInfo{}, err
	}
	if ls == "" {
		return LogInfo{}, fmt.Errorf("%s holds no Raft log", dataDir)
	}
	s, err := openLogStore(dataDir, ls, 0, hclog.NewNullLogger())
	if err != nil {
		return LogInfo{}, err
	}
	defer s.Close()
	info := LogInfo{Store: ls, Path: LogStorePath(dataDir, ls)}
	if info.FirstIndex, err = s.FirstIndex(); err != nil {
		return info, fmt.Errorf("first index: %w", err)
	}
	if info.LastIndex, err = s.LastIndex(); err != nil {
		return info, fmt.Errorf("last index: %w", err)
	}
	if info.FirstIndex == 0 {
		return info, nil
	}
	for i := info.FirstIndex; i <= info.LastIndex; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			return info, fmt.Errorf("read entry %d: %w", i, err)
		}
		info.Entries++
		info.EntryBytes += uint64(len(l.Data) + len(l.Extensions))
	}
	return info, nil
}
