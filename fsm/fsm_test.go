package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// harness feeds commands to an FSM as the Raft log would.
type harness struct {
	t     *testing.T
	f     *FSM
	dir   string
	cfg   Config // without Dir; reopen uses it again
	index uint64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 1000}})
}

// newHarnessConfig opens an FSM with cfg in a fresh directory.
func newHarnessConfig(t *testing.T, cfg Config) *harness {
	t.Helper()
	dir := t.TempDir()
	cfg.Dir = dir
	if cfg.windowShift == 0 {
		// Windows of 4 records: the tests' few IDs spread over many, and
		// lookups, moves and removals cross them.
		cfg.windowShift = 2
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, dir: dir, cfg: cfg}
	t.Cleanup(func() { h.f.Close() })
	return h
}

func (h *harness) reopen() {
	h.t.Helper()
	if err := h.f.Close(); err != nil {
		h.t.Fatal(err)
	}
	f, err := New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.f = f
}

func logOf(index uint64, cmd *Command) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: AppendCommand(nil, cmd)}
}

// apply applies one command as the next log entry and returns its result.
func (h *harness) apply(ts int64, ops ...Op) *ApplyResult {
	h.t.Helper()
	h.index++
	r := h.f.Apply(logOf(h.index, &Command{TimestampMs: ts, Ops: ops}))
	res, ok := r.(*ApplyResult)
	if !ok {
		h.t.Fatalf("apply returned %T %v", r, r)
	}
	return res
}

func (h *harness) one(ts int64, op Op) ItemResult {
	h.t.Helper()
	res := h.apply(ts, op)
	if err := res.Ops[0].Err; err != nil {
		h.t.Fatalf("%s: %v", op.Kind, err)
	}
	return res.Ops[0].Items[0]
}

func (h *harness) mark(ts int64, id string, ttl int64) ItemResult {
	return h.one(ts, Op{Kind: OpMark, DurationMs: ttl, Items: []Item{{ID: []byte(id)}}})
}

// markMany marks ids in one entry (one Apply, not one per ID: the tests
// that only need a large state build it at a fraction of the cost under
// -race) and fails the test unless every one answers NEW.
func (h *harness) markMany(ts int64, ttl int64, ids []string) {
	h.t.Helper()
	op := Op{Kind: OpMark, DurationMs: ttl}
	for _, id := range ids {
		op.Items = append(op.Items, Item{ID: []byte(id)})
	}
	res := h.apply(ts, op)
	if err := res.Ops[0].Err; err != nil {
		h.t.Fatalf("mark %d IDs: %v", len(ids), err)
	}
	for i, it := range res.Ops[0].Items {
		if it.Code != CodeNew {
			h.t.Fatalf("mark %s: %v, want new", ids[i], it.Code)
		}
	}
}

func (h *harness) check(ts int64, id string) ItemResult {
	h.t.Helper()
	r, err := h.f.Check("", [][]byte{[]byte(id)}, ts)
	if err != nil {
		h.t.Fatal(err)
	}
	return r[0]
}

func wantCode(t *testing.T, what string, got ItemResult, want Code) {
	t.Helper()
	if got.Code != want {
		t.Fatalf("%s: got %s, want %s (record %+v)", what, got.Code, want, got.Record)
	}
}

const t0 = int64(1_700_000_000_000)

func TestMarkThenDuplicate(t *testing.T) {
	h := newHarness(t)
	wantCode(t, "first mark", h.mark(t0, "a", 60_000), CodeNew)
	wantCode(t, "second mark", h.mark(t0+1, "a", 60_000), CodeDuplicate)
	r := h.check(t0+2, "a")
	wantCode(t, "check", r, CodeSeen)
	if r.Record.FirstSeenMs != t0 || r.Record.ExpiresMs != t0+60_000 {
		t.Fatalf("record %+v", r.Record)
	}
	wantCode(t, "check other", h.check(t0, "b"), CodeNotSeen)
}

