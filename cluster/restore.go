package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// keyCurrentTerm is hashicorp/raft's stable-store key for the current term.
var keyCurrentTerm = []byte("CurrentTerm")

// SeedFromBackup prepares dataDir, which must hold no Raft state, as the
// first node of a new cluster whose state is a backup (an FSM snapshot
// stream, as Ops.Backup sends it):
//
//  1. the FSM in dataDir/fsm restores the stream, which verifies its
//     magic, entry count and SHA-256, so a damaged backup is refused whole;
//  2. a Raft snapshot at the backup's own index and term, whose
//     configuration is this node alone as a voter at raftAddr, goes into
//     the snapshot store, so Raft continues the log after the backup's
//     index (the FSM skips entries at or below its applied index: a log
//     restarting at 1 would be ignored);
//  3. the stable store's current term is set to the backup's term, so the
//     node's first election starts past it;
//  4. the fencing epoch is raised to one past the backup's before that
//     snapshot is taken from the seeded state (so the Raft snapshot and the
//     state agree, and nodes that join get the new epoch): fencing tokens
//     of the new cluster exceed every token the source cluster can grant
//     after the backup, although its Raft indexes restart from the
//     backup's (fsm/DESIGN.md, Fencing epochs);
//  5. nodeID is recorded in NodeIDFile, so the data dir starts with no
//     other ID.
//
// On an error dataDir is left as it was, and the error says so: what the
// seed wrote is removed.
//
// Start the node afterwards with the same NodeID and RaftAddr and neither
// Bootstrap nor Peers: it elects itself, and other nodes join it. Nodes of
// the old cluster remain in the node table until removed.
//
// Returns the backup's index and term, the new fencing epoch and the
// record counts. The Raft log store is DefaultLogStore;
// SeedFromBackupStore picks another.
func SeedFromBackup(dataDir, nodeID, raftAddr string, backup io.Reader, logger *slog.Logger) (SeedResult, error) {
	return SeedFromBackupAt(dataDir, nodeID, raftAddr, backup, logger, time.Now())
}

// SeedRoom refuses to seed dataDir from a backup of backupBytes unless its
// filesystem has room for what seeding writes and for the node started on
// it afterwards: the ID store and the Raft snapshot of the seeded state
// (about backupBytes each) plus minFree, the free space the node will keep
// (serve --min-free-disk; 0: the automatic threshold the node will have,
// 64 MiB plus twice the restored store, at least twice the apply reserve
// of memtable), never less than MinFreeDiskFloor(memtable, store), without
// which the node does not start. It returns a *diskspace.RoomError
// (matching ErrLowDiskSpace) naming each part. Call it before
// SeedFromBackup: a seed the volume cannot hold otherwise fails part way,
// after writing most of it.
func SeedRoom(dataDir string, backupBytes, minFree, memtable uint64, store LogStore) error {
	reserve, what := minFree, "the --min-free-disk"
	if minFree == 0 {
		reserve, what = max(autoMinFreeBase+2*backupBytes, 2*DiskReserve(memtable)), "the automatic --min-free-disk (64 MiB + twice the store)"
	}
	if floor := MinFreeDiskFloor(memtable, store); reserve < floor {
		reserve, what = floor, "the floor a node needs to start"
	}
	need := 2*backupBytes + reserve
	free, _, _, err := diskspace.FreeNearest(dataDir)
	if err != nil {
		return fmt.Errorf("measure free space of data dir %s: %w", dataDir, err)
	}
	if free >= need {
		return nil
	}
	return &diskspace.RoomError{Path: dataDir, Op: "restoring a backup of " + diskspace.Bytes(backupBytes), Free: free, Need: need,
		Parts: "ID store " + diskspace.Bytes(backupBytes) + " + Raft snapshot " + diskspace.Bytes(backupBytes) + " + reserve " + diskspace.Bytes(reserve) + ", " + what,
		Fix:   "nothing was written; restore onto a larger volume or free space (a lower --min-free-disk, the one the node will be served with, lowers the reserve)"}
}

// seedUndo returns a function that removes what seeding then adds to
// dataDir: the topmost folder of its path that does not exist yet, else
// the entries dataDir does not hold yet.
func seedUndo(dataDir string) (func() error, error) {
	ents, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		top := filepath.Clean(dataDir)
		for {
			parent := filepath.Dir(top)
			if parent == top {
				break
			}
			if _, err := os.Lstat(parent); !errors.Is(err, os.ErrNotExist) {
				break
			}
			top = parent
		}
		return func() error { return os.RemoveAll(top) }, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read data dir: %w", err)
	}
	before := make(map[string]bool, len(ents))
	for _, e := range ents {
		before[e.Name()] = true
	}
	return func() error {
		ents, err := os.ReadDir(dataDir)
		if err != nil {
			return err
		}
		var errs []error
		for _, e := range ents {
			if !before[e.Name()] {
				errs = append(errs, os.RemoveAll(filepath.Join(dataDir, e.Name())))
			}
		}
		return errors.Join(errs...)
	}, nil
}

// SeedResult describes a data dir seeded from a backup.
type SeedResult struct {
	// Index and Term are the backup's Raft index and term.
	Index, Term uint64
	// FenceEpoch is the fencing epoch of the new cluster: one past the
	// backup's, so every fencing token it grants exceeds any token the
	// source cluster can grant after the backup.
	FenceEpoch uint64
	// Records counts the backup's records as of the restore: live ones
	// (committed, leased) and those that answer as absent (released,
	// expired; dropped with their expiry buckets at later writes).
	Records fsm.RecordCounts
}

