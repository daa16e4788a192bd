package cluster

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// v1Fixture is testdata/v1log/records.json (written by testdata/v1log/gen
// with the source of commit e7189b4).
type v1Fixture struct {
	AppliedIndex uint64 `json:"applied_index"`
	LastTsMs     int64  `json:"last_ts_ms"`
	Records      []struct {
		Namespace   string `json:"ns"`
		ID          string `json:"id"`
		Code        string `json:"code"`
		State       uint8  `json:"state"`
		FirstSeenMs int64  `json:"first_seen_ms"`
		ExpiresMs   int64  `json:"expires_ms"`
		Token       []byte `json:"token"`
		Digest      []byte `json:"digest"`
		Fence       uint64 `json:"fence"`
	} `json:"records"`
}

// TestReplay_V1LogFixture: a Raft log written by the build of commit
// e7189b4 (entries in command format version 1, a token per ID; a
// raft-boltdb data dir, the only store then) is replayed by this build:
//
//  1. every entry, fed to an empty state machine as raft replays it,
//     yields the same records — tokens, digests, fences, times — as that
//     build's own state machine held after applying the same log. The
//     checks read at the log's last timestamp: a live node's next entry
//     carries today's, which would expire the fixture's short TTLs;
//  2. a node started on the data dir replays the log to its end and has
//     its namespaces and node table.
func TestReplay_V1LogFixture(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "v1log", "records.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx v1Fixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	dir := v1DataDir(t)

	// 1. The log, entry by entry, into an empty FSM.
	s, err := openLogStore(dir, LogStoreBoltDB, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	f, err := fsm.New(fsm.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	commands := 0
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type == raft.LogCommand {
			commands++
			if l.Data[0] != 1 {
				t.Fatalf("fixture entry %d has format version %d, want 1", i, l.Data[0])
			}
		}
		if res := f.ApplyBatch([]*raft.Log{&l})[0]; res != nil {
			if ae, ok := res.(*fsm.ApplyErr); ok {
				t.Fatalf("fixture entry %d: %v", i, ae)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if commands < 5 || f.AppliedIndex() != fx.AppliedIndex || f.LastTimestamp() != fx.LastTsMs {
		t.Fatalf("replayed %d commands to index %d (last timestamp %d); the e7189b4 build applied to %d (%d)",
			commands, f.AppliedIndex(), f.LastTimestamp(), fx.AppliedIndex, fx.LastTsMs)
	}
	for _, want := range fx.Records {
		res, err := f.Check(want.Namespace, [][]byte{[]byte(want.ID)}, fx.LastTsMs)
		if err != nil {
			t.Fatalf("%s/%s: %v", want.Namespace, want.ID, err)
		}
		got := res[0]
		if got.Code.String() != want.Code || uint8(got.Record.State) != want.State ||
			got.Record.FirstSeenMs != want.FirstSeenMs || got.Record.ExpiresMs != want.ExpiresMs ||
			!bytes.Equal(got.Record.Token, want.Token) || !bytes.Equal(got.Record.Digest, want.Digest) || got.Record.Fence != want.Fence {
			t.Errorf("%s/%s after replay: %v %+v; the e7189b4 build read %+v", want.Namespace, want.ID, got.Code, got.Record, want)
		}
	}

	// 2. A node on the data dir.
	cfg := testConfig(dir, false)
	cfg.NodeID = "v1"
	cfg.LogStore = LogStoreBoltDB
	n := startNode(t, cfg)
	waitFor(t, 60*time.Second, "the fixture's log replayed", func() bool { return n.FSM().AppliedIndex() >= fx.AppliedIndex })
	if ns, ok := n.FSM().Namespace("fx-sliding"); !ok || ns.DefaultTTLMs != 7_200_000 || ns.Mode != fsm.ExpirySliding {
		t.Errorf("namespace fx-sliding after replay: %+v %v", ns, ok)
	}
	if addr := n.FSM().Nodes()["other"]; addr != "10.0.0.9:7070" {
		t.Errorf("node table after replay: %v", n.FSM().Nodes())
	}
}

// v1DataDir returns a fresh data dir holding the v1 fixture's Raft log
// (raft-boltdb, written by a version before the compact entry format and
// before the node-id file).
func v1DataDir(t *testing.T) string {
	t.Helper()
	db, err := os.ReadFile(filepath.Join("testdata", "v1log", "data", "raft", "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "raft"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "raft", "raft.db"), db, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
