package bloom

import (
	"encoding/binary"
	"testing"
)

// Screen answers for a batch what Candidates answers for each ID: "maybe"
// exactly when some bucket's chain may hold it, so never "no" for an ID
// that was added, across growth segments, short filters and several
// namespaces; and nothing while the filters are not ready.
func TestScreenAgreesWithCandidates(t *testing.T) {
	f := New(Config{ExpectedPerBucket: 1000})
	id := make([]byte, 8)
	key := func(ns uint32, i int) []byte {
		binary.BigEndian.PutUint64(id, uint64(i))
		return HashKey(nil, ns, id)
	}
	// Namespace 1: three buckets, one grown far past its first filter;
	// namespace 2: a bucket of a few IDs (a short filter).
	for i := range 20_000 {
		f.Add(Key{1, uint64(i % 3)}, key(1, i))
	}
	for i := range 5 {
		f.Add(Key{2, 9}, key(2, i))
	}
	var ps []Probe
	var keys [][]byte
	for _, ns := range []uint32{1, 2, 3} {
		for i := range 40_000 { // the first 20 000 were added to namespace 1
			keys = append(keys, key(ns, i))
		}
	}
	ps = make([]Probe, len(keys))
	maybe := make([]bool, len(keys))
	if f.Screen(1, ps[:1], maybe[:1]) {
		t.Fatal("Screen answered before the filters were ready")
	}
	f.SetReady(true)
	for start := 0; start < len(keys); start += 16 {
		end := min(start+16, len(keys))
		ns := uint32(1 + start/40_000)
		for i := start; i < end; i++ {
			ps[i].Reset(keys[i])
		}
		if !f.Screen(ns, ps[start:end], maybe[start:end]) {
			t.Fatal("Screen: filters not ready")
		}
	}
	added, maybes := 0, 0
	var p Probe
	for i, k := range keys {
		ns := uint32(1 + i/40_000)
		p.Reset(k)
		cands, _ := f.Candidates(ns, &p, nil)
		if maybe[i] != (len(cands) > 0) {
			t.Fatalf("ID %d of namespace %d: Screen says maybe=%v, Candidates %v", i%40_000, ns, maybe[i], cands)
		}
		if (ns == 1 && i%40_000 < 20_000) || (ns == 2 && i%40_000 < 5) {
			added++
			if !maybe[i] {
				t.Fatalf("ID %d of namespace %d was added but screened out", i%40_000, ns)
			}
		}
		if maybe[i] {
			maybes++
		}
	}
	if fp := maybes - added; fp > 20_000/20 {
		t.Fatalf("%d false positives among %d absent IDs", fp, len(keys)-added)
	}
}
