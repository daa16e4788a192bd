package storage

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestBucketRangeHoldsExactlyItsRecords(t *testing.T) {
	start, end := BucketRange(3, 10)
	in := AppendRecordKey(nil, 3, 10, []byte{0xff, 0xff, 0xff})
	for _, k := range [][]byte{
		AppendRecordKey(nil, 3, 9, []byte{0xff}),
		AppendRecordKey(nil, 3, 11, []byte{0x00}),
		AppendRecordKey(nil, 4, 10, []byte("a")),
		AppendRecordKey(nil, 2, 10, []byte("a")),
	} {
		if bytes.Compare(k, start) >= 0 && bytes.Compare(k, end) < 0 {
			t.Fatalf("key %x of another bucket falls in range", k)
		}
	}
	if bytes.Compare(in, start) < 0 || bytes.Compare(in, end) >= 0 {
		t.Fatal("own key outside range")
	}
	ns, b, id, ok := ParseRecordKey(in)
	if !ok || ns != 3 || b != 10 || !bytes.Equal(id, []byte{0xff, 0xff, 0xff}) {
		t.Fatalf("parse: %d %d %x %v", ns, b, id, ok)
	}
}

func TestDeleteRangeDropsOneBucketOnly(t *testing.T) {
	db, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for b := uint64(1); b <= 3; b++ {
		for _, id := range []string{"a", "b"} {
			if err := db.Set(AppendRecordKey(nil, 1, b, []byte(id)), []byte("v"), pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
	}
	start, end := BucketRange(1, 2)
	if err := db.DeleteRange(start, end, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	for b := uint64(1); b <= 3; b++ {
		_, found, err := GetCopy(db, AppendRecordKey(nil, 1, b, []byte("a")))
		if err != nil {
			t.Fatal(err)
		}
		if found == (b == 2) {
			t.Fatalf("bucket %d: found=%v after dropping bucket 2", b, found)
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
	key := func(i int) []byte { return AppendRecordKey(nil, 1, 1, fmt.Appendf(nil, "id-%06d", i)) }
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

// GetRecordInto must answer exactly as Get does wherever the key lives
// (memtable, L0, the last level, under a newer deletion), and for an absent
// key in the last level it must be the L6 sstable filter, not a data block
// read, that says so: that is the whole reason it exists.
func TestGetRecordIntoAnswersAsGetAndUsesTheLastLevelFilters(t *testing.T) {
	db, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := func(i int) []byte { return AppendRecordKey(nil, 1, 7, fmt.Appendf(nil, "id-%05d", i)) }
	for i := 0; i < 2000; i += 2 { // even IDs present, odd absent
		if err := db.Set(key(i), fmt.Appendf(nil, "v%d", i), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	start, end := BucketRange(1, 7)
	if err := db.Compact(t.Context(), start, end, true); err != nil {
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
		key(4)[:len(key(4))-1],                         // a prefix of a present key
		append(key(4), 0),                              // a present key extended by one byte
		AppendRecordKey(nil, 1, 8, []byte("id-00004")), // same ID, next bucket
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
			got, ok, err := db.GetRecordInto(k, []byte("prefix:"))
			if err != nil {
				t.Fatal(err)
			}
			if ok != wantOK || !bytes.Equal(got, append([]byte("prefix:"), want...)) {
				t.Fatalf("key %q: GetRecordInto = %q, %v; Get = %q, %v", k, got, ok, want, wantOK)
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
		if _, ok, err := db.GetRecordInto(key(i), nil); err != nil || ok {
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
	older, newer := AppendRecordKey(nil, 1, 7, []byte("older")), AppendRecordKey(nil, 1, 7, []byte("newer"))
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
