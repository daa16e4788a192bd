// Package storage owns dedupnode's on-disk state machine database: a Pebble
// instance tuned for the dedup workload, and the key layout that lets a whole
// expiry bucket be reclaimed with one range deletion.
//
// Key layout (all integers big-endian so keys sort numerically):
//
//	'w' nsID(4) bucket(8) window(4) id...   record of one message ID
//	'r' nsID(4) bucket(8) id...   record written before windows (legacy)
//	'b' nsID(4) bucket(8)         bucket registry: value = the bucket's entry (fsm: record count, inserts, window size, legacy flag)
//	'n' name...                   namespace config
//	'p' nodeID...                 node's client (gRPC) address
//	'm' name...                   FSM metadata (applied index, last timestamp, ...)
//
// A record lives under the bucket of its expiry (expiresMs / bucketWidthMs),
// so every key of a fully expired bucket is contiguous: DeleteRange over
// ['w' ns b, 'w' ns b+1) (and the legacy range, BucketRanges) drops them
// all at O(1) write cost and compaction returns the space (see DESIGN.md).
// Within its bucket a record lives under its write window: the bucket's
// insert count when it was written, shifted by the bucket's window size
// (fsm decides, and gives the buckets it creates now one window; buckets
// of 0d70e03 have windows of 2^20 records). Records written by versions
// before windows keep their 'r' keys (fsm reads both).
package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Key prefixes.
const (
	// PrefixRecord keys records written before write windows (legacy):
	// read, rewritten in place, never created.
	PrefixRecord = 'r'
	// PrefixWindowedRecord keys every record written since.
	PrefixWindowedRecord = 'w'
	PrefixBucket         = 'b'
	PrefixNamespace      = 'n'
	PrefixNode           = 'p'
	PrefixNodeRole       = 'o'
	PrefixMeta           = 'm'
	// PrefixNodeRegion keys a node's region (absent: none recorded).
	PrefixNodeRegion = 'g'
	// PrefixSetting keys a replicated cluster setting.
	PrefixSetting = 's'
	// PrefixRetiredNode keys a node ID removed from the cluster: never
	// admitted again (a removed ID's old data dir could otherwise come
	// back and vote as the new node of that ID).
	PrefixRetiredNode = 'x'
)

// RecordKeyPrefixLen is the length of 'r' nsID bucket, before the ID: a
// lower bound of every record key's length but the ID's.
const RecordKeyPrefixLen = 1 + 4 + 8

// WindowedRecordKeyPrefixLen is the length of 'w' nsID bucket window,
// before the ID.
const WindowedRecordKeyPrefixLen = RecordKeyPrefixLen + 4

// Loc says where in its bucket a record's key is: LegacyLoc for the 'r'
// key of a record written before windows, window+1 for a windowed key.
type Loc uint32

// LegacyLoc is the Loc of a record under its legacy 'r' key.
const LegacyLoc Loc = 0

// WindowLoc is the Loc of window w.
func WindowLoc(w uint32) Loc { return Loc(w) + 1 }

// AppendRecordKey appends the key of id at loc in (nsID, bucket) to dst.
func AppendRecordKey(dst []byte, nsID uint32, bucket uint64, loc Loc, id []byte) []byte {
	if loc == LegacyLoc {
		dst = append(dst, PrefixRecord)
	} else {
		dst = append(dst, PrefixWindowedRecord)
	}
	dst = binary.BigEndian.AppendUint32(dst, nsID)
	dst = binary.BigEndian.AppendUint64(dst, bucket)
	if loc != LegacyLoc {
		dst = binary.BigEndian.AppendUint32(dst, uint32(loc-1))
	}
	return append(dst, id...)
}

// KeyRange is a [Start, End) key range.
type KeyRange struct{ Start, End []byte }

// BucketRanges returns the key ranges holding every record of (nsID,
// bucket): its legacy range, then its windowed one.
func BucketRanges(nsID uint32, bucket uint64) [2]KeyRange {
	var out [2]KeyRange
	for i, prefix := range recordPrefixes {
		out[i] = bucketRange(prefix, nsID, bucket)
	}
	return out
}

