package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// Every record of a bucket, legacy or in any window, lies in one of its
// BucketRanges, and no record of another bucket or namespace does: a
// bucket's expiry is one range deletion per layout.
func TestBucketRangesHoldExactlyTheirRecords(t *testing.T) {
	in := func(k []byte, rs [2]KeyRange) bool {
		for _, r := range rs {
			if bytes.Compare(k, r.Start) >= 0 && bytes.Compare(k, r.End) < 0 {
				return true
			}
		}
		return false
	}
	for _, bucket := range []uint64{10, ^uint64(0)} {
		rs := BucketRanges(3, bucket)
		for _, loc := range []Loc{LegacyLoc, WindowLoc(0), WindowLoc(7), WindowLoc(^uint32(0) - 1)} {
			own := AppendRecordKey(nil, 3, bucket, loc, []byte{0xff, 0xff, 0xff})
			if !in(own, rs) {
				t.Fatalf("bucket %d: own key %x (loc %d) outside its ranges", bucket, own, loc)
			}
			ns, b, l, id, ok := ParseRecordKey(own)
			if !ok || ns != 3 || b != bucket || l != loc || !bytes.Equal(id, []byte{0xff, 0xff, 0xff}) {
				t.Fatalf("parse %x: %d %d %d %x %v", own, ns, b, l, id, ok)
			}
			for _, other := range [][]byte{
				AppendRecordKey(nil, 3, bucket-1, loc, []byte{0xff}),
				AppendRecordKey(nil, 4, 0, loc, []byte("a")),
				AppendRecordKey(nil, 2, bucket, loc, []byte("a")),
				AppendRecordKey(nil, 2, ^uint64(0), loc, []byte{0xff}),
			} {
				if in(other, rs) {
					t.Fatalf("bucket %d: key %x of another bucket falls in its ranges", bucket, other)
				}
			}
		}
	}
	if _, _, _, _, ok := ParseRecordKey(BucketKey(3, 10)); ok {
		t.Fatal("a registry key parsed as a record key")
	}
}

