package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testConfig(dir string, bootstrap bool) Config {
	return Config{
		NodeID:             "solo",
		DataDir:            dir,
		RaftAddr:           "127.0.0.1:0",
		GRPCAddr:           "127.0.0.1:1", // not served in these tests
		Bootstrap:          bootstrap,
		HeartbeatTimeout:   300 * time.Millisecond,
		ElectionTimeout:    300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
	}
}

// startNode starts a node and waits until it is a ready leader (when
// bootstrapping). The node is shut down at cleanup if still running.
func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	if cfg.Bootstrap {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		waitFor(t, 30*time.Second, "leader", n.IsLeader)
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func markOp(ids ...string) fsm.Op {
	op := fsm.Op{Kind: fsm.OpMark}
	for _, id := range ids {
		op.Items = append(op.Items, fsm.Item{ID: []byte(id), Token: []byte("tok-" + id)})
	}
	return op
}

func TestGroupCommit_CoalescesConcurrentProposals(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir(), true))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := n.Raft().LastIndex()
	const callers = 300
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := n.Propose(ctx, []fsm.Op{markOp(fmt.Sprintf("id-%d", i)), markOp(fmt.Sprintf("id-%d-b", i))})
			if err != nil {
				errs <- err
				return
			}
			// Results come back per caller, in op order.
			if len(res) != 2 || res[0].Err != nil || res[1].Err != nil ||
				res[0].Items[0].Code != fsm.CodeNew || string(res[0].Items[0].Record.Token) != fmt.Sprintf("tok-id-%d", i) ||
				string(res[1].Items[0].Record.Token) != fmt.Sprintf("tok-id-%d-b", i) {
				errs <- fmt.Errorf("caller %d: results %+v", i, res)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	entries := n.Raft().LastIndex() - before
	t.Logf("%d callers -> %d raft entries", callers, entries)
	if entries >= callers {
		t.Fatalf("%d callers took %d entries: no grouping", callers, entries)
	}
}

func TestGroupCommit_CapsItemsPerEntry(t *testing.T) {
	cfg := testConfig(t.TempDir(), true)
	cfg.MaxGroupItems = 10
	cfg.MaxInflight = 1
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One request above the cap still goes (alone).
	big := make([]string, 25)
	for i := range big {
		big[i] = fmt.Sprintf("big-%d", i)
	}
	res, err := n.Propose(ctx, []fsm.Op{markOp(big...)})
	if err != nil || len(res[0].Items) != 25 {
		t.Fatalf("big request: %v %v", res, err)
	}
	before := n.Raft().LastIndex()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.Propose(ctx, []fsm.Op{markOp(fmt.Sprintf("c-%d", i))}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if entries := n.Raft().LastIndex() - before; entries < 4 {
		t.Fatalf("40 one-item calls with a cap of 10 items took %d entries, want at least 4", entries)
	}
}

func TestPropose_NotLeader_FailsFast(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir(), false)) // no bootstrap: no cluster, no leader
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := n.Propose(ctx, []fsm.Op{markOp("a")})
	var nl *NotLeaderError
	if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nl) || nl.LeaderID != "" {
		t.Fatalf("propose on a lone follower: %v", err)
	}
	if _, err := n.ReadIndex(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("read index on a lone follower: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %v, want fast failure", time.Since(start))
	}
	if n.Healthy() {
		t.Fatal("a node without a leader reports healthy")
	}
}

func TestReadIndex_CoversAcknowledgedWrites(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir(), true))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := n.Propose(ctx, []fsm.Op{markOp(fmt.Sprintf("r-%d", i))}); err != nil {
			t.Fatal(err)
		}
		idx, err := n.ReadIndex(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.FSM().WaitApplied(ctx, idx); err != nil {
			t.Fatal(err)
		}
		res, err := n.FSM().Check("", [][]byte{[]byte(fmt.Sprintf("r-%d", i))}, n.FSM().LastTimestamp())
		if err != nil || res[0].Code != fsm.CodeSeen {
			t.Fatalf("after read index %d: %v %v", idx, res, err)
		}
	}
}

// TestInvariant5_LeaderTimestampsNeverGoBackwards: stamps grow across
// calls and across a restart (a new term on the same node).
func TestInvariant5_LeaderTimestampsNeverGoBackwards(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, true)
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last int64
	check := func(n *Node, prefix string) {
		for i := range 20 {
			res, err := n.Propose(ctx, []fsm.Op{markOp(fmt.Sprintf("%s-%d", prefix, i))})
			if err != nil {
				t.Fatal(err)
			}
			ts := res[0].Items[0].Record.FirstSeenMs
			if ts < last {
				t.Fatalf("timestamp went back from %d to %d", last, ts)
			}
			last = ts
		}
	}
	check(n, "a")
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	n2 := startNode(t, cfg)
	if n2.FSM().LastTimestamp() < last {
		t.Fatalf("restarted FSM's last timestamp %d < %d", n2.FSM().LastTimestamp(), last)
	}
	check(n2, "b")
}

