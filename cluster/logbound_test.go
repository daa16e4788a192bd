package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/fs"

	"github.com/dedupnode/dedupnode/fsm"
)

// sizedEntries returns entries from..from+len(sizes)-1 whose data are
// sizes[i] bytes.
func sizedEntries(from uint64, sizes ...int) []*raft.Log {
	logs := make([]*raft.Log, len(sizes))
	for i, n := range sizes {
		logs[i] = &raft.Log{Index: from + uint64(i), Term: 1, Type: raft.LogCommand, Data: make([]byte, n)}
	}
	return logs
}

// measuredLog reads every entry of store and sums what entryBytes counts,
// without logSizes; ok is false when the log changed under the reads.
func measuredLog(store raft.LogStore) (e logExtent, ok bool) {
	first, err1 := store.FirstIndex()
	last, err2 := store.LastIndex()
	if err1 != nil || err2 != nil {
		return e, false
	}
	if first == 0 || last < first {
		return logExtent{}, true
	}
	e.First, e.Last = first, last
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			return e, false
		}
		e.Bytes += uint64(len(l.Data)+len(l.Extensions)) + logEntryOverhead
	}
	return e, true
}

// logSizes follows every change raft makes to a real raft-wal log: appends,
// truncation of a prefix behind a snapshot, a follower's overwritten
// suffix, emptying after a snapshot install and a restart after a gap; and
// a reopened store is measured the same by reading it.
func TestLogSizes_FollowsTheLog(t *testing.T) {
	dir := t.TempDir()
	store, err := openWALStore(dir, 64<<10, hclog.NewNullLogger(), fs.New())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { store.Close() }()
	s, err := newLogSizes(store)
	if err != nil {
		t.Fatal(err)
	}
	check := func(step string) {
		t.Helper()
		want, ok := measuredLog(store)
		if !ok {
			t.Fatalf("%s: cannot read the log", step)
		}
		if got := s.extent(); got != want {
			t.Fatalf("%s: logSizes says %+v, the store holds %+v", step, got, want)
		}
	}
	const o = logEntryOverhead
	check("empty")
	if err := s.StoreLogs(sizedEntries(1, 100, 200, 300, 400, 500)); err != nil {
		t.Fatal(err)
	}
	check("appended 1..5")
	if got := s.newestWithin(900 + 2*o); got != 2 {
		t.Fatalf("newest entries within 900+2 overheads: %d, want 2 (500 and 400)", got)
	}
	if got := s.newestWithin(899 + 2*o); got != 1 {
		t.Fatalf("newest entries within a byte less: %d, want 1", got)
	}
	if got := s.bytesThrough(2); got != 300+2*o {
		t.Fatalf("bytes through 2: %d, want %d", got, 300+2*o)
	}
	if err := s.DeleteRange(1, 2); err != nil { // compaction behind a snapshot
		t.Fatal(err)
	}
	check("prefix 1..2 deleted")
	if got := s.bytesThrough(2); got != 0 {
		t.Fatalf("bytes through a deleted index: %d", got)
	}
	if err := s.DeleteRange(4, 5); err != nil { // a follower's conflicting suffix
		t.Fatal(err)
	}
	if err := s.StoreLogs(sizedEntries(4, 1000, 2000)); err != nil {
		t.Fatal(err)
	}
	check("suffix 4..5 rewritten")
	if err := s.DeleteRange(3, 5); err != nil { // everything, as after a snapshot install
		t.Fatal(err)
	}
	check("emptied")
	if err := s.StoreLogs(sizedEntries(40, 10, 20)); err != nil {
		t.Fatal(err)
	}
	check("appended after a gap")

	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if store, err = openWALStore(dir, 64<<10, hclog.NewNullLogger(), fs.New()); err != nil {
		t.Fatal(err)
	}
	if s, err = newLogSizes(store); err != nil {
		t.Fatal(err)
	}
	check("reopened")
}

// A compacted prefix gives its memory back: after many appends and
// truncations the sizes hold about what the log holds.
func TestLogSizes_TruncationFreesMemory(t *testing.T) {
	store, err := openWALStore(t.TempDir(), 1<<20, hclog.NewNullLogger(), fs.New())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s, err := newLogSizes(store)
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for range 50 {
		sizes := make([]int, 1000)
		for i := range sizes {
			sizes[i] = 8
		}
		if err := s.StoreLogs(sizedEntries(next, sizes...)); err != nil {
			t.Fatal(err)
		}
		next += 1000
		if err := s.DeleteRange(s.extent().First, next-101); err != nil { // keep 100
			t.Fatal(err)
		}
	}
	if e := s.extent(); e.Last-e.First+1 != 100 || cap(s.cum) > 4096 {
		t.Fatalf("log of %d entries held in sizes of capacity %d", e.Last-e.First+1, cap(s.cum))
	}
}

