package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// countingStore counts the reads that reach the store behind the cache.
type countingStore struct {
	*raft.InmemStore
	gets atomic.Int64
}

func (s *countingStore) GetLog(idx uint64, l *raft.Log) error {
	s.gets.Add(1)
	return s.InmemStore.GetLog(idx, l)
}

// copyingStore stores copies, as bbolt does (raft.InmemStore keeps the
// caller's *raft.Log).
type copyingStore struct{ *raft.InmemStore }

func (s copyingStore) StoreLogs(logs []*raft.Log) error {
	for _, l := range logs {
		c := *l
		if err := s.InmemStore.StoreLog(&c); err != nil {
			return err
		}
	}
	return nil
}

func entry(idx uint64, size int) *raft.Log {
	return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(idx)}, size)}
}

func storeRange(t *testing.T, c *logCache, from, to uint64, size int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := c.StoreLogs([]*raft.Log{entry(i, size)}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkAll reads [from, to] and returns how many reads reached the store.
func checkAll(t *testing.T, c *logCache, s *countingStore, from, to uint64, size int) int64 {
	t.Helper()
	before := s.gets.Load()
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := c.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		if l.Index != i || !bytes.Equal(l.Data, entry(i, size).Data) {
			t.Fatalf("GetLog(%d) = index %d, %d bytes", i, l.Index, len(l.Data))
		}
	}
	return s.gets.Load() - before
}

func TestLogCache_BoundedByEntriesAndBytes(t *testing.T) {
	for _, tc := range []struct {
		entries, maxBytes, size int
		wantCached              uint64
	}{
		{entries: 8, maxBytes: 1 << 30, size: 100, wantCached: 8},                              // count bound
		{entries: 512, maxBytes: 3 * (1<<20 + logCacheOverhead), size: 1 << 20, wantCached: 3}, // byte bound
		{entries: 512, maxBytes: 1000, size: 1 << 20, wantCached: 1},                           // newest always kept
	} {
		t.Run(fmt.Sprintf("%d_entries_%d_bytes", tc.entries, tc.maxBytes), func(t *testing.T) {
			s := &countingStore{InmemStore: raft.NewInmemStore()}
			c := newLogCache(s, tc.entries, tc.maxBytes)
			storeRange(t, c, 1, 40, tc.size)
			first, last, b := c.cached()
			if last != 40 || last-first+1 != tc.wantCached {
				t.Fatalf("cached [%d, %d], want the newest %d of [1, 40]", first, last, tc.wantCached)
			}
			if want := int(tc.wantCached) * (tc.size + logCacheOverhead); b != want {
				t.Fatalf("cached bytes %d, want %d", b, want)
			}
			if n := checkAll(t, c, s, first, 40, tc.size); n != 0 {
				t.Fatalf("%d reads of cached entries reached the store", n)
			}
			if n := checkAll(t, c, s, 1, first-1, tc.size); n != int64(first-1) {
				t.Fatalf("%d store reads for %d uncached entries", n, first-1)
			}
		})
	}
}

func TestLogCache_DeleteRange(t *testing.T) {
	s := &countingStore{InmemStore: raft.NewInmemStore()}
	c := newLogCache(s, 16, 1<<30)
	storeRange(t, c, 1, 10, 10)

	// Compaction behind a snapshot: a prefix goes, the rest stays cached.
	if err := c.DeleteRange(1, 6); err != nil {
		t.Fatal(err)
	}
	if first, last, b := c.cached(); first != 7 || last != 10 || b != 4*(10+logCacheOverhead) {
		t.Fatalf("after deleting [1, 6]: cached [%d, %d] %d bytes, want [7, 10]", first, last, b)
	}
	var l raft.Log
	if err := c.GetLog(3, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog of a deleted entry: %v, want ErrLogNotFound", err)
	}
	if n := checkAll(t, c, s, 7, 10, 10); n != 0 {
		t.Fatalf("%d store reads for cached entries", n)
	}

	// A follower's conflicting suffix: deleted entries must not be served,
	// and the entries stored instead must be.
	if err := c.DeleteRange(9, 10); err != nil {
		t.Fatal(err)
	}
	if err := c.GetLog(9, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog of a deleted entry: %v, want ErrLogNotFound", err)
	}
	repl := &raft.Log{Index: 9, Term: 2, Data: []byte("new")}
	if err := c.StoreLogs([]*raft.Log{repl}); err != nil {
		t.Fatal(err)
	}
	if err := c.GetLog(9, &l); err != nil || l.Term != 2 || string(l.Data) != "new" {
		t.Fatalf("GetLog(9) = term %d %q, %v; want the replacement", l.Term, l.Data, err)
	}
	checkAll(t, c, s, 7, 8, 10) // still readable (from the store)
}

// The leader hands StoreLogs a pointer into raft's apply future; the cache
// must not keep that future (and the FSM response it holds) alive.
func TestLogCache_DoesNotRetainCallersLog(t *testing.T) {
	c := newLogCache(copyingStore{raft.NewInmemStore()}, 512, 1<<30)
	freed := make(chan struct{})
	func() {
		type future struct {
			log      raft.Log
			response []byte
		}
		f := &future{log: *entry(1, 10), response: make([]byte, 1<<20)}
		runtime.SetFinalizer(f, func(*future) { close(freed) })
		if err := c.StoreLogs([]*raft.Log{&f.log}); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for done := false; !done; {
		runtime.GC()
		select {
		case <-freed:
			done = true
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the stored *raft.Log's enclosing struct was never freed: the cache retains it")
			}
		}
	}
	var l raft.Log
	if err := c.GetLog(1, &l); err != nil || !bytes.Equal(l.Data, entry(1, 10).Data) {
		t.Fatalf("GetLog(1) = %q, %v", l.Data, err)
	}
}
