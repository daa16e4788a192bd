package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/dedupnode/dedupnode/fsm"
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
//     node's first election starts past it.
//
// Start the node afterwards with the same NodeID and RaftAddr and neither
// Bootstrap nor Peers: it elects itself, and other nodes join it. Nodes of
// the old cluster remain in the node table until removed.
//
// Returns the backup's index and term.
func SeedFromBackup(dataDir, nodeID, raftAddr string, backup io.Reader, logger *slog.Logger) (index, term uint64, err error) {
	if nodeID == "" || raftAddr == "" || dataDir == "" {
		return 0, 0, errors.New("seed from backup: node ID, raft address and data dir are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	raftDir := filepath.Join(dataDir, "raft")
	if fi, err := os.Stat(filepath.Join(raftDir, "raft.db")); err == nil && fi.Size() > 0 {
		return 0, 0, fmt.Errorf("%s already holds Raft state: restore into an empty data dir", dataDir)
	}
	if err := os.MkdirAll(raftDir, 0o755); err != nil {
		return 0, 0, fmt.Errorf("create raft dir: %w", err)
	}

	// Keep a copy while the FSM reads the stream: the same bytes become the
	// Raft snapshot.
	tmp, err := os.CreateTemp(dataDir, ".backup-*")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	hdr := make([]byte, 24)
	br := bufio.NewReaderSize(backup, 1<<20)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return 0, 0, fmt.Errorf("read backup header: %w", err)
	}
	if string(hdr[:8]) != "DDNSNAP1" {
		return 0, 0, fmt.Errorf("not a dedupnode backup (magic %q): %w", hdr[:8], fsm.ErrBadSnapshot)
	}
	index, term = binary.BigEndian.Uint64(hdr[8:16]), binary.BigEndian.Uint64(hdr[16:24])
	if _, err := tmp.Write(hdr); err != nil {
		return 0, 0, err
	}
	if _, err := io.Copy(tmp, br); err != nil {
		return 0, 0, fmt.Errorf("read backup: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, 0, err
	}

	f, err := fsm.New(fsm.Config{Dir: filepath.Join(dataDir, "fsm"), Logger: logger})
	if err != nil {
		return 0, 0, fmt.Errorf("open fsm: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return 0, 0, err
	}
	if err := f.Restore(io.NopCloser(tmp)); err != nil {
		f.Close()
		return 0, 0, err
	}
	if got := f.AppliedIndex(); got != index {
		f.Close()
		return 0, 0, fmt.Errorf("backup header says index %d, restored state says %d: %w", index, got, fsm.ErrBadSnapshot)
	}
	if err := f.Close(); err != nil {
		return 0, 0, fmt.Errorf("close fsm: %w", err)
	}

	hcl := newHCLogger(logger.With("component", "raft"), hclog.Warn, nil)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 2, hcl)
	if err != nil {
		return 0, 0, fmt.Errorf("open snapshot store: %w", err)
	}
	_, trans := raft.NewInmemTransport(raft.ServerAddress(raftAddr))
	defer trans.Close()
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(nodeID), Address: raft.ServerAddress(raftAddr)}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, term, conf, index, trans)
	if err != nil {
		return 0, 0, fmt.Errorf("create raft snapshot: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		sink.Cancel()
		return 0, 0, err
	}
	if _, err := io.Copy(sink, tmp); err != nil {
		sink.Cancel()
		return 0, 0, fmt.Errorf("write raft snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return 0, 0, fmt.Errorf("write raft snapshot: %w", err)
	}

	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(raftDir, "raft.db"),
		BoltOptions: boltOptions(),
	})
	if err != nil {
		return 0, 0, fmt.Errorf("open raft log: %w", err)
	}
	if err := bolt.SetUint64(keyCurrentTerm, term); err != nil {
		bolt.Close()
		return 0, 0, fmt.Errorf("set raft term: %w", err)
	}
	if err := bolt.Close(); err != nil {
		return 0, 0, err
	}
	logger.Info("seeded data dir from backup", "dir", dataDir, "index", index, "term", term, "node", nodeID, "raft_addr", raftAddr)
	return index, term, nil
}
