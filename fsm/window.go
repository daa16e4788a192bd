package fsm

import (
	"encoding/binary"
	"fmt"

	"github.com/dedupnode/dedupnode/storage"
)

// windowShift is the window size (log2 records) of the buckets this
// version creates: 2^40 records, so each new bucket is one window, one key
// range, as before windows. Storage keys a record by bucket, then window,
// then ID, and the version before this one (0d70e03) opened a new window
// every 2^20 records. That took compaction writes from the filling bucket
// (message IDs are random, so with one range per bucket every flushed
// sstable spans it and compactions rewrite its older records): +12–14 %
// IDs in alternated runs that fill one bucket. But a lookup that reaches
// storage seeks every window of each candidate bucket, and in the steady
// state a new ID's candidates are the Bloom false positives of about 24
// full buckets (≈ 0.2 per ID), each of ≈ 1 window per million records:
// with 25 windows a bucket, new IDs cost 2.6–3.6× the CPU of one window
// (BenchmarkApplyMarkNewAgedBuckets; docs/PERFORMANCE.md, "Write windows
// reverted"), and a bucket fed 30k IDs/s for an hour holds 100 windows.
//
// Buckets keep the shift they were created with, so windows stay
// readable. The shift comes from this constant, not from the log:
// replicas of versions with different shifts give a bucket created while
// both apply entries (and a legacy bucket's new records) different
// registry entries, and past 2^20 records different keys. Answers are
// alike, since each replica reads its own registry, but `digest` reports
// the replicas as differing until those buckets expire
// (docs/OPERATIONS.md). A later change of the shift should come from the
// log.
const windowShift = 40

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
