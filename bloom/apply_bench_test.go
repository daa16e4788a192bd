package bloom

import (
	"encoding/binary"
	"testing"
)

// BenchmarkApplyNewIDs is the filters' share of applying a new ID: a
// Candidates lookup over the namespace's buckets, then an AddProbe to the
// newest, as fsm's apply does for a Mark of a new ID. buckets-1 older
// buckets hold 100 000 IDs each; the newest grows from empty (so it chains
// growth segments, as a surging bucket does between compactions).
//
//	go test ./bloom -run '^$' -bench ApplyNewIDs -benchtime 1000000x
func BenchmarkApplyNewIDs(b *testing.B) {
	for _, buckets := range []int{1, 24} {
		b.Run(map[int]string{1: "buckets=1", 24: "buckets=24"}[buckets], func(b *testing.B) {
			f := New(Config{})
			id := make([]byte, 16)
			var hk []byte
			for bk := range uint64(buckets - 1) {
				for i := range 100_000 {
					binary.BigEndian.PutUint64(id, bk)
					binary.BigEndian.PutUint64(id[8:], uint64(i))
					hk = HashKey(hk[:0], 1, id)
					f.Add(Key{1, bk}, hk)
				}
			}
			f.SetReady(true)
			newest := Key{1, uint64(buckets)}
			var p Probe
			var dst []uint64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				binary.BigEndian.PutUint64(id, uint64(i)*0x9E3779B97F4A7C15)
				binary.BigEndian.PutUint64(id[8:], uint64(i))
				hk = HashKey(hk[:0], 1, id)
				p.Reset(hk)
				dst, _ = f.Candidates(1, &p, dst[:0])
				f.AddProbe(newest, &p)
			}
		})
	}
}
