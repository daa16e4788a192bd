package fsm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/internal/longtest"
)

// hashLogLog is a random log that grows buckets well past their first
// filter (batches of up to 40 items over 1 500 IDs), forgets and re-marks
// IDs in the same bucket (duplicate hashes in a log, stale logs), moves
// them between buckets (sliding expiry, claims then commits) and expires
// buckets (ticks), in two namespaces.
func hashLogLog(seed uint64, n int) []*raft.Log {
	rng := rand.New(rand.NewPCG(seed, 99))
	ts := t0
	short := FillNamespaceDefaults(NamespaceConfig{Name: "short", MaxTTLMs: 120_000, DefaultTTLMs: 10_000, Mode: ExpirySliding})
	logs := []*raft.Log{logOf(1, &Command{TimestampMs: ts, Ops: []Op{{Kind: OpCreateNamespace, Config: short}}})}
	kinds := []OpKind{OpMark, OpMark, OpMark, OpMark, OpMark, OpMark, OpMark, OpMark, OpClaim, OpCommit, OpRenew, OpRelease, OpForget, OpTick}
	for i := 1; i < n; i++ {
		ts += int64(rng.IntN(400))
		cmd := Command{TimestampMs: ts}
		for range 1 + rng.IntN(3) {
			k := kinds[rng.IntN(len(kinds))]
			op := Op{Kind: k}
			if rng.IntN(2) == 0 {
				op.Namespace = "short"
			}
			if k == OpTick {
				op.Namespace = ""
			} else {
				items := 1 + rng.IntN(40)
				if k == OpForget {
					items = 1 + rng.IntN(4) // few: a log more than a tenth stale is dropped
				}
				for range items {
					op.Items = append(op.Items, Item{
						ID:     fmt.Appendf(nil, "id-%d", rng.IntN(1500)),
						Token:  fmt.Appendf(nil, "t-%d", rng.IntN(3)),
						Digest: []byte("d"),
						Fence:  uint64(1 + rng.IntN(i+1)),
					})
				}
				// Mostly the default TTL, so a bucket fills and its chain
				// grows; sometimes a random one (moves, sliding expiry).
				if (k == OpMark || k == OpClaim || k == OpRenew || k == OpCommit) && rng.IntN(4) == 0 {
					op.DurationMs = int64(rng.IntN(120_000))
				}
			}
			cmd.Ops = append(cmd.Ops, op)
		}
		logs = append(logs, logOf(uint64(len(logs)+1), &cmd))
	}
	return logs
}

// TestHashLogCompactionsAnswerLikeAReplicaWithout: an FSM whose chains are
// compacted again and again (every live bucket, and now and then
// CompactionCandidates' picks) while entries apply, with hash logs bounded so that some chains
// pass the bound, answers every Check exactly as a replica that never
// compacts and keeps no log. A Bloom false negative (a chain compacted from
// a log missing a stored ID, or a compaction losing IDs added meanwhile)
// would answer NOT_SEEN where the reference answers SEEN. Logs of 150
// entries by default, 300 as a long test (longtest): the compactor spins
// for as long as the applies and checks take.
func TestHashLogCompactionsAnswerLikeAReplicaWithout(t *testing.T) {
	for _, logIDs := range []int{300, 0} {
		for seed := range uint64(1) {
			t.Run(fmt.Sprintf("logIDs%d/seed%d", logIDs, seed), func(t *testing.T) {
				testHashLogAgainstReference(t, logIDs, seed)
			})
		}
	}
}