func TestInvariant7_RetryWithTokenReturnsFirstAnswer(t *testing.T) {
	h := newHarness(t)
	op := Op{Kind: OpMark, Items: []Item{{ID: []byte("m"), Token: []byte("tok-1")}}}
	wantCode(t, "first", h.one(t0, op), CodeNew)
	wantCode(t, "retry same token", h.one(t0+5, op), CodeNew)
	op.Items[0].Token = []byte("tok-2")
	wantCode(t, "other caller", h.one(t0+6, op), CodeDuplicate)

	claim := Op{Kind: OpClaim, Items: []Item{{ID: []byte("c"), Token: []byte("tok-3")}}}
	first := h.one(t0, claim)
	wantCode(t, "claim", first, CodeAcquired)
	again := h.one(t0+1, claim)
	wantCode(t, "claim retry", again, CodeAcquired)
	if again.Record.Fence != first.Record.Fence {
		t.Fatalf("retry fence %d, first %d", again.Record.Fence, first.Record.Fence)
	}
}

func TestConflictOnDifferentDigest(t *testing.T) {
	h := newHarness(t)
	mk := func(d string) Op { return Op{Kind: OpMark, Items: []Item{{ID: []byte("x"), Digest: []byte(d)}}} }
	wantCode(t, "first", h.one(t0, mk("d1")), CodeNew)
	wantCode(t, "same digest", h.one(t0, mk("d1")), CodeDuplicate)
	wantCode(t, "other digest", h.one(t0, mk("d2")), CodeConflict)
	wantCode(t, "no digest", h.one(t0, mk("")), CodeDuplicate)
}

func TestExpiryAtBucketEdges(t *testing.T) {
	h := newHarness(t)
	ns, _ := h.f.Namespace("")
	w := ns.BucketWidthMs
	// Start exactly at a bucket boundary so the record's expiry is the last
	// millisecond of its bucket's span plus one.
	start := (t0/w + 1) * w
	ttl := w - 1
	wantCode(t, "mark", h.mark(start, "edge", ttl), CodeNew)
	exp := start + ttl
	wantCode(t, "just before expiry", h.check(exp-1, "edge"), CodeSeen)
	wantCode(t, "at expiry", h.check(exp, "edge"), CodeNotSeen)
	if got := h.f.Stats().IDsStored; got != 1 {
		t.Fatalf("stored %d before bucket end, want 1", got)
	}
	// A tick one ms before the bucket's end keeps it; at the end it drops.
	bucketEnd := (exp/w + 1) * w
	h.apply(bucketEnd-1, Op{Kind: OpTick})
	if got := h.f.Stats().Buckets; got != 1 {
		t.Fatalf("buckets %d one ms before bucket end, want 1", got)
	}
	if n := h.f.ExpiredBuckets(bucketEnd); n != 1 {
		t.Fatalf("ExpiredBuckets at end = %d, want 1", n)
	}
	h.apply(bucketEnd, Op{Kind: OpTick})
	if s := h.f.Stats(); s.Buckets != 0 || s.IDsStored != 0 {
		t.Fatalf("after bucket end: %+v", s)
	}
	wantCode(t, "mark after drop", h.mark(bucketEnd+1, "edge", ttl), CodeNew)
}

func TestInvariant6_ExpiredBucketDropDoesNotRemoveNewerRecord(t *testing.T) {
	h := newHarness(t)
	ns, _ := h.f.Namespace("")
	w := ns.BucketWidthMs
	start := (t0/w + 1) * w
	wantCode(t, "short mark", h.mark(start, "id", 1000), CodeNew)
	// Expired but its bucket is still live: re-marking records anew in a
	// later bucket.
	wantCode(t, "re-mark after expiry", h.mark(start+1000, "id", 3*w), CodeNew)
	h.apply(start+w, Op{Kind: OpTick}) // drops the first bucket
	wantCode(t, "newer record survives", h.check(start+w, "id"), CodeSeen)
	wantCode(t, "and is a duplicate", h.mark(start+w+1, "id", 1000), CodeDuplicate)
}

