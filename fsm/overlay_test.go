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
// table holds, with hashes that share their tags or their low bits (so
// probe sequences cross and tags alone cannot tell keys apart), replaces
// some of them after the table grew, and finds every key with its newest
// entry, and no key that was never put.
func TestOverlay_GrowsPastItsFirstTable(t *testing.T) {
	o := newOverlay()
	n := 20 * minOverlayTable
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%d", i) }
	hash := func(i int) uint64 {
		if i%2 == 0 {
			return uint64(i%13) << 32 // 13 tags, low bits 0
		}
		return 5<<32 | uint64(i%97) // one tag, 97 starting cells
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
}
