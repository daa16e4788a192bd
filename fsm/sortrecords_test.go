package fsm

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dedupnode/dedupnode/storage"
)

// sortRecords must order records exactly by their Pebble keys, whichever
// way it takes: the split on the ID's first byte (one namespace and bucket,
// many records) or the full sort (several buckets, or few records). The
// IDs include the cases the first-8-bytes integer cannot tell apart: IDs
// shorter than 8 bytes (zero-padded) and IDs sharing their first 8 bytes.
func TestSortRecordsOrdersByKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randomID := func() []byte {
		switch rng.IntN(4) {
		case 0: // short
			id := make([]byte, 1+rng.IntN(7))
			for i := range id {
				id[i] = byte(rng.IntN(256))
			}
			return id
		case 1: // a shared 8-byte head, then a random tail
			return append([]byte("samehead"), byte(rng.IntN(256)), byte(rng.IntN(256)))
		default:
			id := make([]byte, 16)
			for i := range id {
				id[i] = byte(rng.IntN(256))
			}
			return id
		}
	}
	for _, tc := range []struct {
		name    string
		n       int
		buckets int
	}{
		{"one bucket, split", 20000, 1},
		{"one bucket, few records", 100, 1},
		{"several buckets", 20000, 3},
		{"more buckets than maxSortGroups", 20000, 40},
		{"one bucket, two windows and legacy keys", 20000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var enc []byte
			var order []recOrder
			for range tc.n {
				ns, bucket, id := uint32(7), uint64(1000+rng.IntN(tc.buckets)), randomID()
				loc := storage.WindowLoc(0)
				if strings.Contains(tc.name, "windows") {
					loc = storage.Loc(rng.IntN(3)) // legacy, window 0 or window 1
				}
				off := len(enc)
				enc = storage.AppendRecordKey(enc, ns, bucket, loc, id)
				klen := len(enc) - off
				enc = append(enc, "value"...)
				var pre [8]byte
				copy(pre[:], id)
				order = append(order, recOrder{ns: ns, bucket: bucket, loc: loc, pre: binary.BigEndian.Uint64(pre[:]),
					off: uint32(off), klen: uint16(klen), vlen: 5})
			}
			spare := make([]recOrder, 3) // a spare too small must be grown, not overrun
			sorted, next := sortRecords(order, spare, enc)
			if len(sorted) != tc.n {
				t.Fatalf("sorted %d records of %d", len(sorted), tc.n)
			}
			seen := make(map[uint32]bool, tc.n)
			for i, r := range sorted {
				if seen[r.off] {
					t.Fatalf("record at offset %d twice", r.off)
				}
				seen[r.off] = true
				if i > 0 && bytes.Compare(sorted[i-1].key(enc), r.key(enc)) > 0 {
					t.Fatalf("records %d and %d out of key order: %x > %x", i-1, i, sorted[i-1].key(enc), r.key(enc))
				}
			}
			if len(next) > 0 && &next[0] == &sorted[0] {
				t.Fatal("the spare returned for the next call is the sorted array itself")
			}
		})
	}
}

// BenchmarkSortRecords sorts one buffer's worth of records of one bucket
// with random 16-byte IDs, as a full write buffer's commit does.
func BenchmarkSortRecords(b *testing.B) {
	const n = 100_000
	rng := rand.New(rand.NewPCG(3, 4))
	var enc []byte
	var order []recOrder
	for range n {
		id := make([]byte, 16)
		for i := range id {
			id[i] = byte(rng.IntN(256))
		}
		off := len(enc)
		enc = storage.AppendRecordKey(enc, 7, 1000, storage.WindowLoc(0), id)
		order = append(order, recOrder{ns: 7, bucket: 1000, loc: storage.WindowLoc(0), pre: binary.BigEndian.Uint64(id),
			off: uint32(off), klen: uint16(len(enc) - off)})
	}
	work, spare := make([]recOrder, n), make([]recOrder, n)
	b.ResetTimer()
	for range b.N {
		copy(work, order)
		work, spare = sortRecords(work, spare, enc)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/record")
}
