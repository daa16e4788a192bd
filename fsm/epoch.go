package fsm

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupnode/dedupnode/storage"
)

// FenceEpoch returns the fencing epoch claims are granted in now.
func (f *FSM) FenceEpoch() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.fenceEpoch
}

// SeedFenceEpoch raises the fencing epoch to at least epoch outside the
// Raft log, at the current applied index, and returns the epoch now in
// force. Only for seeding a new cluster's first data dir from a backup
// (cluster.SeedFromBackup) before Raft runs on it: that seed's state is
// then snapshotted, so every replica of the new cluster starts from the
// same state. Never call it on an FSM that Raft drives.
func (f *FSM) SeedFenceEpoch(epoch uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, ErrClosed
	}
	if epoch > MaxFenceEpoch {
		return f.st.fenceEpoch, fmt.Errorf("%w: epoch %d exceeds %d", ErrFenceRange, epoch, MaxFenceEpoch)
	}
	if epoch <= f.st.fenceEpoch {
		return f.st.fenceEpoch, nil
	}
	f.flushLocked() // the write buffer's keys go first
	if err := f.db.Set(storage.MetaKey(metaFenceEpoch), encodeUvarint(epoch), pebble.Sync); err != nil {
		return f.st.fenceEpoch, fmt.Errorf("persist fence epoch: %w", err)
	}
	f.st.fenceEpoch = epoch
	return epoch, nil
}

// RecordCounts counts the stored records of every namespace by what they
// mean at a given time.
type RecordCounts struct {
	Committed uint64 // live committed records
	Leased    uint64 // live leases
	// Released are released leases still remembered (they answer as
	// absent); Expired are records whose expiry has passed (absent too,
	// removed with their bucket at a later write).
	Released uint64
	Expired  uint64
}

// Live is the number of records that answer as seen.
func (c RecordCounts) Live() uint64 { return c.Committed + c.Leased }

// CountRecords commits the write buffer, then scans every record (from a
// consistent storage snapshot) and counts them as of nowMs. It costs one
// pass over the whole state.
func (f *FSM) CountRecords(nowMs int64) (RecordCounts, error) {
	snap, _, err := f.pinCommitted()
	if err != nil {
		return RecordCounts{}, err
	}
	defer f.persistWG.Done()
	defer snap.Close()
	var c RecordCounts
	err = scanRecords(snap, func(_, v []byte) error {
		r, err := decodeRecord(v)
		if err != nil {
			return err
		}
		switch {
		case r.ExpiresMs <= nowMs:
			c.Expired++
		case r.State == StateReleased:
			c.Released++
		case r.State == StateLeased:
			c.Leased++
		default:
			c.Committed++
		}
		return nil
	})
	if err != nil {
		return RecordCounts{}, fmt.Errorf("count records: %w", err)
	}
	return c, nil
}

// DecodeRecord parses a record value as stored under a record key (for
// readers of a snapshot stream, such as export). Byte slices alias value.
func DecodeRecord(value []byte) (Record, error) { return decodeRecord(value) }