// planLog: a log within the bound keeps raft's trailing entries; one
// beyond it keeps only the newest entries that fit; a snapshot is taken
// when one would let raft drop a step of log (never less than a quarter
// of a snapshot), and never when the FSM applied nothing since the latest
// snapshot.
func TestPlanLog(t *testing.T) {
	store, err := openWALStore(t.TempDir(), 1<<20, hclog.NewNullLogger(), fs.New())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s, err := newLogSizes(store)
	if err != nil {
		t.Fatal(err)
	}
	const entry = 1000 - logEntryOverhead // each entry counts 1000 bytes
	sizes := make([]int, 100)
	for i := range sizes {
		sizes[i] = entry
	}
	if err := s.StoreLogs(sizedEntries(1, sizes...)); err != nil {
		t.Fatal(err)
	}
	// 100,000 bytes of log.
	for _, tc := range []struct {
		name                             string
		maxBytes, snapIndex, snapSize    uint64
		applied                          uint64
		wantStep, wantKeep, wantTrailing uint64
		wantSnapshot                     bool
	}{
		{"fits", 1 << 20, 0, 0, 100, 1 << 16, 1<<20 - 1<<16, 10240, false},
		// Step: max/16, or a quarter of the snapshot when larger; keep:
		// max less a step, at least max/2; trailing: the newest entries
		// within keep.
		{"fits, step of max/16", 128_000, 0, 1, 100, 8_000, 120_000, 10240, false},
		{"over", 64_000, 50, 1, 100, 4_000, 60_000, 60, true},
		{"over, large snapshot", 64_000, 50, 80_000, 100, 20_000, 44_000, 44, true},
		// A store over twice the bound: the step is still a quarter of a
		// snapshot, and the log may grow to max/2 and a step.
		{"over, store over twice the bound", 64_000, 50, 200_000, 100, 50_000, 32_000, 32, true},
		{"over, a quarter of the store not yet reached", 64_000, 50, 400_000, 100, 100_000, 32_000, 32, false},
		{"over, nothing applied since the snapshot", 64_000, 50, 1, 50, 4_000, 60_000, 60, false},
		// Raft drops through min(applied, last-trailing): applied 3
		// frees 3,000 bytes, below the step.
		{"over, applied too little", 64_000, 2, 1, 3, 4_000, 60_000, 60, false},
		{"over, applied enough", 64_000, 2, 1, 4, 4_000, 60_000, 60, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planLog(s, tc.maxBytes, 10240, tc.snapIndex, tc.snapSize, tc.applied)
			if p.Step != tc.wantStep || p.Keep != tc.wantKeep || p.Trailing != tc.wantTrailing || p.Snapshot != tc.wantSnapshot {
				t.Fatalf("plan %+v, want step %d, keep %d, trailing %d, snapshot %v", p, tc.wantStep, tc.wantKeep, tc.wantTrailing, tc.wantSnapshot)
			}
		})
	}
	if p := planLog(s, 64_000, 20, 0, 0, 100); p.Trailing != 20 {
		t.Fatalf("configured trailing logs below what fits: %d, want 20", p.Trailing)
	}
}

// logBoundConfig is a node of a cluster whose log is bounded at maxLog
// bytes, with raft's own entry-count retention at its defaults (10240
// entries kept, a snapshot every 8192 checked every 2-4 minutes): alone,
// it would keep every entry of these tests.
func logBoundConfig(dir, id string, bootstrap bool, maxLog uint64) Config {
	cfg := testConfig(dir, bootstrap)
	cfg.NodeID = id
	cfg.MaxLogBytes = maxLog
	cfg.MaxEntryBytes = 128 << 10
	cfg.WALSegmentBytes = 128 << 10
	cfg.TickInterval = 50 * time.Millisecond
	return cfg
}

// bigMark is one entry of about 30 KiB: 250 IDs of 56 bytes, each with
// a token of 60. Every call marks the same IDs, so the log grows by an
// entry each time while the store (and so a snapshot, and the step of
// log a snapshot must truncate) stays small.
func bigMark() fsm.Op {
	ids := make([]string, 250)
	for j := range ids {
		ids[j] = fmt.Sprintf("%-56d", j)
	}
	return markOp(ids...)
}

