package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

func TestChainKeepsFalsePositiveRateUnderTarget(t *testing.T) {
	f := New(Config{ExpectedPerBucket: 1000, FPRate: 0.01})
	k := Key{Namespace: 1, Bucket: 7}
	// 10x the expected count forces the chain to grow.
	for i := range 10_000 {
		f.Add(k, HashKey(nil, 1, fmt.Appendf(nil, "in-%d", i)))
	}
	for i := range 10_000 {
		if !f.MayContain(k, HashKey(nil, 1, fmt.Appendf(nil, "in-%d", i))) {
			t.Fatalf("added id %d not found: a Bloom filter has no false negatives", i)
		}
	}
	fp := 0
	const probes = 50_000
	for i := range probes {
		if f.MayContain(k, HashKey(nil, 1, fmt.Appendf(nil, "out-%d", i))) {
			fp++
		}
	}
	if rate := float64(fp) / probes; rate > 0.015 {
		t.Fatalf("false-positive rate %.4f above target 0.01 (+50%% slack)", rate)
	}
	st := f.Stats()
	if st.Filters < 2 || st.IDs != 10_000 {
		t.Fatalf("stats %+v: want a grown chain holding 10000 ids", st)
	}
}

func TestDropForgetsBucketAndNamespaceIsolation(t *testing.T) {
	f := New(Config{})
	a, b := Key{1, 1}, Key{1, 2}
	f.Add(a, HashKey(nil, 1, []byte("x")))
	f.Add(b, HashKey(nil, 1, []byte("y")))
	f.Add(Key{2, 1}, HashKey(nil, 2, []byte("x")))
	f.Drop(a)
	if f.MayContain(a, HashKey(nil, 1, []byte("x"))) {
		t.Fatal("dropped bucket still answers maybe")
	}
	f.DropNamespace(1)
	if f.MayContain(b, HashKey(nil, 1, []byte("y"))) {
		t.Fatal("dropped namespace still answers maybe")
	}
	if !f.MayContain(Key{2, 1}, HashKey(nil, 2, []byte("x"))) {
		t.Fatal("other namespace lost its filter")
	}
}

func TestObservedRateCountsOnlyAbsentLookups(t *testing.T) {
	f := New(Config{})
	f.Observe(false, false) // true negative
	f.Observe(true, false)  // false positive
	f.Observe(true, true)   // present
	f.Observe(false, false)
	st := f.Stats()
	if st.FalsePositives != 1 || st.MaybeLookups != 2 {
		t.Fatalf("counters %+v", st)
	}
	if want := 1.0 / 3; st.ObservedFPRate != want {
		t.Fatalf("observed rate %v, want %v", st.ObservedFPRate, want)
	}
}

func TestSaveLoadRoundTripAndCorruptionRejected(t *testing.T) {
	f := New(Config{ExpectedPerBucket: 100})
	for i := range 500 {
		f.Add(Key{1, uint64(i % 3)}, HashKey(nil, 1, fmt.Appendf(nil, "id-%d", i)))
	}
	var buf bytes.Buffer
	if err := f.Save(&buf, 42); err != nil {
		t.Fatal(err)
	}
	g := New(Config{ExpectedPerBucket: 100})
	idx, err := g.Load(bytes.NewReader(buf.Bytes()))
	if err != nil || idx != 42 || !g.Ready() {
		t.Fatalf("load: idx=%d err=%v ready=%v", idx, err, g.Ready())
	}
	for i := range 500 {
		if !g.MayContain(Key{1, uint64(i % 3)}, HashKey(nil, 1, fmt.Appendf(nil, "id-%d", i))) {
			t.Fatalf("loaded filters lost id %d", i)
		}
	}
	bad := bytes.Clone(buf.Bytes())
	bad[len(bad)/2] ^= 1
	h := New(Config{ExpectedPerBucket: 100})
	if _, err := h.Load(bytes.NewReader(bad)); !errors.Is(err, ErrBadFilterFile) || h.Ready() {
		t.Fatalf("corrupt file: err=%v ready=%v", err, h.Ready())
	}
	other := New(Config{ExpectedPerBucket: 200})
	if _, err := other.Load(bytes.NewReader(buf.Bytes())); !errors.Is(err, ErrBadFilterFile) {
		t.Fatalf("parameter mismatch accepted: %v", err)
	}
}