func TestFixedVersusSlidingExpiry(t *testing.T) {
	h := newHarness(t)
	create := func(name string, mode ExpiryMode) {
		cfg := FillNamespaceDefaults(NamespaceConfig{Name: name, DefaultTTLMs: 10_000, MaxTTLMs: 60_000, Mode: mode})
		if r := h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg}); r.Ops[0].Err != nil {
			t.Fatal(r.Ops[0].Err)
		}
	}
	create("fixed", ExpiryFixed)
	create("sliding", ExpirySliding)
	for _, name := range []string{"fixed", "sliding"} {
		op := Op{Kind: OpMark, Namespace: name, Items: []Item{{ID: []byte("p")}}}
		h.one(t0, op)
		dup := h.one(t0+8_000, op)
		wantCode(t, name+" duplicate", dup, CodeDuplicate)
		res, err := h.f.Check(name, [][]byte{[]byte("p")}, t0+12_000)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]Code{"fixed": CodeNotSeen, "sliding": CodeSeen}[name]
		wantCode(t, name+" at t0+12s", res[0], want)
	}
}

func TestClaimCommitReleaseAndLeaseExpiry(t *testing.T) {
	h := newHarness(t)
	claim := func(ts int64, id, tok string) ItemResult {
		return h.one(ts, Op{Kind: OpClaim, DurationMs: 5_000, Items: []Item{{ID: []byte(id), Token: []byte(tok)}}})
	}
	lease := func(ts int64, kind OpKind, id string, fence uint64) ItemResult {
		op := Op{Kind: kind, Items: []Item{{ID: []byte(id), Fence: fence}}}
		if kind == OpRenew {
			op.DurationMs = 5_000
		}
		return h.one(ts, op)
	}

	// claim → commit
	a := claim(t0, "a", "w1")
	wantCode(t, "claim a", a, CodeAcquired)
	wantCode(t, "second claimant", claim(t0+1, "a", "w2"), CodeInProgress)
	wantCode(t, "check leased", h.check(t0+1, "a"), CodeSeen)
	wantCode(t, "commit", lease(t0+2, OpCommit, "a", a.Record.Fence), CodeOK)
	wantCode(t, "commit retry", lease(t0+3, OpCommit, "a", a.Record.Fence), CodeOK)
	wantCode(t, "claim after commit", claim(t0+4, "a", "w3"), CodeDuplicate)
	wantCode(t, "mark after commit", h.mark(t0+4, "a", 0), CodeDuplicate)

	// claim → release → redelivery claims at once with a larger fence
	b := claim(t0, "b", "w1")
	wantCode(t, "release", lease(t0+1, OpRelease, "b", b.Record.Fence), CodeOK)
	wantCode(t, "release retry", lease(t0+2, OpRelease, "b", b.Record.Fence), CodeOK)
	wantCode(t, "check released", h.check(t0+2, "b"), CodeNotSeen)
	b2 := claim(t0+3, "b", "w2")
	wantCode(t, "reclaim", b2, CodeAcquired)
	if b2.Record.Fence <= b.Record.Fence {
		t.Fatalf("fence did not grow: %d then %d", b.Record.Fence, b2.Record.Fence)
	}
	wantCode(t, "stale fence commit", lease(t0+4, OpCommit, "b", b.Record.Fence), CodeLeaseLost)
	wantCode(t, "stale fence renew", lease(t0+4, OpRenew, "b", b.Record.Fence), CodeLeaseLost)
	wantCode(t, "stale fence release", lease(t0+4, OpRelease, "b", b.Record.Fence), CodeLeaseLost)

	// lease expiry ends the lifetime: another claimant wins, the old holder
	// learns at commit.
	c := claim(t0, "c", "w1")
	wantCode(t, "renew", lease(t0+4_000, OpRenew, "c", c.Record.Fence), CodeOK)
	wantCode(t, "still held after renew", claim(t0+8_000, "c", "w2"), CodeInProgress)
	c2 := claim(t0+9_000, "c", "w2")
	wantCode(t, "claim after lease expiry", c2, CodeAcquired)
	wantCode(t, "old holder commit", lease(t0+9_001, OpCommit, "c", c.Record.Fence), CodeLeaseLost)
	wantCode(t, "expired lease commit", lease(t0+20_000, OpCommit, "c", c2.Record.Fence), CodeLeaseLost)

	// forget makes an ID processable again
	wantCode(t, "forget", h.one(t0+5, Op{Kind: OpForget, Items: []Item{{ID: []byte("a")}}}), CodeOK)
	wantCode(t, "mark after forget", h.mark(t0+6, "a", 0), CodeNew)
}

