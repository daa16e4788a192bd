package fsm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dedupnode/dedupnode/storage"
)

// StateDigest is a digest of the whole state together with what it covers,
// all read from one Pebble snapshot.
type StateDigest struct {
	// Digest is a SHA-256 over every key and value, each preceded by its
	// length as a uvarint, in key order.
	Digest []byte
	// AppliedIndex and AppliedTerm name the last Raft entry the state holds.
	AppliedIndex uint64
	AppliedTerm  uint64
	// LastTsMs is the last leader timestamp applied (Unix ms).
	LastTsMs int64
	// Keys counts every key hashed; Records the record keys among them
	// (expired or released records whose bucket is not dropped yet count).
	Keys    uint64
	Records uint64
}

// ErrClosed is returned by the whole-state readers (Snapshot, DigestState,
// Digest) once the FSM is closed.
var ErrClosed = errors.New("fsm closed")

// DigestState hashes the whole state and returns the digest with the
// applied index it covers: it commits the write buffer and takes one
// Pebble snapshot under the write lock, so the index is exactly the
// state's. The scan runs on the snapshot without the lock: applies go on
// meanwhile. Cost: one pass over every key (O(records)); ctx is checked
// every few thousand keys.
//
// Replicas at the same applied index have equal digests: every key is
// written by apply alone, from the log (time included: expiry uses the
// leader's timestamp in each command, and expired buckets are deleted by
// apply, as a range deletion in the command's batch). What happens outside
// the log is invisible to the scan: Pebble's compaction of a dropped range
// only reclaims space, and the Bloom filters live outside the database.
func (f *FSM) DigestState(ctx context.Context) (StateDigest, error) {
	// Pinned: Close and Restore wait for the scan, as they do for a
	// snapshot being persisted.
	snap, st, err := f.pinCommitted()
	if err != nil {
		return StateDigest{}, err
	}
	d := StateDigest{AppliedIndex: st.applied, AppliedTerm: st.appliedTerm, LastTsMs: st.lastTs}
	defer f.persistWG.Done()
	defer snap.Close()

	h := sha256.New()
	var lb [binary.MaxVarintLen64]byte
	err = scanPrefix(snap, nil, func(k, v []byte) error {
		if d.Keys%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		d.Keys++
		if storage.IsRecordKey(k) {
			d.Records++
		}
		h.Write(lb[:binary.PutUvarint(lb[:], uint64(len(k)))])
		h.Write(k)
		h.Write(lb[:binary.PutUvarint(lb[:], uint64(len(v)))])
		h.Write(v)
		return nil
	})
	if err != nil {
		return StateDigest{}, fmt.Errorf("digest: %w", err)
	}
	d.Digest = h.Sum(nil)
	return d, nil
}
