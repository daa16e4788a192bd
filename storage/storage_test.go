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