func TestUnknownNamespaceAppliesNothing(t *testing.T) {
	h := newHarness(t)
	r := h.apply(t0, Op{Kind: OpMark, Namespace: "nope", Items: []Item{{ID: []byte("a")}}})
	if !errors.Is(r.Ops[0].Err, ErrNamespaceNotFound) {
		t.Fatalf("want ErrNamespaceNotFound, got %v", r.Ops[0].Err)
	}
	if _, err := h.f.Check("nope", [][]byte{[]byte("a")}, t0); !errors.Is(err, ErrNamespaceNotFound) {
		t.Fatalf("check of unknown namespace: want ErrNamespaceNotFound, got %v", err)
	}
	// Only metadata (applied index, timestamp) may change: no record, no
	// bucket, no namespace appears.
	for _, prefix := range []byte{storage.PrefixRecord, storage.PrefixWindowedRecord, storage.PrefixBucket, storage.PrefixNamespace} {
		n := 0
		if err := scanPrefix(h.f.db, []byte{prefix}, func(k, _ []byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		want := 0
		if prefix == storage.PrefixNamespace {
			want = 1 // "default"
		}
		if n != want {
			t.Fatalf("%d keys with prefix %q after a rejected op, want %d", n, prefix, want)
		}
	}
}

// randomLog builds a reproducible log exercising every op kind over a small
// ID space, with time advancing across bucket boundaries.
func randomLog(seed uint64, n int) []*raft.Log {
	rng := rand.New(rand.NewPCG(seed, seed))
	var logs []*raft.Log
	ts := t0
	kinds := []OpKind{OpMark, OpMark, OpMark, OpClaim, OpClaim, OpCommit, OpRenew, OpRelease, OpForget, OpTick}
	// A namespace with 4 s buckets, so buckets expire and drop often.
	short := FillNamespaceDefaults(NamespaceConfig{Name: "short", MaxTTLMs: 120_000, DefaultTTLMs: 10_000, Mode: ExpirySliding})
	logs = append(logs, logOf(1, &Command{TimestampMs: ts, Ops: []Op{{Kind: OpCreateNamespace, Config: short}}}))
	for i := 1; i < n; i++ {
		ts += int64(rng.IntN(20_000))
		cmd := Command{TimestampMs: ts}
		for range 1 + rng.IntN(3) {
			k := kinds[rng.IntN(len(kinds))]
			op := Op{Kind: k}
			if rng.IntN(2) == 0 {
				op.Namespace = "short"
			}
			if k != OpTick {
				for range 1 + rng.IntN(4) {
					op.Items = append(op.Items, Item{
						ID:     fmt.Appendf(nil, "id-%d", rng.IntN(40)),
						Token:  fmt.Appendf(nil, "t-%d", rng.IntN(5)),
						Digest: fmt.Appendf(nil, "d-%d", rng.IntN(2)),
						Fence:  uint64(1 + rng.IntN(i+1)),
					})
				}
				if k == OpMark || k == OpClaim || k == OpRenew || k == OpCommit {
					op.DurationMs = int64(rng.IntN(120_000))
				}
			} else {
				op.Namespace = ""
			}
			cmd.Ops = append(cmd.Ops, op)
		}
		logs = append(logs, logOf(uint64(len(logs)+1), &cmd))
	}
	return logs
}

func TestInvariant5_DeterministicApply_SameLogSameState(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testDeterministic(t, seed) })
	}
}

