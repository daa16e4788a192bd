package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

func TestParseLogStore(t *testing.T) {
	for in, want := range map[string]LogStore{"": DefaultLogStore, "wal": LogStoreWAL, "boltdb": LogStoreBoltDB, " WAL ": LogStoreWAL} {
		if got, err := ParseLogStore(in); err != nil || got != want {
			t.Errorf("ParseLogStore(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseLogStore("bolt"); err == nil {
		t.Error(`ParseLogStore("bolt") accepted`)
	}
	cfg := testConfig(t.TempDir(), true)
	cfg.LogStore = "rocks"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "LogStore") {
		t.Fatalf("unknown LogStore: %v", err)
	}
}

// A node whose data dir holds the other store's Raft log refuses to start,
// naming the flag, and leaves the data dir as it was.
func TestLogStore_RefusesTheOtherStoresDataDir(t *testing.T) {
	for _, ls := range LogStores {
		t.Run(string(ls), func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir, true)
			cfg.LogStore = ls
			n := startNode(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := n.Propose(ctx, []fsm.Op{markOp("kept")}); err != nil {
				t.Fatal(err)
			}
			if err := n.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if got, err := DetectLogStore(dir); err != nil || got != ls {
				t.Fatalf("DetectLogStore = %q, %v; want %q", got, err, ls)
			}

			other := LogStoreBoltDB
			if ls == LogStoreBoltDB {
				other = LogStoreWAL
			}
			cfg.LogStore = other
			_, err := New(cfg)
			var mm *LogStoreMismatchError
			if !errors.As(err, &mm) || mm.Found != ls || mm.Configured != other {
				t.Fatalf("start with %s on a %s data dir: %v", other, ls, err)
			}
			if !strings.Contains(err.Error(), "--raft-log-store "+string(ls)) {
				t.Fatalf("error does not name the flag and the store to use: %v", err)
			}
			if _, err := os.Stat(LogStorePath(dir, other)); !os.IsNotExist(err) {
				t.Fatalf("the refused start created %s (%v)", LogStorePath(dir, other), err)
			}

			// Started again with its own store it has everything.
			cfg.LogStore = ls
			n = startNode(t, cfg)
			res, err := n.FSM().Check("", [][]byte{[]byte("kept")}, n.FSM().LastTimestamp())
			if err != nil || res[0].Code != fsm.CodeSeen {
				t.Fatalf("after the refused start: %v %v", res, err)
			}
		})
	}
}

// allocated is the disk space files under dir take (st_blocks), as du
// counts it: raft-wal preallocates its segment files.
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var sum int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !fi.IsDir() {
			sum += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// Raft truncates its log behind a snapshot with DeleteRange(first, S -
// TrailingLogs); with raft-wal that deletes whole segment files, so the
// directory shrinks to the entries kept plus about two segments (the head
// segment's older part and the preallocated tail), and InspectLog reads the
// entries kept.
func TestWAL_TruncationBehindSnapshotReturnsDisk(t *testing.T) {
	dataDir := t.TempDir()
	const seg = 256 << 10
	s, err := openLogStore(dataDir, LogStoreWAL, seg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4096)
	const total, keep = 1000, 100
	for i := uint64(1); i <= total; i++ {
		data[0] = byte(i)
		if err := s.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
			t.Fatal(err)
		}
	}
	dir := LogStorePath(dataDir, LogStoreWAL)
	before := allocated(t, dir)
	if before < total*4096 {
		t.Fatalf("log dir holds %d bytes before truncation, want at least %d", before, total*4096)
	}
	if err := s.DeleteRange(1, total-keep); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // deletion of unused segments may run until the readers are done
		t.Fatal(err)
	}
	after := allocated(t, dir)
	keptBytes := int64(keep * len(data))
	t.Logf("log dir: %d bytes before, %d after keeping %d entries (%d bytes)", before, after, keep, keptBytes)
	if after > keptBytes+2*seg+64<<10 {
		t.Fatalf("log dir holds %d bytes after truncation to %d entries of %d bytes: want at most the entries plus two %d-byte segments", after, keep, len(data), seg)
	}

	info, err := InspectLog(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Store != LogStoreWAL || info.FirstIndex != total-keep+1 || info.LastIndex != total || info.Entries != keep || info.EntryBytes != uint64(keptBytes) {
		t.Fatalf("InspectLog = %+v", info)
	}
}

// A second opener of the same wal data dir fails at once instead of
// waiting forever on raft-wal's meta file; the lock goes with Close.
func TestWAL_SecondOpenerFailsFast(t *testing.T) {
	dataDir := t.TempDir()
	s, err := openLogStore(dataDir, LogStoreWAL, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		s2, err := openLogStore(dataDir, LogStoreWAL, 0, hclog.NewNullLogger())
		if err == nil {
			s2.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("second open: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second open of a wal data dir blocked")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openLogStore(dataDir, LogStoreWAL, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	s.Close()
}

// raft clears a log suffix when a new leader's log disagrees with a
// follower's ("clearing log suffix"), then keeps appending; the log must
// still open after that. raft-wal v0.4.0 marked the truncated tail segment
// sealed without writing its index block, and every later open failed with
// "sealed segment has no index block" (hashicorp/raft-wal#31; found by
// chaos-ci: the restarted node panicked in raft.NewRaft).
func TestLogStore_ReopensAfterSuffixTruncation(t *testing.T) {
	for _, ls := range LogStores {
		t.Run(string(ls), func(t *testing.T) {
			dataDir := t.TempDir()
			open := func() raftStore {
				t.Helper()
				s, err := openLogStore(dataDir, ls, 0, hclog.NewNullLogger())
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			store := func(s raftStore, from, to uint64, term uint64) {
				t.Helper()
				for i := from; i <= to; i++ {
					if err := s.StoreLogs([]*raft.Log{{Index: i, Term: term, Type: raft.LogCommand, Data: []byte{byte(i), byte(term)}}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			s := open()
			store(s, 1, 20, 1)
			if err := s.DeleteRange(18, 20); err != nil { // a conflicting suffix
				t.Fatal(err)
			}
			store(s, 18, 25, 2)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open()
			defer s.Close()
			for i := uint64(1); i <= 25; i++ {
				var l raft.Log
				if err := s.GetLog(i, &l); err != nil {
					t.Fatalf("entry %d after reopen: %v", i, err)
				}
				if want := uint64(1); i >= 18 && l.Term != 2 || i < 18 && l.Term != want {
					t.Fatalf("entry %d after reopen: term %d", i, l.Term)
				}
			}
		})
	}
}