func TestDeleteRangeDropsOneBucketOnly(t *testing.T) {
	db, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	locs := []Loc{LegacyLoc, WindowLoc(0), WindowLoc(3)}
	for b := uint64(1); b <= 3; b++ {
		for _, loc := range locs {
			for _, id := range []string{"a", "b"} {
				if err := db.Set(AppendRecordKey(nil, 1, b, loc, []byte(id)), []byte("v"), pebble.NoSync); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, r := range BucketRanges(1, 2) {
		if err := db.DeleteRange(r.Start, r.End, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	for b := uint64(1); b <= 3; b++ {
		for _, loc := range locs {
			_, found, err := GetCopy(db, AppendRecordKey(nil, 1, b, loc, []byte("a")))
			if err != nil {
				t.Fatal(err)
			}
			if found == (b == 2) {
				t.Fatalf("bucket %d loc %d: found=%v after dropping bucket 2", b, loc, found)
			}
		}
	}
}

// Pebble charges its memtables to the block cache. With a cache no larger
// than one memtable (as 64 MiB was against a 32 MiB memtable and the FSM's
// queued flushable batches), no block stayed cached: every read of an
// sstable went to the file. Open sizes the cache so CacheBytes remain for
// blocks.
func TestBlockCacheKeepsBlocksBesideTheMemtables(t *testing.T) {
	db, err := Open(t.TempDir(), Options{CacheBytes: 1 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := func(i int) []byte { return AppendRecordKey(nil, 1, 1, WindowLoc(0), fmt.Appendf(nil, "id-%06d", i)) }
	b := db.NewBatch()
	for i := range 10_000 {
		if err := b.Set(key(i), bytes.Repeat([]byte{'v'}, 40), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil { // the records now live in an sstable
		t.Fatal(err)
	}
	before := db.Metrics().BlockCache
	for range 3 {
		for i := 0; i < 10_000; i += 97 {
			if _, found, err := GetCopy(db, key(i)); err != nil || !found {
				t.Fatalf("get %s: found=%v err=%v", key(i), found, err)
			}
		}
	}
	after := db.Metrics().BlockCache
	hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
	if after.Size == 0 || hits <= misses {
		t.Fatalf("block cache holds %d bytes after reading the same blocks three times: %d hits, %d misses", after.Size, hits, misses)
	}
}

// A RecordReader must answer exactly as Get does wherever the key lives
// (memtable, L0, the last level, under a newer deletion), whether it serves
// one lookup or many, and for an absent key in the last level it must be
// the L6 sstable filter, not a data block read, that says so: that is the
// whole reason it is not a Get.
func TestRecordReaderAnswersAsGetAndUsesTheLastLevelFilters(t *testing.T) {
	db, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := func(i int) []byte { return AppendRecordKey(nil, 1, 7, WindowLoc(0), fmt.Appendf(nil, "id-%05d", i)) }
	for i := 0; i < 2000; i += 2 { // even IDs present, odd absent
		if err := db.Set(key(i), fmt.Appendf(nil, "v%d", i), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	r7 := BucketRanges(1, 7)[1]
	if err := db.Compact(t.Context(), r7.Start, r7.End, true); err != nil {
		t.Fatal(err)
	}
	if n := db.Metrics().Levels[6].TablesCount; n == 0 {
		t.Fatal("setup: no table in L6 after a full compaction")
	}
	// Newer layers above L6: an update, a deletion, a new key in the memtable.
	for _, w := range []struct {
		i   int
		del bool
	}{{0, false}, {2, true}, {1, false}} {
		var err error
		if w.del {
			err = db.Delete(key(w.i), pebble.NoSync)
		} else {
			err = db.Set(key(w.i), []byte("new"), pebble.NoSync)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	probes := [][]byte{
		key(0), key(1), key(2), key(4), key(3), key(1999), key(1998),
		key(4)[:len(key(4))-1], // a prefix of a present key
		append(key(4), 0),      // a present key extended by one byte
		AppendRecordKey(nil, 1, 8, WindowLoc(0), []byte("id-00004")), // same ID, next bucket
		AppendRecordKey(nil, 1, 7, WindowLoc(1), []byte("id-00004")), // same ID, next window
	}
	// One RecordReader serves every probe, twice over, so its seeks go
	// back and forth over the files it keeps open.
	var r RecordReader
	defer r.Release()
	for round := range 2 {
		for _, k := range probes {
			want, wantOK, err := GetCopy(db, k)
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := getOnce(db, k, []byte("prefix:"))
			if err != nil {
				t.Fatal(err)
			}
			if ok != wantOK || !bytes.Equal(got, append([]byte("prefix:"), want...)) {
				t.Fatalf("key %q: a RecordReader of its own = %q, %v; Get = %q, %v", k, got, ok, want, wantOK)
			}
			got, ok, err = r.Get(db, k, []byte("prefix:"))
			if err != nil {
				t.Fatal(err)
			}
			if ok != wantOK || !bytes.Equal(got, append([]byte("prefix:"), want...)) {
				t.Fatalf("round %d, key %q: RecordReader.Get = %q, %v; Get = %q, %v", round, k, got, ok, want, wantOK)
			}
		}
	}

	before := db.Metrics().Filter.Hits
	for i := 1001; i < 2000; i += 2 {
		if _, ok, err := getOnce(db, key(i), nil); err != nil || ok {
			t.Fatalf("absent key %d: found=%v err=%v", i, ok, err)
		}
	}
	// 500 absent keys, 10-bit filters: about 1 % pass the filter.
	if hits := db.Metrics().Filter.Hits - before; hits < 400 {
		t.Fatalf("L6 filter avoided %d data block reads of 500 absent keys, want most", hits)
	}
}

// A RecordReader answers from the database as it was at its first Get
// until it is released: the FSM releases it whenever a committed buffer
// leaves the overlays, and this is why it must.
func TestRecordReaderKeepsItsViewUntilReleased(t *testing.T) {
	db, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	older, newer := AppendRecordKey(nil, 1, 7, WindowLoc(0), []byte("older")), AppendRecordKey(nil, 1, 7, WindowLoc(0), []byte("newer"))
	if err := db.Set(older, []byte("v1"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	var r RecordReader
	defer r.Release()
	if v, ok, err := r.Get(db, older, nil); err != nil || !ok || string(v) != "v1" {
		t.Fatalf("older: %q, %v, %v; want v1", v, ok, err)
	}
	if err := db.Set(newer, []byte("v2"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(older, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r.Get(db, newer, nil); err != nil || ok {
		t.Fatalf("newer before Release: found=%v err=%v; the reader's view predates it", ok, err)
	}
	if v, ok, err := r.Get(db, older, nil); err != nil || !ok || string(v) != "v1" {
		t.Fatalf("older before Release: %q, %v, %v; want v1 (deleted after the view)", v, ok, err)
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := r.Get(db, newer, nil); err != nil || !ok || string(v) != "v2" {
		t.Fatalf("newer after Release: %q, %v, %v; want v2", v, ok, err)
	}
	if _, ok, err := r.Get(db, older, nil); err != nil || ok {
		t.Fatalf("older after Release: found=%v err=%v; want deleted", ok, err)
	}
}

// getOnce reads key through a RecordReader of its own, as a Check's lookup
// does.
func getOnce(db *DB, key, dst []byte) ([]byte, bool, error) {
	var r RecordReader
	v, ok, err := r.Get(db, key, dst)
	return v, ok, errors.Join(err, r.Release())
}

// threadNice reads the nice value of the calling goroutine's OS thread
// (field 19 of /proc/thread-self/stat); the caller locks its thread.
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Skipf("no /proc/thread-self: %v", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	n, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatalf("nice in %q: %v", b, err)
	}
	return n
}

// TestBackgroundWorkRunsAtItsOwnLowerPriority: with BackgroundNice, the
// FSM's commits (DB.Background) and Pebble's flushes and compactions
// (the listener Open installs, called by Pebble on each job's own
// goroutine) run on threads at that nice value, and the caller's thread
// keeps its priority: nothing else ever runs at the lowered one.
func TestBackgroundWorkRunsAtItsOwnLowerPriority(t *testing.T) {
	if !CanLowerPriority {
		t.Skip("thread priorities are Linux only")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base := threadNice(t)
	if base >= 19-7 {
		t.Skipf("the test runs at nice %d already", base)
	}

	d, err := Open(t.TempDir(), Options{BackgroundNice: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var inside int
	d.Background(func() { inside = threadNice(t) })
	want := base + 7
	if inside != want {
		t.Fatalf("DB.Background ran fn at nice %d, want %d (7 below the caller's %d)", inside, want, base)
	}
	if got := threadNice(t); got != base {
		t.Fatalf("the caller's thread is at nice %d after DB.Background, want %d", got, base)
	}

	var l pebble.EventListener
	var flushNice, compactionNice atomic.Int64
	l.FlushBegin = func(pebble.FlushInfo) { flushNice.Store(int64(threadNice(t))) }
	l.CompactionBegin = func(pebble.CompactionInfo) { compactionNice.Store(int64(threadNice(t))) }
	lowerBackgroundPriority(&l, 7)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.FlushBegin(pebble.FlushInfo{}) }()
	go func() { defer wg.Done(); l.CompactionBegin(pebble.CompactionInfo{}) }()
	wg.Wait()
	// A new goroutine's thread may be any of the process's: each started
	// at the process's nice (base), as no thread ever returns lowered.
	if flushNice.Load() != int64(want) || compactionNice.Load() != int64(want) {
		t.Fatalf("flush at nice %d, compaction at %d, want %d", flushNice.Load(), compactionNice.Load(), want)
	}

	if _, err := Open(t.TempDir(), Options{BackgroundNice: 20}); err == nil {
		t.Fatal("BackgroundNice 20 accepted")
	}
}