func testDeterministic(t *testing.T, seed uint64) {
	logs := randomLog(seed, 600)
	a, b := newHarness(t), newHarness(t)
	// a applies one entry at a time and commits each to Pebble; b applies
	// batches of random size and commits its write buffer every few
	// records or entries (seed-dependent): neither batching nor where the
	// buffer is committed may change the outcome.
	a.f.cfg.Buffer = BufferLimits{MaxEntries: 1}.withDefaults()
	b.f.cfg.Buffer = BufferLimits{MaxRecords: 1 + int(seed)*7, MaxEntries: 1 + int(seed)*13}.withDefaults()
	var resA, resB []any
	for _, l := range logs {
		resA = append(resA, a.f.Apply(l))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(logs); {
		n := min(1+rng.IntN(64), len(logs)-i)
		resB = append(resB, b.f.ApplyBatch(logs[i:i+n])...)
		i += n
	}
	da, _ := a.f.Digest()
	db, _ := b.f.Digest()
	if !bytes.Equal(da, db) {
		t.Fatal("replicas fed the same log differ")
	}
	for i := range resA {
		ra, rb := fmt.Sprintf("%+v", resA[i]), fmt.Sprintf("%+v", resB[i])
		if ra != rb {
			t.Fatalf("entry %d: results differ:\n%s\n%s", i+1, ra, rb)
		}
	}
	// And a third replica restored from a's snapshot ends identical too.
	c := newHarness(t)
	restoreFrom(t, a.f, c.f)
	dc, _ := c.f.Digest()
	if !bytes.Equal(da, dc) {
		t.Fatal("restored replica differs")
	}
}

func TestReplayAfterRestartChangesNothing(t *testing.T) {
	h := newHarness(t)
	logs := randomLog(11, 200)
	h.f.ApplyBatch(logs)
	before, _ := h.f.Digest()
	h.reopen()
	if got := h.f.AppliedIndex(); got != uint64(len(logs)) {
		t.Fatalf("applied index after restart = %d, want %d", got, len(logs))
	}
	// Raft re-delivers entries after the last snapshot: they must be skipped.
	for _, r := range h.f.ApplyBatch(logs) {
		if r != nil {
			t.Fatalf("replayed entry produced %v", r)
		}
	}
	after, _ := h.f.Digest()
	if !bytes.Equal(before, after) {
		t.Fatal("replay changed state")
	}
}

func restoreFrom(t *testing.T, src, dst *FSM) {
	t.Helper()
	snap, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var buf bytes.Buffer
	if err := snap.(*snapshot).writeStream(&buf); err != nil {
		t.Fatal(err)
	}
	if err := dst.Restore(io.NopCloser(&buf)); err != nil {
		t.Fatal(err)
	}
}

func TestInvariant8_SnapshotRestoreReplacesStateWhole(t *testing.T) {
	src, dst := newHarness(t), newHarness(t)
	src.mark(t0, "in-snapshot", 60_000)
	dst.mark(t0, "only-in-dst", 60_000)
	restoreFrom(t, src.f, dst.f)
	wantCode(t, "snapshot id", dst.check(t0+1, "in-snapshot"), CodeSeen)
	wantCode(t, "id absent from snapshot", dst.check(t0+1, "only-in-dst"), CodeNotSeen)
	if dst.f.AppliedIndex() != src.f.AppliedIndex() {
		t.Fatalf("applied %d, want %d", dst.f.AppliedIndex(), src.f.AppliedIndex())
	}
	// The restored state survives a restart.
	dst.reopen()
	wantCode(t, "after restart", dst.check(t0+1, "in-snapshot"), CodeSeen)
}

func TestInvariant8_CorruptSnapshotIsRejectedAndStateKept(t *testing.T) {
	src, dst := newHarness(t), newHarness(t)
	for i := range 50 {
		src.mark(t0, fmt.Sprint("s", i), 60_000)
	}
	dst.mark(t0, "keep", 60_000)
	before, _ := dst.f.Digest()
	snap, _ := src.f.Snapshot()
	var buf bytes.Buffer
	if err := snap.(*snapshot).writeStream(&buf); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	good := buf.Bytes()
	cases := map[string][]byte{
		"flipped byte": func() []byte { b := bytes.Clone(good); b[len(b)/2] ^= 0x40; return b }(),
		"truncated":    good[:len(good)-10],
		"empty":        nil,
		"bad magic":    append([]byte("XXXXXXXX"), good[8:]...),
	}
	for name, data := range cases {
		if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err == nil {
			t.Fatalf("%s: restore succeeded", name)
		}
		after, _ := dst.f.Digest()
		if !bytes.Equal(before, after) {
			t.Fatalf("%s: state changed by a rejected snapshot", name)
		}
	}
	wantCode(t, "kept", dst.check(t0+1, "keep"), CodeSeen)
}

func TestInvariant4_BloomNeverDecidesSeen(t *testing.T) {
	h := newHarness(t)
	waitReady(t, h.f)
	for i := range 2000 {
		h.mark(t0, fmt.Sprint("present-", i), 60_000)
	}
	// Absent IDs: some hit Bloom false positives; every answer must still be
	// NOT_SEEN because a "maybe" goes to storage.
	ids := make([][]byte, 5000)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "absent-%d", i)
	}
	res, err := h.f.Check("", ids, t0+1)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Code != CodeNotSeen {
			t.Fatalf("absent id %s answered %s", ids[i], r.Code)
		}
	}
	st := h.f.Stats().Bloom
	if st.FalsePositives == 0 {
		t.Logf("no false positives among %d lookups (rate %.4f)", len(ids), st.ObservedFPRate)
	}
	if st.ObservedFPRate > 0.05 {
		t.Fatalf("observed false-positive rate %.4f far above configured %.2f", st.ObservedFPRate, st.FPRate)
	}
}