// TestRestart_SkipsSnapshotRestore_WhenFSMIsCurrent and the FSM-lost case:
// with the FSM's data intact, a restart does not re-ingest the snapshot;
// with the FSM's directory gone, the snapshot is restored and the log
// replayed, so nothing is lost either way.
// With each log store: a restart keeps the log, the term and the FSM.
func TestRestart_SnapshotRestoreOnlyWhenFSMBehind(t *testing.T) {
	for _, ls := range LogStores {
		t.Run(string(ls), func(t *testing.T) { testRestartSnapshotRestore(t, ls) })
	}
}

func testRestartSnapshotRestore(t *testing.T, ls LogStore) {
	dir := t.TempDir()
	cfg := testConfig(dir, true)
	cfg.LogStore = ls
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 30 {
		if _, err := n.Propose(ctx, []fsm.Op{markOp(fmt.Sprintf("s-%d", i))}); err != nil {
			t.Fatal(err)
		}
		if i == 19 {
			if err := n.Raft().Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	applied := n.FSM().AppliedIndex()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}

	seenAll := func(n *Node) {
		t.Helper()
		ids := make([][]byte, 30)
		for i := range ids {
			ids[i] = []byte(fmt.Sprintf("s-%d", i))
		}
		res, err := n.FSM().Check("", ids, n.FSM().LastTimestamp())
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Code != fsm.CodeSeen {
				t.Fatalf("id %d after restart: %v", i, r.Code)
			}
		}
	}

	// FSM current: no restore needed.
	n2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !n2.HadExistingState() {
		t.Fatal("restarted node found no raft state")
	}
	if skip, err := n2.canSkipRestore(); err != nil || !skip {
		t.Fatalf("canSkipRestore with a current FSM: %v %v", skip, err)
	}
	// At once, without a replay: the FSM holds what it had applied. (Not
	// "equal": the restarted lone voter may already lead and apply its
	// term's first entries.)
	if got := n2.FSM().AppliedIndex(); got < applied {
		t.Fatalf("applied %d right after restart, want at least %d", got, applied)
	}
	seenAll(n2)
	if err := n2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// FSM lost: restore from the snapshot, then replay the log.
	if err := os.RemoveAll(filepath.Join(dir, "fsm")); err != nil {
		t.Fatal(err)
	}
	n3 := startNode(t, cfg)
	waitFor(t, 30*time.Second, "replay up to the old applied index", func() bool { return n3.FSM().AppliedIndex() >= applied })
	seenAll(n3)
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{},
		{NodeID: "a", DataDir: "d", RaftAddr: "127.0.0.1:0", GRPCAddr: "x", Peers: []Peer{{ID: "b", RaftAddr: "r"}}},
		{NodeID: "a", DataDir: "d", RaftAddr: "127.0.0.1:0", GRPCAddr: "x", Peers: []Peer{{ID: "a", RaftAddr: "r"}, {ID: "a", RaftAddr: "s"}}},
	} {
		if _, err := New(c); err == nil {
			t.Fatalf("config %+v accepted", c)
		}
	}
	cfg := testConfig(t.TempDir(), true)
	cfg.RaftAddr = "0.0.0.0:0"
	if _, err := New(cfg); err == nil {
		t.Fatal("unadvertisable raft address accepted")
	}
}

// TestShutdown_StopsGoroutinesAndReleasesFiles: after Shutdown no goroutine
// of the node is left and its files can be opened again at once.
func TestShutdown_StopsGoroutinesAndReleasesFiles(t *testing.T) {
	dir := t.TempDir()
	before := runtime.NumGoroutine()
	for range 2 {
		cfg := testConfig(dir, true)
		n := startNode(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := n.Propose(ctx, []fsm.Op{markOp("g")}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.ReadIndex(ctx); err != nil {
			t.Fatal(err)
		}
		if err := n.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after shutdown:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdown_ReturnsAfterAbruptRaftStopUnderLoad: raft drops some futures
// when it is shut down with entries in flight and never answers them; a
// crash-like stop (raft first, as the chaos and demo killers do) under
// constant proposals must still let Shutdown return, with every caller
// answered. Before awaitFuture, Shutdown waited forever on such a future.
func TestShutdown_ReturnsAfterAbruptRaftStopUnderLoad(t *testing.T) {
	dir := t.TempDir()
	for round := range 8 {
		n := startNode(t, testConfig(dir, round == 0))
		if round > 0 {
			waitFor(t, 30*time.Second, "leader after restart", n.IsLeader)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var answered atomic.Int64
		for c := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					ids := make([]string, 64) // sizeable entries: raft's FSM queue fills
					for k := range ids {
						ids[k] = fmt.Sprintf("r%d-c%d-%d-%d", round, c, i, k)
					}
					_, _ = n.Propose(ctx, []fsm.Op{markOp(ids...)})
					answered.Add(1)
				}
			}()
		}
		waitFor(t, 30*time.Second, "proposals under way", func() bool { return answered.Load() > 50 })
		_ = n.Raft().Shutdown().Error()
		done := make(chan error, 1)
		go func() { done <- n.Shutdown(context.Background()) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("round %d: Shutdown still blocked after 60 s:\n%s", round, buf[:runtime.Stack(buf, true)])
		}
		cancel()
		wg.Wait() // every caller got an answer
	}
}

// An enqueue timeout on a node that leads is ErrBusy (nothing written,
// retry here), not a NotLeaderError claiming no leader is known; a lost
// leadership stays outcome-unknown.
func TestEnqueueTimeoutOnLeaderIsBusy(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir(), true))
	err := n.mapApplyError(raft.ErrEnqueueTimeout)
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("leader: %v", err)
	}
	if err := n.mapApplyError(raft.ErrLeadershipLost); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("leadership lost: %v", err)
	}
}

