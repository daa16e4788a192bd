package fsm

import (
	"fmt"
	"testing"
)

// TestOverlay_EqualHashesKeepKeysApart forces every key onto one hash, so
// lookups must walk the chain and compare whole keys; a later put of a key
// replaces its entry; reset empties the overlay.
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
	if _, ok := o.getHash(8, key(1)); ok {
		t.Fatal("key found under another hash")
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