func waitReady(t *testing.T, f *FSM) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f.filters.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("bloom filters not ready after 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBloomFiltersSavedOnCloseLoadedOnStart(t *testing.T) {
	h := newHarness(t)
	waitReady(t, h.f)
	for i := range 500 {
		h.mark(t0, fmt.Sprint("r", i), 60_000)
	}
	h.reopen()
	if !h.f.filters.Ready() {
		t.Fatal("filters saved at a clean close were not loaded at start")
	}
	for i := range 500 {
		wantCode(t, "after restart", h.check(t0+1, fmt.Sprint("r", i)), CodeSeen)
	}
}

func TestBloomCorruptSavedFiltersDiscardedAndRebuilt(t *testing.T) {
	h := newHarness(t)
	waitReady(t, h.f)
	for i := range 500 {
		h.mark(t0, fmt.Sprint("r", i), 60_000)
	}
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(h.dir, filtersFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Dir: h.dir, Bloom: bloom.Config{ExpectedPerBucket: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	h.f = f
	// Until the rebuild ends reads go to storage, so answers are right
	// either way.
	for i := range 500 {
		wantCode(t, "during rebuild", h.check(t0+1, fmt.Sprint("r", i)), CodeSeen)
	}
	waitReady(t, h.f)
	for i := range 500 {
		wantCode(t, "after restart", h.check(t0+1, fmt.Sprint("r", i)), CodeSeen)
	}
	if st := h.f.Stats().Bloom; st.IDs != 500 {
		t.Fatalf("rebuilt filters hold %d ids, want 500", st.IDs)
	}
}

func TestWaitAppliedUnblocksOnApply(t *testing.T) {
	h := newHarness(t)
	done := make(chan error, 1)
	go func() { done <- h.f.WaitApplied(context.Background(), 1) }()
	h.mark(t0, "x", 0)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitApplied did not return after apply")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := h.f.WaitApplied(ctx, 100); err == nil {
		t.Fatal("want deadline error")
	}
}

func TestTimestampNeverGoesBackwards(t *testing.T) {
	h := newHarness(t)
	h.mark(t0+10_000, "late", 5_000)
	// A new leader with a slower clock stamps an earlier time: apply uses the
	// later one, so the record expires no earlier.
	r := h.mark(t0, "early", 5_000)
	if r.Record.FirstSeenMs != t0+10_000 {
		t.Fatalf("first seen %d, want %d", r.Record.FirstSeenMs, t0+10_000)
	}
	if h.f.LastTimestamp() != t0+10_000 {
		t.Fatalf("last ts %d", h.f.LastTimestamp())
	}
}

func TestNamespaceLifecycle(t *testing.T) {
	h := newHarness(t)
	cfg := FillNamespaceDefaults(NamespaceConfig{Name: "orders", DefaultTTLMs: 60_000})
	r := h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
	if r.Ops[0].Err != nil || r.Ops[0].Namespace.ID == 0 {
		t.Fatalf("create: %+v", r.Ops[0])
	}
	if r := h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg}); r.Ops[0].Err == nil {
		t.Fatal("second create succeeded")
	}
	h.one(t0, Op{Kind: OpMark, Namespace: "orders", Items: []Item{{ID: []byte("o1")}}})
	if r := h.apply(t0, Op{Kind: OpUpdateNamespace, Config: NamespaceConfig{Name: "orders", MaxIDBytes: 2}}); r.Ops[0].Err != nil {
		t.Fatal(r.Ops[0].Err)
	}
	// The lowered ID limit is enforced at apply time too.
	if r := h.apply(t0, Op{Kind: OpMark, Namespace: "orders", Items: []Item{{ID: []byte("long")}}}); r.Ops[0].Err == nil {
		t.Fatal("mark over new limit succeeded")
	}
	if r := h.apply(t0, Op{Kind: OpDeleteNamespace, Namespace: "orders"}); r.Ops[0].Err != nil {
		t.Fatal(r.Ops[0].Err)
	}
	if s := h.f.Stats(); s.IDsStored != 0 || s.Buckets != 0 {
		t.Fatalf("namespace delete left %+v", s)
	}
	h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
	res, err := h.f.Check("orders", [][]byte{[]byte("o1")}, t0)
	if err != nil || res[0].Code != CodeNotSeen {
		t.Fatalf("recreated namespace sees old id: %v %v", res, err)
	}
	if r := h.apply(t0, Op{Kind: OpDeleteNamespace, Namespace: "default"}); r.Ops[0].Err == nil {
		t.Fatal("deleting default succeeded")
	}
}

