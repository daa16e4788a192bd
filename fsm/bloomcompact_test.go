package fsm

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dedupnode/dedupnode/bloom"
)

// Compaction brings a bucket's grown chain to one filter of ≤ 10 bits per
// live ID, and no stored ID is ever answered "not seen": not while marks
// are applied during the compaction, not after Save/Load, not after a
// rebuild. Whether a chain is rebuilt from its hash log or from storage.
func TestBloomCompactionKeepsEveryIDAndShrinksFilters(t *testing.T) {
	for name, logIDs := range map[string]int{"from-hash-log": 0, "from-storage": -1} {
		t.Run(name, func(t *testing.T) { testBloomCompaction(t, logIDs) })
	}
}

func testBloomCompaction(t *testing.T, logIDs int) {
	// The test drives every compaction itself: the background poller
	// would otherwise compact the chain whenever a slow (-race, loaded)
	// run leaves the bucket quiet for 2 s, before the chain is measured.
	// Windows of 4096 records: its 10 000 IDs in one bucket would make
	// thousands of the harness's 4-record windows, each a seek for every
	// lookup that reaches storage. A first filter of 400 IDs grows the
	// chain to five filters by 8 000 IDs, as 1 000 would by 20 000, with
	// fewer lookups (under -race each storage lookup records a stack trace
	// per sstable it opens, in Pebble's invariant checks); far fewer IDs
	// would leave the compacted filter, rounded up to whole blocks, above
	// 10 bits per ID.
	h := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 400, LogIDs: logIDs}, BloomCompactInterval: -1, windowShift: 12})
	const ttl = 3_600_000
	const total = 10_000 // IDs marked in all
	// markRange marks id-from..id-to-1 and returns how many did not answer
	// NEW (it may run on another goroutine: no Fatal).
	markRange := func(from, to int) (notNew int) {
		for i := from; i < to; i += 200 {
			op := Op{Kind: OpMark, DurationMs: ttl}
			for j := i; j < min(i+200, to); j++ {
				op.Items = append(op.Items, Item{ID: fmt.Appendf(nil, "id-%d", j)})
			}
			h.index++
			res, ok := h.f.Apply(logOf(h.index, &Command{TimestampMs: t0, Ops: []Op{op}})).(*ApplyResult)
			if !ok || res.Ops[0].Err != nil {
				return to - from
			}
			for _, it := range res.Ops[0].Items {
				if it.Code != CodeNew {
					notNew++
				}
			}
		}
		return notNew
	}
	checkAll := func(what string, f *FSM, n int) {
		t.Helper()
		ids := make([][]byte, 0, n)
		for i := range n {
			ids = append(ids, fmt.Appendf(nil, "id-%d", i))
		}
		wantAllSeen(t, what, f, ids)
	}
	if n := markRange(0, 8_000); n != 0 {
		t.Fatalf("%d marks did not answer NEW", n)
	}
	if st := h.f.Stats().Bloom; st.Filters < 3 || st.BitsPerID <= 10 {
		t.Fatalf("before compaction: %+v, want a grown chain", st)
	}
	ctx := context.Background()
	// The first poll records the chains' counts; the second finds the
	// bucket quiet. Marks applied meanwhile must survive the swap.
	if err := h.f.compactFilters(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var notNew int
	wg.Add(1)
	go func() {
		defer wg.Done()
		notNew = markRange(8_000, 8_800)
	}()
	if err := h.f.compactFilters(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if notNew != 0 {
		t.Fatalf("%d marks during compaction did not answer NEW", notNew)
	}
	// Marks that landed after the swap grew the chain again; how many did
	// depends on timing, and a bucket is compacted again only once its
	// count moved 10 % past the compacted one. Grow it past that, so the
	// next quiet poll compacts it whatever the interleaving was.
	if n := markRange(8_800, total); n != 0 {
		t.Fatalf("%d marks did not answer NEW", n)
	}
	for range 2 {
		if err := h.f.compactFilters(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := h.f.Stats().Bloom
	t.Logf("after compaction: %d filters, %d IDs, %.2f bits/ID", st.Filters, st.IDs, st.BitsPerID)
	if st.Filters != 1 || st.BitsPerID > 10 {
		t.Fatalf("after compaction: %+v, want one filter of ≤ 10 bits per ID", st)
	}
	checkAll("after compaction", h.f, total)
	h.reopen() // Save at Close, Load at open
	if !h.f.filters.Ready() {
		t.Fatal("saved filters not loaded")
	}
	checkAll("after reopen", h.f, total)
	// A rebuild sizes each bucket's filter from its record count.
	h.f.filters.Reset()
	snap := h.f.db.NewSnapshot()
	err := h.f.rebuildFilters(ctx, snap)
	snap.Close()
	if err != nil {
		t.Fatal(err)
	}
	h.f.filters.SetReady(true)
	if st := h.f.Stats().Bloom; st.Filters != 1 || st.BitsPerID > 10 {
		t.Fatalf("after rebuild: %+v", st)
	}
	checkAll("after rebuild", h.f, total)
	wantCode(t, "absent", h.check(t0+2, "never"), CodeNotSeen)
}

// wantAllSeen fails the test unless every one of ids answers Check SEEN:
// a stored ID answered NOT_SEEN is a Bloom false negative.
func wantAllSeen(t *testing.T, what string, f *FSM, ids [][]byte) {
	t.Helper()
	res, err := f.Check("", ids, t0+1)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Code != CodeSeen {
			t.Fatalf("%s: %s answers %s: a Bloom false negative", what, ids[i], r.Code)
		}
	}
}
