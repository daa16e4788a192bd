package storage

import (
	"bytes"
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