func TestInvariant6_BoundedGrowth_ExpiredBucketsFreeTheirSpace(t *testing.T) {
	h := newHarness(t)
	cfg := FillNamespaceDefaults(NamespaceConfig{Name: "window", DefaultTTLMs: 60_000, MaxTTLMs: 60_000})
	h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
	for batch := range 20 {
		op := Op{Kind: OpMark, Namespace: "window"}
		for i := range 1000 {
			op.Items = append(op.Items, Item{ID: fmt.Appendf(nil, "id-%02d-%05d-padding-to-64-bytes-of-message-id-xxxxxxxxxxxxxxxx", batch, i)})
		}
		h.one(t0, op)
	}
	// Every record into Pebble, then into sstables: the write buffer is
	// committed in the background, so without waiting for it the sstables
	// may not hold the records yet.
	commitBuffer(h.f)
	if err := h.f.db.Flush(); err != nil {
		t.Fatal(err)
	}
	tables := func() int64 {
		m := h.f.db.Metrics()
		var n int64
		for i := range m.Levels {
			n += m.Levels[i].TablesSize
		}
		return n
	}
	full := tables()
	if got := h.f.Stats().IDsStored; got != 20_000 {
		t.Fatalf("stored %d, want 20000", got)
	}
	// One tick past the window drops every bucket: a handful of range
	// deletions, not 20 000 deletes.
	h.apply(t0+2*cfg.MaxTTLMs, Op{Kind: OpTick})
	if s := h.f.Stats(); s.IDsStored != 0 || s.Buckets != 0 {
		t.Fatalf("after expiry: %+v", s)
	}
	res, _ := h.f.Check("window", [][]byte{[]byte("id-00-00000-padding-to-64-bytes-of-message-id-xxxxxxxxxxxxxxxx")}, t0+2*cfg.MaxTTLMs)
	wantCode(t, "expired id", res[0], CodeNotSeen)
	// The compactor turns the range deletions into free space: the
	// sstables holding the expired records go away. (It has seconds of
	// work; the deadline is for two loaded cores under -race.)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if err := h.f.db.Flush(); err != nil {
			t.Fatal(err)
		}
		now := tables()
		if now < full/10 {
			t.Logf("sstable bytes %d -> %d", full, now)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sstables still hold %d bytes (was %d) five minutes after the buckets expired", now, full)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