// applyBlocker is an FSM apply gate a test closes and opens.
type applyBlocker struct {
	mu sync.Mutex
	ch chan struct{} // nil: open
}

func (b *applyBlocker) gate() bool {
	b.mu.Lock()
	ch := b.ch
	b.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return true
}

// block holds every batch not yet applied until unblock.
func (b *applyBlocker) block() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ch = make(chan struct{})
}

func (b *applyBlocker) unblock() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// proposeAsync proposes one mark of id and reports the error on the
// returned channel.
func proposeAsync(ctx context.Context, n *Node, id string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := n.Propose(ctx, []fsm.Op{markOp(id)})
		done <- err
	}()
	return done
}

// startApplyBlocked starts a ready single-node leader with cfg whose FSM
// applies nothing more until the returned unblock runs (also at cleanup,
// before the node's shutdown: cleanups run last first).
func startApplyBlocked(t *testing.T, cfg Config) (n *Node, unblock func()) {
	t.Helper()
	var apply applyBlocker
	cfg.FSM.ApplyGate = apply.gate
	n = startNode(t, cfg)
	t.Cleanup(apply.unblock)
	// The node is a ready leader (its term barrier applied): from here on
	// nothing applies until unblock.
	apply.block()
	return n, apply.unblock
}

// waitAnswered waits for every proposal's answer and fails on an error.
func waitAnswered(t *testing.T, proposals map[string]<-chan error) {
	t.Helper()
	for name, ch := range proposals {
		if err := <-ch; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func queued(n *Node) int {
	n.prop.mu.Lock()
	defer n.prop.mu.Unlock()
	return len(n.prop.queue)
}

// On one machine an entry commits within milliseconds: callers that
// arrive while it is in flight wait for it and leave together as the next
// entry, instead of a second entry being queued behind the first.
func TestPipeline_CallersWaitForTheEntryInFlight(t *testing.T) {
	cfg := testConfig(t.TempDir(), true)
	cfg.PipelineAfter = time.Hour
	n, unblock := startApplyBlocked(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first := n.Raft().LastIndex()
	a := proposeAsync(ctx, n, "a")
	waitFor(t, 30*time.Second, "a's entry in the log", func() bool { return n.Raft().LastIndex() == first+1 })
	b, c := proposeAsync(ctx, n, "b"), proposeAsync(ctx, n, "c")
	waitFor(t, 30*time.Second, "b and c queued behind a", func() bool { return queued(n) == 2 })
	if got := n.Raft().LastIndex(); got != first+1 {
		t.Fatalf("an entry was proposed beside the one in flight (last index %d, want %d)", got, first+1)
	}
	unblock()
	waitAnswered(t, map[string]<-chan error{"a": a, "b": b, "c": c})
	if got := n.Raft().LastIndex(); got != first+2 {
		t.Fatalf("a, then b and c: want 2 entries, the log grew by %d", got-first)
	}
}

// Across regions a commit takes a round trip: once the entry in flight has
// waited PipelineAfter, the next one is proposed beside it.
func TestPipeline_SlowEntryLetsTheNextOneGo(t *testing.T) {
	cfg := testConfig(t.TempDir(), true)
	cfg.PipelineAfter = 50 * time.Millisecond
	cfg.MaxInflight = 2
	n, unblock := startApplyBlocked(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first := n.Raft().LastIndex()
	a := proposeAsync(ctx, n, "a")
	waitFor(t, 30*time.Second, "a's entry in the log", func() bool { return n.Raft().LastIndex() == first+1 })
	b := proposeAsync(ctx, n, "b")
	// a cannot be answered (apply is blocked), so b's entry can only come
	// from the pipeline.
	waitFor(t, 30*time.Second, "b proposed beside a", func() bool { return n.Raft().LastIndex() == first+2 })
	c := proposeAsync(ctx, n, "c")
	waitFor(t, 30*time.Second, "c queued", func() bool { return queued(n) == 1 })
	unblock()
	waitAnswered(t, map[string]<-chan error{"a": a, "b": b, "c": c})
	if got := n.Raft().LastIndex(); got != first+3 {
		t.Fatalf("want 3 entries (MaxInflight 2 held c back until one was answered), the log grew by %d", got-first)
	}
}
