package fsm

import (
	"encoding/binary"
	"fmt"

	"github.com/dedupnode/dedupnode/storage"
)

// windowShift sets the size of a write window: every 1<<windowShift
// records written into a bucket open its next window (storage keys each
// record by bucket, then window, then ID). Message IDs are random, so
// with one key range per bucket every sstable Pebble flushed spanned the
// whole bucket and each compaction rewrote the bucket's older records
// (about 600 bytes of compaction writes per acknowledged ID on 3 nodes);
// with windows, new files overlap only the newest window and older ones
// move down the levels whole. The price is on lookups that reach storage
// (IDs the Bloom filters call "maybe": duplicates and ≈ 1 % of new IDs):
// one seek per window of the bucket, newest first, where one seek was
// made. 2^20 records is ≈ 50 MiB of sstables per node in the benchmark;
// a bucket (at most an hour wide) fed 10k IDs/s holds ≈ 35 windows.
// Windows of 2^18 records measured slower, of 2^22 alike at twice the
// compaction writes (docs/PERFORMANCE.md, "Write windows"). Every replica
// must give a bucket the same shift (its keys depend on it): a version
// that changes it for new buckets must carry the shift in the log, not
// read it from its own constant, or replicas of mixed versions would key
// the same bucket differently.
const windowShift = 20

// bucketEntry is the FSM's view of one live bucket, mirrored in its
// registry key ('b' nsID bucket).
type bucketEntry struct {
	// count is the number of records stored in the bucket (including
	// expired ones not yet dropped).
	count uint64
	// inserts counts every record ever written into the bucket, never
	// decremented: the next new record's window is inserts >> shift.
	inserts uint64
	// shift is the window size (log2 records) the bucket was created with,
	// kept so a later version may change windowShift for new buckets only.
	shift uint8
	// legacy marks a bucket created by a version without windows: it may
	// hold records under 'r' keys, which lookups also try, and which are
	// rewritten in place.
	legacy bool
}

// windows is the number of windows the bucket's records may be in.
func (e bucketEntry) windows() uint32 {
	if e.inserts == 0 {
		return 0
	}
	return uint32((e.inserts-1)>>e.shift) + 1
}

// nextLoc is where the bucket's next new record goes.
func (e bucketEntry) nextLoc() storage.Loc { return storage.WindowLoc(uint32(e.inserts >> e.shift)) }

// Registry value: uvarint count (all a version without windows wrote),
// then, since windows, uvarint inserts, window shift (1 byte), flags (1
// byte; bit 0 = legacy).
const registryLegacyFlag = 1

func appendBucketEntry(dst []byte, e bucketEntry) []byte {
	dst = binary.AppendUvarint(dst, e.count)
	dst = binary.AppendUvarint(dst, e.inserts)
	var flags byte
	if e.legacy {
		flags |= registryLegacyFlag
	}
	return append(dst, e.shift, flags)
}

// decodeBucketEntry parses a registry value; a bucket registered by a
// version without windows gets windows of 1<<legacyShift records for its
// new ones.
func decodeBucketEntry(v []byte, legacyShift uint8) (bucketEntry, error) {
	n, k := binary.Uvarint(v)
	if k <= 0 {
		return bucketEntry{}, fmt.Errorf("bucket registry value %x: bad count", v)
	}
	if k == len(v) {
		// Written by a version without windows: every record it holds is
		// under its legacy key.
		return bucketEntry{count: n, shift: legacyShift, legacy: true}, nil
	}
	ins, k2 := binary.Uvarint(v[k:])
	if k2 <= 0 || len(v) != k+k2+2 {
		return bucketEntry{}, fmt.Errorf("bucket registry value %x: bad windows", v)
	}
	shift, flags := v[k+k2], v[k+k2+1]
	if shift == 0 || shift > 40 || flags&^registryLegacyFlag != 0 {
		return bucketEntry{}, fmt.Errorf("bucket registry value %x: window shift %d, flags %#x", v, shift, flags)
	}
	return bucketEntry{count: n, inserts: ins, shift: shift, legacy: flags&registryLegacyFlag != 0}, nil
}
