package fsm

import (
	"fmt"
	"testing"
)

// TestOverlay_EqualHashesKeepKeysApart forces every key onto one hash, so
// lookups must walk the probe sequence and compare whole keys; a later put
// of a key replaces its entry; reset empties the overlay.
func TestOverlay_EqualHashesKeepKeysApart(t *testing.T) {
	o := newOverlay()
	const n = 50
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%d", i) }
	for i := range n {
		o.putHash(7, key(i), ovEntry{bucket: uint64(i), present: true})
	}
	o.putHash(7, key(3), ovEntry{bucket: 1000}) // replaced, not added
	if o.n != n {
		t.Fatalf("%d slots, want %d", o.n, n)
	}
	for i := range n {
		e, ok := o.getHash(7, key(i))
		want := ovEntry{bucket: uint64(i), present: true}
		if i == 3 {
			want = ovEntry{bucket: 1000}
		}
		if !ok || e.bucket != want.bucket || e.present != want.present {
			t.Fatalf("key %d: got %+v, %v; want %+v", i, e, ok, want)
		}
	}
	if _, ok := o.getHash(7, key(n)); ok {
		t.Fatal("absent key with an equal hash found")
	}
	// The real hash, and reset.
	o.put([]byte("x"), ovEntry{present: true})
	if e, ok := o.get([]byte("x")); !ok || !e.present {
		t.Fatalf("get x: %+v, %v", e, ok)
	}
	o.reset()
	for _, k := range [][]byte{[]byte("x"), key(1)} {
		if _, ok := o.get(k); ok {
			t.Fatalf("%q found after reset", k)
		}
	}
}

// TestOverlay_GrowsPastItsFirstTable puts many more keys than the first
// table holds: most with spread hashes (so growth must move them to new
// cells), some sharing one tag and starting at the table's last cell (so
// their probe sequences wrap to the start, at every size), some sharing
// their tags only. It replaces some after the table grew, and finds every
// key with its newest entry and no key that was never put.
func TestOverlay_GrowsPastItsFirstTable(t *testing.T) {
	o := newOverlay()
	n := 20 * minOverlayTable
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%d", i) }
	hash := func(i int) uint64 {
		switch i % 10 {
		case 0:
			return 5<<32 | (1<<31 - 1) // one tag; low bits all ones: the last cell
		case 1:
			return uint64(i%13) << 32 // 13 tags, start cell 0
		}
		return uint64(i) * 0x9E3779B97F4A7C15
	}
	for i := range n {
		o.putHash(hash(i), key(i), ovEntry{bucket: uint64(i), present: true})
	}
	for i := 0; i < n; i += 3 {
		o.putHash(hash(i), key(i), ovEntry{bucket: uint64(i) + 1})
	}
	if o.n != n {
		t.Fatalf("%d slots, want %d", o.n, n)
	}
	if 2*o.n > len(o.table) {
		t.Fatalf("table of %d cells holds %d keys: more than half full", len(o.table), o.n)
	}
	for i := range n {
		e, ok := o.getHash(hash(i), key(i))
		want := ovEntry{bucket: uint64(i), present: true}
		if i%3 == 0 {
			want = ovEntry{bucket: uint64(i) + 1}
		}
		if !ok || e.bucket != want.bucket || e.present != want.present {
			t.Fatalf("key %d: got %+v, %v; want %+v", i, e, ok, want)
		}
	}
	for i := n; i < n+100; i++ {
		if _, ok := o.getHash(hash(i), key(i)); ok {
			t.Fatalf("key %d found, never put", i)
		}
	}
	if want := n - (n+2)/3; o.present != want {
		t.Fatalf("present = %d, want %d", o.present, want)
	}

	// Reused after a reset, as the applier reuses a committed buffer's
	// overlay: the grown table is kept and holds none of the old keys.
	o.reset()
	// Cells left behind would never read as empty again: probe sequences
	// would only lengthen, and a table of stale cells would never end one.
	for c, v := range o.table {
		if v != 0 {
			t.Fatalf("cell %d still in use after reset: %#x", c, v)
		}
	}
	for i := n; i < n+minOverlayTable; i++ {
		o.putHash(hash(i), key(i), ovEntry{bucket: uint64(i), present: true})
	}
	for i := range n + minOverlayTable {
		e, ok := o.getHash(hash(i), key(i))
		if old := i < n; ok == old || (ok && e.bucket != uint64(i)) {
			t.Fatalf("after reset, key %d (put before it: %v): got %+v, %v", i, old, e, ok)
		}
	}
}