func bucketRange(prefix byte, nsID uint32, bucket uint64) KeyRange {
	start := binary.BigEndian.AppendUint64(append([]byte{prefix}, binary.BigEndian.AppendUint32(nil, nsID)...), bucket)
	if bucket == ^uint64(0) {
		return KeyRange{start, namespaceEnd(prefix, nsID)}
	}
	return KeyRange{start, binary.BigEndian.AppendUint64(start[:5:5], bucket+1)}
}

// NamespaceRecordRanges returns the key ranges holding every record of
// nsID, across all buckets: legacy, then windowed.
func NamespaceRecordRanges(nsID uint32) [2]KeyRange {
	var out [2]KeyRange
	for i, prefix := range recordPrefixes {
		out[i] = KeyRange{append([]byte{prefix}, binary.BigEndian.AppendUint32(nil, nsID)...), namespaceEnd(prefix, nsID)}
	}
	return out
}

// RecordRanges returns the key ranges holding every record: legacy, then
// windowed.
func RecordRanges() [2]KeyRange {
	var out [2]KeyRange
	for i, prefix := range recordPrefixes {
		out[i] = KeyRange{[]byte{prefix}, []byte{prefix + 1}}
	}
	return out
}

var recordPrefixes = [2]byte{PrefixRecord, PrefixWindowedRecord}

// namespaceEnd is the first key after every record of nsID under prefix.
func namespaceEnd(prefix byte, nsID uint32) []byte {
	if nsID == ^uint32(0) {
		return []byte{prefix + 1}
	}
	return append([]byte{prefix}, binary.BigEndian.AppendUint32(nil, nsID+1)...)
}

// IsRecordKey reports whether key is a record's, legacy or windowed.
func IsRecordKey(key []byte) bool {
	return len(key) > 0 && (key[0] == PrefixRecord || key[0] == PrefixWindowedRecord)
}

// ParseRecordKey splits a record key, legacy or windowed. ok is false for
// keys of other kinds or malformed keys.
func ParseRecordKey(key []byte) (nsID uint32, bucket uint64, loc Loc, id []byte, ok bool) {
	switch {
	case len(key) > RecordKeyPrefixLen && key[0] == PrefixRecord:
		return binary.BigEndian.Uint32(key[1:5]), binary.BigEndian.Uint64(key[5:13]), LegacyLoc, key[RecordKeyPrefixLen:], true
	case len(key) > WindowedRecordKeyPrefixLen && key[0] == PrefixWindowedRecord:
		w := binary.BigEndian.Uint32(key[RecordKeyPrefixLen:WindowedRecordKeyPrefixLen])
		if w == ^uint32(0) {
			return 0, 0, 0, nil, false // WindowLoc(w) would wrap to LegacyLoc
		}
		return binary.BigEndian.Uint32(key[1:5]), binary.BigEndian.Uint64(key[5:13]), WindowLoc(w), key[WindowedRecordKeyPrefixLen:], true
	}
	return 0, 0, 0, nil, false
}

// BucketKey is the registry key of (nsID, bucket).
func BucketKey(nsID uint32, bucket uint64) []byte {
	k := make([]byte, 0, 13)
	k = append(k, PrefixBucket)
	k = binary.BigEndian.AppendUint32(k, nsID)
	return binary.BigEndian.AppendUint64(k, bucket)
}