func testHashLogAgainstReference(t *testing.T, logIDs int, seed uint64) {
	entries := longtest.Pick(150, 300)
	rng := rand.New(rand.NewPCG(seed, 5))
	logs := hashLogLog(seed, entries)
	// Windows of 256 records, not the harness's 4: every lookup seeks each
	// window of its bucket, and 4-record windows made the 1 500-ID checks
	// below the bulk of the package's test time under -race.
	ref := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 16, LogIDs: -1}, BloomCompactInterval: -1, windowShift: 8})
	h := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 16, LogIDs: logIDs}, BloomCompactInterval: -1, windowShift: 8})
	h.f.cfg.Buffer = BufferLimits{MaxRecords: 1 + rng.IntN(200), MaxEntries: 1 + rng.IntN(6)}.withDefaults()
	waitReady(t, ref.f)
	waitReady(t, h.f)
	f := h.f
	ids := make([][]byte, 1500)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "id-%d", i)
	}
	stop := make(chan struct{})
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	var passes int
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			default:
			}
			passes++
			// A poll now and then: every poll of a chain that received
			// nothing since the last one counts it quiet and frees its log.
			if passes%50 == 0 {
				if err := f.compactFilters(ctx); err != nil {
					errc <- err
					return
				}
			}
			f.mu.RLock()
			var keys []bloom.Key
			for k := range f.st.registry {
				keys = append(keys, k)
			}
			f.mu.RUnlock()
			for _, k := range keys {
				if err := f.compactChain(ctx, k); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	maxLog := uint64(0)
	for i := 0; i < len(logs); {
		n := min(1+rng.IntN(6), len(logs)-i)
		want := fmt.Sprintf("%+v", deref(ref.f.ApplyBatch(logs[i:i+n])))
		got := fmt.Sprintf("%+v", deref(f.ApplyBatch(logs[i:i+n])))
		if got != want {
			t.Fatalf("entries %d..%d: results differ:\n%s\n%s", i+1, i+n, got, want)
		}
		i += n
		maxLog = max(maxLog, f.Stats().Bloom.HashLogBytes)
		if lb := f.Stats().Bloom.HashLogBytes; logIDs > 0 && lb > 8*uint64(logIDs) {
			t.Fatalf("hash logs hold %d bytes, bound %d", lb, 8*logIDs)
		}
		if rng.IntN(3) != 0 {
			continue
		}
		now := ref.f.LastTimestamp()
		for _, ns := range []string{"", "short"} {
			w, err1 := ref.f.Check(ns, ids, now)
			g, err2 := f.Check(ns, ids, now)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			for j := range w {
				if w[j].Code != g[j].Code {
					t.Fatalf("after entry %d: Check %q of %s answers %s, the reference %s", i, ns, ids[j], g[j].Code, w[j].Code)
				}
			}
		}
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("compactor passes: %d; hash logs peaked at %d bytes; bloom %+v", passes, maxLog, f.Stats().Bloom)
	if logIDs >= 0 && maxLog == 0 {
		t.Fatal("no hash log was kept: the test does not test what it says")
	}
}

// TestCompactionFromLogDoesNotHoldTheFSMLock: replaying a chain's hash log
// needs no exclusion of apply once BeginCompact has taken the view (later
// adds reach the pending filter), just as the storage scan runs after
// f.mu is released. Holding even the shared lock through the replay would
// block ApplyBatch, which takes it exclusively, for the whole replay (up
// to Config.LogIDs hashes: ≈ 30 ms per million), and every Check queued
// behind that writer. The hook runs where the replay starts; apply's lock
// must be free there, and a mark applied there must survive the swap.
func TestCompactionFromLogDoesNotHoldTheFSMLock(t *testing.T) {
	h := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 100}, BloomCompactInterval: -1})
	waitReady(t, h.f)
	f := h.f
	for i := range 2000 { // a chain grown well past its first filter
		wantCode(t, "mark", h.mark(t0, fmt.Sprintf("id-%d", i), 3_600_000), CodeNew)
	}
	f.mu.RLock()
	var k bloom.Key
	for kk := range f.st.registry {
		k = kk
	}
	f.mu.RUnlock()
	replayed := false
	f.beforeLogReplay = func() {
		replayed = true
		if !f.mu.TryLock() {
			t.Error("the FSM lock is held while the hash log is replayed: applies wait for the whole replay")
			return
		}
		f.mu.Unlock()
		// Applied while the compaction runs: through the pending filter.
		wantCode(t, "mark during the replay", h.mark(t0, "during", 3_600_000), CodeNew)
	}
	if err := f.compactChain(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	if !replayed {
		t.Fatal("the chain was not compacted from its hash log")
	}
	if st := f.filters.Stats(); st.Filters != 1 {
		t.Fatalf("chain not compacted: %+v", st)
	}
	ids := [][]byte{[]byte("during")}
	for i := range 2000 {
		ids = append(ids, fmt.Appendf(nil, "id-%d", i))
	}
	wantAllSeen(t, "after the compaction", f, ids)
}
