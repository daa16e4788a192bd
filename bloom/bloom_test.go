package bloom

import (
	"bytes"
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
