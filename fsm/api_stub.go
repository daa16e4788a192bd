package fsm

// This file is temporary: signatures the cluster layer codes against while
// the apply path is written. Replaced by apply.go, read.go and snapshot.go.

import (
	"io"

	"github.com/hashicorp/raft"
)

// Apply applies one Raft log entry (raft.FSM). Returns *ApplyResult for
// commands, nil for replays and non-command entries, *ApplyErr for entries
// that fail to decode.
func (f *FSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies entries in one Pebble batch (raft.BatchingFSM).
func (f *FSM) ApplyBatch(logs []*raft.Log) []any { panic("unimplemented") }

// Snapshot returns a consistent point-in-time view (raft.FSM).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) { panic("unimplemented") }

// Restore replaces the whole state with a snapshot stream, or leaves it
// untouched on error (raft.FSM).
func (f *FSM) Restore(rc io.ReadCloser) error { panic("unimplemented") }

// Check answers, for each id, whether it is recorded and live at nowMs in
// namespace nsName ("" = default). Returns ErrNamespaceNotFound (wrapped)
// for an unknown namespace. Results are CodeSeen (with Record) or CodeNotSeen.
func (f *FSM) Check(nsName string, ids [][]byte, nowMs int64) ([]ItemResult, error) {
	panic("unimplemented")
}

// Digest returns a SHA-256 over every key and value of the state: equal
// digests at equal applied index mean identical replicas.
func (f *FSM) Digest() ([]byte, error) { panic("unimplemented") }

// ExpiredBuckets returns how many buckets have fully expired at nowMs but
// are not yet dropped (the leader then proposes an OpTick).
func (f *FSM) ExpiredBuckets(nowMs int64) int { panic("unimplemented") }

type background struct{}

func startBackground(f *FSM) *background { return &background{} }
func (b *background) stop()              {}