func TestCandidatesNewestFirstAndReadiness(t *testing.T) {
	f := New(Config{})
	id := HashKey(nil, 1, []byte("x"))
	for _, b := range []uint64{5, 2, 9} {
		f.Add(Key{1, b}, id)
	}
	f.Add(Key{1, 7}, HashKey(nil, 1, []byte("y")))
	f.Add(Key{2, 4}, HashKey(nil, 2, []byte("x")))
	var p Probe
	p.Reset(id)
	if _, ready := f.Candidates(1, &p, nil); ready {
		t.Fatal("not-ready filters must say so")
	}
	f.SetReady(true)
	got, _ := f.Candidates(1, &p, nil)
	if fmt.Sprint(got) != "[9 5 2]" {
		t.Fatalf("candidates %v, want [9 5 2]", got)
	}
	f.Drop(Key{1, 5})
	f.DropNamespace(2)
	got, _ = f.Candidates(1, &p, nil)
	if fmt.Sprint(got) != "[9 2]" {
		t.Fatalf("after drop: candidates %v, want [9 2]", got)
	}
}

// A new bucket's first filter is sized like the namespace's newest bucket,
// so a steady load tests one filter per bucket.
func TestNewChainSizedLikeNewestBucket(t *testing.T) {
	f := New(Config{ExpectedPerBucket: 100})
	for i := range 1000 {
		f.Add(Key{1, 1}, HashKey(nil, 1, fmt.Appendf(nil, "a-%d", i)))
	}
	if n := len(f.chains[Key{1, 1}].segs); n < 3 {
		t.Fatalf("first bucket: %d segments, want a grown chain", n)
	}
	for i := range 1000 {
		f.Add(Key{1, 2}, HashKey(nil, 1, fmt.Appendf(nil, "b-%d", i)))
	}
	if n := len(f.chains[Key{1, 2}].segs); n != 1 {
		t.Fatalf("second bucket: %d segments, want 1", n)
	}
	f.AddIfLive(Key{1, 3}, HashKey(nil, 1, []byte("c")), 5000, func(Key) bool { return true })
	if l := f.chains[Key{1, 3}].segs[0].limit; l != 5000 {
		t.Fatalf("rebuild size hint: first segment holds %d, want 5000", l)
	}
}

// BenchmarkLookup24Buckets is one lookup of an absent ID across 24 live
// buckets of 100 000 IDs each (a day of 1-hour buckets).
func BenchmarkLookup24Buckets(b *testing.B) {
	f := New(Config{})
	id := make([]byte, 16)
	for bk := range uint64(24) {
		for i := range 100_000 {
			binary.BigEndian.PutUint64(id, bk)
			binary.BigEndian.PutUint64(id[8:], uint64(i))
			f.Add(Key{1, bk}, HashKey(nil, 1, id))
		}
	}
	f.SetReady(true)
	var p Probe
	var dst []uint64
	var hk []byte
	b.Run("Candidates", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			binary.BigEndian.PutUint64(id, 1<<40+uint64(i))
			hk = HashKey(hk[:0], 1, id)
			p.Reset(hk)
			dst, _ = f.Candidates(1, &p, dst[:0])
		}
	})
	b.Run("MayContainPerBucket", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			binary.BigEndian.PutUint64(id, 1<<40+uint64(i))
			hk = HashKey(hk[:0], 1, id)
			for bk := range uint64(24) {
				f.MayContain(Key{1, bk}, hk)
			}
		}
	})
}

func BenchmarkHashKey(b *testing.B) {
	id := []byte("0123456789abcdef")
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = HashKey(dst[:0], 7, id)
	}
}

// failingWriter fails the one write that crosses limit bytes and accepts
// the writes after it, so an error the writer's caller drops leaves a short
// file that would look saved.
type failingWriter struct {
	limit  int
	failed bool
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if !w.failed && len(p) > w.limit {
		w.failed = true
		return w.limit, errors.New("disk full")
	}
	w.limit -= len(p)
	return len(p), nil
}

// A write that fails anywhere in the file, in the filters' words or in the
// trailing checksum, makes Save return an error rather than leave a short
// file reported as saved.
func TestSaveReportsAFailedWrite(t *testing.T) {
	f := New(Config{ExpectedPerBucket: 100_000})
	k := Key{Namespace: 1, Bucket: 1}
	for i := range 1000 {
		f.Add(k, HashKey(nil, 1, fmt.Appendf(nil, "id-%d", i)))
	}
	var full bytes.Buffer
	if err := f.Save(&full, 7); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{0, 100, full.Len() / 2, full.Len() - 1} {
		if err := f.Save(&failingWriter{limit: limit}, 7); err == nil {
			t.Errorf("Save into a writer failing after %d of %d bytes reported success", limit, full.Len())
		}
	}
}