// ParseBucketKey is the inverse of BucketKey.
func ParseBucketKey(key []byte) (nsID uint32, bucket uint64, ok bool) {
	if len(key) != 13 || key[0] != PrefixBucket {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(key[1:5]), binary.BigEndian.Uint64(key[5:13]), true
}

// NamespaceKey is the key of a namespace config.
func NamespaceKey(name string) []byte { return append([]byte{PrefixNamespace}, name...) }

// NodeKey is the key of a node's client address.
func NodeKey(id string) []byte { return append([]byte{PrefixNode}, id...) }

// NodeRoleKey is the key of a node's role (present for read replicas
// only).
func NodeRoleKey(id string) []byte { return append([]byte{PrefixNodeRole}, id...) }

// NodeRegionKey is the key of a node's region.
func NodeRegionKey(id string) []byte { return append([]byte{PrefixNodeRegion}, id...) }

// RetiredNodeKey is the key recording that node id was removed.
func RetiredNodeKey(id string) []byte { return append([]byte{PrefixRetiredNode}, id...) }

// SettingKey is the key of a cluster setting.
func SettingKey(name string) []byte { return append([]byte{PrefixSetting}, name...) }

// MetaKey is the key of an FSM metadata value.
func MetaKey(name string) []byte { return append([]byte{PrefixMeta}, name...) }

// PrefixEnd returns the first key after every key starting with prefix.
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// DefaultMemTableBytes is Options.MemTableBytes's default. Pebble
// preallocates each WAL file at 110% of it and keeps up to
// MemTableStopWritesThreshold+1 (3) spent WAL files for reuse, so the WAL
// alone can hold about 4.4 × MemTableBytes on disk (141 MiB at the
// default): lower it for a small data volume.
const DefaultMemTableBytes = 32 << 20

// Options tune the Pebble instance. Zero values take the defaults.
type Options struct {
	// CacheBytes is Pebble's block cache size (default 64 MiB).
	CacheBytes int64
	// MemTableBytes is the memtable size (default 32 MiB).
	MemTableBytes uint64
	// Logger receives Pebble's errors; nil discards them.
	Logger *slog.Logger
	// FS is the file system Pebble uses (nil: the OS's). Tests pass
	// vfs.NewCrashableMem to simulate a crash at any point.
	FS vfs.FS
	// DisableWAL turns Pebble's write-ahead log off, for a scratch
	// database that is flushed before anything relies on it (a snapshot
	// restore). Its commit path then never rotates a WAL file, which
	// Pebble does by panicking when the file cannot be written (ENOSPC).
	// Commits must not ask for Sync.
	DisableWAL bool
	// BackgroundError, if set, is called with each error of Pebble's
	// background work (flushes, compactions) after it is logged. Pebble
	// retries a failed flush at once, and for as long as it fails: a caller
	// that cannot wait for space aborts on the first call.
	BackgroundError func(error)
	// BackgroundNice, from 1 to 19, is how much higher than the process's
	// the nice value is (at most 19) of the threads that run Pebble's
	// flushes and compactions and the FSM's buffer commits
	// (DB.Background); 0 leaves them at the process's priority. See
	// background.go for why, and what it asks of GOMAXPROCS. Linux only:
	// elsewhere it is ignored.
	BackgroundNice int
}

// DB is the Pebble database of one FSM.
type DB struct {
	*pebble.DB
	cache *pebble.Cache
	nice  int // Options.BackgroundNice
	// largeBatch is Pebble's large-batch threshold for this memtable size:
	// a committed batch whose memtable footprint reaches it becomes a
	// flushable batch of its own, queued for flush like a memtable,
	// without one skiplist insert per key.
	largeBatch uint64
}

// Pebble's memtable footprint of one batch entry is its skiplist node at
// the tallest height plus the key (with an 8-byte trailer) and the value
// (arenaskl.MaxNodeSize: 20 levels × 8 bytes of links + a 24-byte header
// + alignment). nodeOverheadLowerBound is a lower bound of that overhead
// net of the entry's bytes in the batch representation, so
// LargeBatch never claims a batch is large when Pebble would insert it
// into the memtable key by key; memtableEmptyBytes is an upper bound of
// the arena an empty memtable uses (Pebble subtracts it before halving).
const (
	nodeOverheadLowerBound = 160
	memtableEmptyBytes     = 16 << 10
)

// LargeBatch reports whether committing a batch of count entries and
// bytes bytes (pebble.Batch Len and Count) hands it to Pebble as a
// flushable batch (no memtable skiplist insert). It errs on the side of
// "not yet": a batch it calls large is large to Pebble.
func (d *DB) LargeBatch(bytes, count int) bool {
	return uint64(bytes)+nodeOverheadLowerBound*uint64(count) >= d.largeBatch
}

// dataBlockBytes is the sstable data block size (Pebble's default is
// 4 KiB; CockroachDB uses 32 KiB). Every compaction rewrites the store's
// records block by block, and part of its work is per block: finishing
// the block, its index entry, and one write(2) each (write(2) alone was
// 7 % of a 3-node write load's CPU with 4 KiB blocks). In five
// alternated pairs of 3-node write loads over an aging store, 16 KiB
// blocks acknowledged more IDs in every pair (+10 % on average) at less
// CPU per ID (-11 %) (bench/results/2026-12-03-pebble-knobs.md). The
// price: a read of a present key past the block cache reads and checksums
// 16 KiB instead of 4 (checks of just-marked IDs measured within this
// machine's wide noise); a lookup of an absent key stops at the filters.
const dataBlockBytes = 16 << 10

// l0CompactionThreshold is the L0 read amplification (sublevels) at which
// Pebble compacts L0 into the base level. Every flush of the FSM's write
// buffer (a flushable batch of ≈ 5 MiB) adds one sublevel; a Get of a
// present key probes the sstable Bloom filters of the sublevels above it.
const l0CompactionThreshold = 16

// Open opens (creating if needed) the database in dir.
//
// Options chosen for the workload (see DESIGN.md): the newest on-disk
// format; 10-bit sstable Bloom filters so a Get of a missing key skips
// files; no compression, since random message IDs do not compress;
// 16 KiB data blocks (dataBlockBytes); a
// larger memtable and cache than Pebble's defaults to avoid write stalls;
// L0 compacted into the base level once it holds 16 sublevels rather than
// 4: random IDs spread every L0 file over the whole key space, so each L0
// compaction rewrites the whole base level, and waiting for 4× more L0
// data rewrites it 4× less often (compaction bytes per ID 2–4× lower,
// docs/PERFORMANCE.md "L0 compaction threshold"). Pebble's WAL stays on
// but unsynced: the Raft log is the durable record, and the FSM syncs
// explicitly before every snapshot (see fsm/DESIGN.md).
func Open(dir string, o Options) (*DB, error) {
	if o.CacheBytes <= 0 {
		o.CacheBytes = 64 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = DefaultMemTableBytes
	}
	// Pebble charges every memtable and every queued flushable batch to
	// the block cache (Cache.Reserve) until it is flushed. The FSM commits
	// its write buffer as flushable batches, so with a cache of CacheBytes
	// alone those reservations took all of it: a node after a write load
	// held 0 bytes of blocks (4 % hits), and every read past the Bloom
	// filters read its filter, index and data blocks from the file. The
	// cache is sized so CacheBytes stay for blocks with as many memtables
	// queued as Pebble allows before it stops writes, plus the one filling.
	cache := pebble.NewCache(o.CacheBytes + int64(memTableStopWritesThreshold+1)*int64(o.MemTableBytes))
	opts := &pebble.Options{
		FS:                          o.FS,
		Cache:                       cache,
		MemTableSize:                o.MemTableBytes,
		FormatMajorVersion:          pebble.FormatNewest,
		Logger:                      logger{o.Logger},
		L0CompactionThreshold:       l0CompactionThreshold,
		L0StopWritesThreshold:       64,
		MemTableStopWritesThreshold: memTableStopWritesThreshold,
		LBaseMaxBytes:               64 << 20,
		CompactionConcurrencyRange:  func() (int, int) { return 1, 1 },
		DisableWAL:                  o.DisableWAL,
	}
	if o.BackgroundError != nil {
		lg, report := logger{o.Logger}, o.BackgroundError
		opts.EventListener = &pebble.EventListener{BackgroundError: func(err error) {
			lg.Errorf("background error: %s", err)
			report(err)
		}}
	}
	if o.BackgroundNice != 0 {
		if o.BackgroundNice < 0 || o.BackgroundNice > 19 {
			cache.Unref()
			return nil, fmt.Errorf("background nice value %d: want 0 (off) to 19", o.BackgroundNice)
		}
		if opts.EventListener == nil {
			opts.EventListener = &pebble.EventListener{}
		}
		lowerBackgroundPriority(opts.EventListener, o.BackgroundNice)
	}
	for i := range opts.Levels {
		opts.Levels[i].BlockSize = dataBlockBytes
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		cache.Unref()
		return nil, fmt.Errorf("open pebble at %s: %w", dir, err)
	}
	// Pebble: (MemTableSize - empty memtable) / 2; a margin above it, so a
	// small error in the lower-bound estimate never lands just short.
	large := (o.MemTableBytes-memtableEmptyBytes)/2 + 64<<10
	return &DB{DB: db, cache: cache, largeBatch: large, nice: o.BackgroundNice}, nil
}

// memTableStopWritesThreshold is Pebble's default, named because the block
// cache is sized by it (Open).
const memTableStopWritesThreshold = 2

// Close closes the database and releases the cache.
func (d *DB) Close() error {
	err := d.DB.Close()
	d.cache.Unref()
	return err
}

// GetCopy returns a copy of the value at key, or found=false.
func GetCopy(r pebble.Reader, key []byte) (val []byte, found bool, err error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	val = append([]byte(nil), v...)
	return val, true, closer.Close()
}

// RecordReader reads records by key through one iterator kept from read
// to read: a run of lookups (the applier's, or one lookup's seeks of the
// write windows of a bucket) pays the iterator's setup once, and a seek
// that lands in a file an earlier one opened (every L0 file of a store of
// random IDs spans a whole window) finds it open. The iterator sees the
// database as it was at the first Get after creation or Release, so its
// owner releases it whenever the database changes in a way its reads must
// see, and before the database closes. Not safe for concurrent use. The
// zero value is ready.
//
// Most lookups are of absent keys: IDs our Bloom filters answered "maybe"
// for, nearly always a false positive, and the windows a duplicate is not
// in. Pebble's Get skips the sstable filters of the last level (L6),
// whose blocks CockroachDB's Gets rarely pay for; here every false
// positive would then read an L6 index and data block, mostly from disk,
// once the data outgrows the block cache. An iterator asked to use the L6
// filters answers most such lookups from the filter block alone; for
// present keys it measured no slower on a fresh store (docs/PERFORMANCE.md,
// which also notes what is still open). The key must be a whole key (the
// default comparer's Split is the identity), so a prefix seek finds it or
// nothing.
type RecordReader struct {
	it *pebble.Iterator
}

// Get appends the value of the record at key in d to dst, returning
// found=false if absent. d must be the database of every Get since the
// last Release.
func (r *RecordReader) Get(d *DB, key, dst []byte) ([]byte, bool, error) {
	if r.it == nil {
		it, err := d.NewIter(&pebble.IterOptions{UseL6Filters: true})
		if err != nil {
			return dst, false, err
		}
		r.it = it
	}
	if !r.it.SeekPrefixGE(key) || !bytes.Equal(r.it.Key(), key) {
		return dst, false, r.it.Error()
	}
	v, err := r.it.ValueAndErr()
	if err != nil {
		return dst, false, err
	}
	return append(dst, v...), true, nil
}

// Release closes the iterator, if any; the next Get opens a new one.
func (r *RecordReader) Release() error {
	if r.it == nil {
		return nil
	}
	err := r.it.Close()
	r.it = nil
	return err
}

type logger struct{ l *slog.Logger }

func (l logger) Infof(string, ...any) {}
func (l logger) Errorf(format string, args ...any) {
	if l.l != nil {
		l.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	}
}
func (l logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if l.l != nil {
		l.l.Error(msg, "component", "pebble", "fatal", true)
	}
	panic("pebble: " + msg)
}

var _ io.Closer = (*DB)(nil)