// walFiles sums the sizes of the raft-wal segment files in dataDir.
func walFiles(t *testing.T, dataDir string) (n int, bytes int64) {
	t.Helper()
	es, err := os.ReadDir(walDir(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		n++
		bytes += info.Size()
	}
	return n, bytes
}

// TestLogBound_KeepsTheLogWithinMaxLogBytes: a 3-node cluster with a log
// bound of 512 KiB takes 2.6 MiB of large entries (raft's entry-count
// retention alone keeps them all). Before each entry the test waits until
// every node's log, read back from its store, is within the bound, and
// its segment files within the bound plus three segments; each node's
// own measure of its log agrees with the store. A follower that was down
// while the log moved on catches up (from a snapshot) and is bounded
// too, after a restart that measured its log by reading it.
func TestLogBound_KeepsTheLogWithinMaxLogBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const maxLog = 512 << 10
	cfgs := map[string]Config{"n1": logBoundConfig(t.TempDir(), "n1", true, maxLog)}
	nodes := map[string]*Node{"n1": startNode(t, cfgs["n1"])}
	n1 := nodes["n1"]
	members := []*Node{n1}
	for _, id := range []string{"n2", "n3"} {
		cfgs[id] = logBoundConfig(t.TempDir(), id, false, maxLog)
		nodes[id] = startNode(t, cfgs[id])
		// Through whichever member leads: on a busy machine leadership
		// can move between the two configuration changes.
		raftAddr := nodes[id].RaftAddr()
		onLeader(t, members, "join "+id, func(l *Node) error { return l.Join(ctx, id, raftAddr, "127.0.0.1:1") })
		onLeader(t, members, "promote "+id, func(l *Node) error { return l.Promote(ctx, id, true) })
		members = append(members, nodes[id])
	}
	bounded := func(id string) func() bool {
		return func() bool {
			n := nodes[id]
			e, ok := measuredLog(n.store)
			if !ok || e.Bytes > maxLog {
				return false
			}
			segs, size := walFiles(t, cfgs[id].DataDir)
			if size > maxLog+3*int64(cfgs[id].WALSegmentBytes) {
				t.Logf("%s: log of %d bytes in %d segment files of %d bytes", id, e.Bytes, segs, size)
				return false
			}
			return n.sizes.extent() == e
		}
	}
	up := func() []*Node {
		var ns []*Node
		for _, n := range nodes {
			if !n.stopping.Load() {
				ns = append(ns, n)
			}
		}
		return ns
	}
	load := func(from, to int, ids ...string) {
		t.Helper()
		for i := from; i < to; i++ {
			for _, id := range ids {
				waitFor(t, 60*time.Second, fmt.Sprintf("%s's log within %d bytes before entry %d", id, maxLog, i), bounded(id))
			}
			propose(t, ctx, up(), bigMark())
		}
	}
	load(0, 40, "n1", "n2", "n3")

	stopNode(t, nodes["n3"])
	behind := nodes["n3"].sizes.extent().Last
	load(40, 80, "n1", "n2")
	if first, _ := leaderOf(t, up()).store.FirstIndex(); first <= behind {
		t.Fatalf("the leader's log still holds n3's last entry %d (first %d): no snapshot install tested", behind, first)
	}
	cfg := cfgs["n3"]
	cfg.RaftListener = listenAt(t, nodes["n3"].RaftAddr())
	nodes["n3"] = startNode(t, cfg)
	target := leaderOf(t, up()).Raft().LastIndex()
	waitFor(t, 60*time.Second, "n3 caught up", func() bool { return nodes["n3"].FSM().AppliedIndex() >= target })
	load(80, 90, "n1", "n2", "n3")
	for id := range nodes {
		waitFor(t, 60*time.Second, id+"'s log within the bound at the end", bounded(id))
	}
	st, err := leaderOf(t, up()).Status()
	if err != nil {
		t.Fatal(err)
	}
	if st.LogBytes == 0 || st.LogBytes > maxLog || st.LogEntries != st.LastLogIndex-st.FirstLogIndex+1 {
		t.Fatalf("status: log of %d entries, %d bytes (first %d, last %d)", st.LogEntries, st.LogBytes, st.FirstLogIndex, st.LastLogIndex)
	}
}

// onLeader runs call on the leader among nodes, again while leadership
// moves, for up to a minute.
func onLeader(t *testing.T, nodes []*Node, what string, call func(l *Node) error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := call(leaderOf(t, nodes))
		if err == nil {
			return
		}
		var nl *NotLeaderError
		if !errors.As(err, &nl) && !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNotReady) || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaderOf waits for a leader among nodes.
func leaderOf(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	var l *Node
	waitFor(t, 60*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			if n.IsLeader() {
				l = n
				return true
			}
		}
		return false
	})
	return l
}

// propose applies op through the leader among nodes, trying again while
// leadership moves (short election timeouts on a busy machine).
func propose(t *testing.T, ctx context.Context, nodes []*Node, op fsm.Op) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := leaderOf(t, nodes).Propose(ctx, []fsm.Op{op})
		var nl *NotLeaderError
		if err == nil || !errors.As(err, &nl) && !errors.Is(err, ErrNotReady) && !errors.Is(err, ErrOutcomeUnknown) {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader took the entry within 60 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// MaxLogBytes below two of the largest entries is refused, naming both.
func TestConfigValidation_MaxLogBytes(t *testing.T) {
	cfg := testConfig(t.TempDir(), true)
	cfg.MaxEntryBytes = 1 << 20
	cfg.MaxLogBytes = 1<<21 - 1
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "MaxLogBytes 2097151") || !strings.Contains(err.Error(), "twice MaxEntryBytes") {
		t.Fatalf("got %v, want the MaxLogBytes error", err)
	}
}
