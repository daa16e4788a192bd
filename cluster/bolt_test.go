package cluster

import (
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// TestBoltOptions_LogSurvivesReopenWithoutSyncedFreelist: with the freelist
// not written (boltOptions), a truncated raft log reopens with every stored
// entry, both with our options and with bbolt's defaults (which rebuild and
// write the freelist), and appends keep working after each reopen.
func TestBoltOptions_LogSurvivesReopenWithoutSyncedFreelist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	open := func(o *bbolt.Options) *raftboltdb.BoltStore {
		t.Helper()
		s, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: o})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() }) // a no-op after the test's own Close
		return s
	}
	data := make([]byte, 5000) // larger than a page: overflow pages get freed too
	var last uint64
	appendN := func(s *raftboltdb.BoltStore, n int) {
		t.Helper()
		for range n {
			last++
			data[0] = byte(last)
			if err := s.StoreLogs([]*raft.Log{{Index: last, Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(s *raftboltdb.BoltStore, first uint64) {
		t.Helper()
		fi, err := s.FirstIndex()
		if err != nil || fi != first {
			t.Fatalf("first index = %d, %v; want %d", fi, err, first)
		}
		li, err := s.LastIndex()
		if err != nil || li != last {
			t.Fatalf("last index = %d, %v; want %d", li, err, last)
		}
		for i := first; i <= last; i++ {
			var l raft.Log
			if err := s.GetLog(i, &l); err != nil || l.Index != i || len(l.Data) != len(data) || l.Data[0] != byte(i) {
				t.Fatalf("log %d: %v (index %d, %d bytes)", i, err, l.Index, len(l.Data))
			}
		}
	}

	s := open(boltOptions())
	appendN(s, 300)
	if err := s.DeleteRange(1, 200); err != nil { // as raft does behind a snapshot
		t.Fatal(err)
	}
	appendN(s, 50)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(boltOptions())
	check(s, 201)
	appendN(s, 20)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(nil) // bbolt defaults: rebuilds and syncs the freelist
	check(s, 201)
	appendN(s, 20)
	check(s, 201)
}