// SeedFromBackupAt is SeedFromBackup counting records as of now.
func SeedFromBackupAt(dataDir, nodeID, raftAddr string, backup io.Reader, logger *slog.Logger, now time.Time) (SeedResult, error) {
	return SeedFromBackupStore(dataDir, nodeID, raftAddr, DefaultLogStore, backup, logger, now)
}

// SeedFromBackupStore is SeedFromBackupAt with the Raft log store the node
// will be started with (the backup's term goes into that store).
func SeedFromBackupStore(dataDir, nodeID, raftAddr string, store LogStore, backup io.Reader, logger *slog.Logger, now time.Time) (res SeedResult, err error) {
	if store == "" {
		store = DefaultLogStore
	}
	if nodeID == "" || raftAddr == "" || dataDir == "" {
		return res, errors.New("seed from backup: node ID, raft address and data dir are required")
	}
	if err := fsm.ValidateNodeID(nodeID); err != nil {
		return res, fmt.Errorf("seed from backup: %w", err)
	}
	if err := CheckHostPort(raftAddr); err != nil {
		return res, fmt.Errorf("seed from backup: raft address %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	raftDir := filepath.Join(dataDir, "raft")
	if found, err := DetectLogStore(dataDir); err != nil || found != "" {
		return res, fmt.Errorf("%s already holds Raft state: restore into an empty data dir", dataDir)
	}
	// A seed that fails (a truncated or damaged backup, a full disk)
	// takes back what it wrote: the ID store alone would hold tens of MB
	// of a state no node can start from.
	undo, err := seedUndo(dataDir)
	if err != nil {
		return res, err
	}
	defer func() {
		if err == nil {
			return
		}
		if uerr := undo(); uerr != nil {
			err = fmt.Errorf("%w; removing what the restore wrote to %s failed too: %v", err, dataDir, uerr)
		} else {
			err = fmt.Errorf("%w; %s is as it was", err, dataDir)
		}
	}()
	if err := os.MkdirAll(raftDir, 0o755); err != nil {
		return res, fmt.Errorf("create raft dir: %w", err)
	}

	br := bufio.NewReaderSize(backup, 1<<20)
	raw, err := br.Peek(fsm.SnapshotHeaderLen)
	if err != nil {
		return res, fmt.Errorf("read backup header: %w", err)
	}
	hdr, err := fsm.ParseSnapshotHeader(raw)
	if err != nil {
		return res, fmt.Errorf("not a dedupnode backup: %w", err)
	}
	index, term := hdr.Index, hdr.Term
	res.Index, res.Term = index, term

	f, err := fsm.New(fsm.Config{Dir: filepath.Join(dataDir, "fsm"), Logger: logger})
	if err != nil {
		return res, fmt.Errorf("open fsm: %w", err)
	}
	if err := f.Restore(io.NopCloser(br)); err != nil {
		f.Close()
		return res, err
	}
	if got := f.AppliedIndex(); got != index {
		f.Close()
		return res, fmt.Errorf("backup header says index %d, restored state says %d: %w", index, got, fsm.ErrBadSnapshot)
	}
	if res.FenceEpoch, err = f.SeedFenceEpoch(f.FenceEpoch() + 1); err != nil {
		f.Close()
		return res, fmt.Errorf("raise fencing epoch: %w", err)
	}
	if res.Records, err = f.CountRecords(max(now.UnixMilli(), f.LastTimestamp())); err != nil {
		f.Close()
		return res, err
	}
	// The Raft snapshot is the seeded state (new epoch included), not the
	// backup's bytes: nodes that join install it.
	fsnap, err := f.Snapshot()
	if err != nil {
		f.Close()
		return res, fmt.Errorf("snapshot seeded state: %w", err)
	}
	defer func() {
		fsnap.Release()
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close fsm: %w", cerr)
		}
	}()

	hcl := newHCLogger(logger.With("component", "raft"), hclog.Warn, nil)
	snaps, err := openSnapshotStore(raftDir, 2, hcl, logger)
	if err != nil {
		return res, err
	}
	_, trans := raft.NewInmemTransport(raft.ServerAddress(raftAddr))
	defer trans.Close()
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(nodeID), Address: raft.ServerAddress(raftAddr)}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, term, conf, index, trans)
	if err != nil {
		return res, fmt.Errorf("create raft snapshot: %w", err)
	}
	if err := fsnap.Persist(sink); err != nil { // closes or cancels sink
		return res, fmt.Errorf("write raft snapshot: %w", err)
	}

	rs, err := openLogStore(dataDir, store, 0, hcl)
	if err != nil {
		return res, err
	}
	if err := rs.SetUint64(keyCurrentTerm, term); err != nil {
		rs.Close()
		return res, fmt.Errorf("set raft term: %w", err)
	}
	if err := rs.Close(); err != nil {
		return res, err
	}
	if err := recordNodeID(dataDir, nodeID); err != nil {
		return res, err
	}
	logger.Info("seeded data dir from backup", "dir", dataDir, "index", index, "term", term, "node", nodeID, "raft_addr", raftAddr,
		"fence_epoch", res.FenceEpoch, "live_records", res.Records.Live(), "expired", res.Records.Expired, "released", res.Records.Released)
	return res, nil
}
