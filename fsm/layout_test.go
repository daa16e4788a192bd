package fsm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// The fixture testdata/layout-v1 is a data directory written by the last
// version without write windows (its README lists every record). Its
// commands were applied at fixtureT0 and after; its applied index is 11.
const (
	fixtureT0      = int64(1_765_000_000_000)
	fixtureApplied = 11
)

// openFixture copies testdata/layout-v1 to a fresh directory and opens it
// with the configuration that wrote it (so its saved Bloom filters load),
// unless rebuild, which deletes them so the filters are rebuilt from
// storage.
func openFixture(t *testing.T, rebuild bool) *harness {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/layout-v1")); err != nil {
		t.Fatal(err)
	}
	if rebuild {
		if err := os.Remove(filepath.Join(dir, filtersFile)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{
		Dir:                  dir,
		Bloom:                bloom.Config{ExpectedPerBucket: 1000},
		Storage:              storage.Options{MemTableBytes: 1 << 20, CacheBytes: 8 << 20},
		BloomCompactInterval: -1,
		windowShift:          2,
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, dir: dir, cfg: cfg, index: fixtureApplied}
	t.Cleanup(func() { h.f.Close() })
	waitReady(t, f)
	if got := f.AppliedIndex(); got != fixtureApplied {
		t.Fatalf("fixture opened at applied index %d, want %d", got, fixtureApplied)
	}
	return h
}

// seenIDs is the answer every ID of the fixture (and a few it never held)
// must get from Check at a time before any of its records expires.
type seenIDs map[string]map[string]bool // namespace → ID → seen

func fixtureAnswers() seenIDs {
	want := seenIDs{"default": {}, "orders": {}}
	for i := range 300 {
		want["default"][fmt.Sprintf("mark-%03d", i)] = true
	}
	for i := range 20 {
		want["default"][fmt.Sprintf("claim-%02d", i)] = i < 10 || i >= 15 // 10–14 released
		want["default"][fmt.Sprintf("long-%02d", i)] = true
	}
	for i := range 50 {
		want["orders"][fmt.Sprintf("order-%02d", i)] = true
	}
	for _, id := range []string{"mark-300", "claim-20", "long-20", "order-00", "nope"} {
		want["default"][id] = false
	}
	for _, id := range []string{"mark-000", "claim-00", "order-50"} {
		want["orders"][id] = false
	}
	return want
}

func (want seenIDs) check(t *testing.T, f *FSM, now int64, what string) {
	t.Helper()
	for ns, ids := range want {
		for id, seen := range ids {
			r, err := f.Check(ns, [][]byte{[]byte(id)}, now)
			if err != nil {
				t.Fatal(err)
			}
			if got := r[0].Code == CodeSeen; got != seen {
				t.Fatalf("%s: %s/%s seen=%v, want %v (%+v)", what, ns, id, got, seen, r[0])
			}
		}
	}
}

// countKeys counts the legacy and the windowed record keys in the database.
func countKeys(t *testing.T, f *FSM) (legacy, windowed int) {
	t.Helper()
	err := scanRecords(f.db, func(k, _ []byte) error {
		if k[0] == storage.PrefixRecord {
			legacy++
		} else {
			windowed++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return legacy, windowed
}

// A data directory written before write windows is read as it was: every
// record answers as before, with the filters it saved or rebuilt from its
// legacy keys. Records rewritten in their bucket stay under their legacy
// key, moved ones leave it, new ones go to windows, including windows of
// a bucket that also holds legacy keys; all of that survives a restart,
// a filter rebuild and a snapshot restore, and expiry drops both kinds.
func TestLegacyDataDirReadAndExtendedWithWindows(t *testing.T) {
	for _, rebuild := range []bool{false, true} {
		t.Run(fmt.Sprintf("rebuild=%v", rebuild), func(t *testing.T) {
			h := openFixture(t, rebuild)
			want := fixtureAnswers()
			now := fixtureT0 + 20_000
			want.check(t, h.f, now, "as written")
			if c, err := h.f.CountRecords(now); err != nil || c != (RecordCounts{Committed: 380, Leased: 5, Released: 5}) {
				t.Fatalf("CountRecords = %+v, %v; want 380 committed, 5 leased, 5 released", c, err)
			}

			wantCode(t, "legacy duplicate", h.mark(now, "mark-000", 0), CodeDuplicate)
			// Leases of the legacy bucket 490277, committed: they move to
			// bucket 490301 (24 h), a legacy bucket, into its windows.
			for i := 15; i < 20; i++ {
				wantCode(t, "commit legacy lease", h.one(now, Op{Kind: OpCommit, Items: []Item{{ID: fmt.Appendf(nil, "claim-%02d", i), Fence: 4}}}), CodeOK)
			}
			wantCode(t, "forget legacy record", h.one(now, Op{Kind: OpForget, Items: []Item{{ID: []byte("mark-001")}}}), CodeOK)
			want["default"]["mark-001"] = false
			for i := range 10 {
				id := fmt.Sprintf("new-%02d", i)
				wantCode(t, "new ID", h.mark(now, id, 0), CodeNew)
				want["default"][id] = true
			}
			// A legacy record's digest still decides duplicate or conflict.
			wantCode(t, "legacy record with its digest", h.one(now, Op{Kind: OpMark, Namespace: "orders", Items: []Item{{ID: []byte("order-07"), Digest: []byte("dig-order-07")}}}), CodeDuplicate)
			wantCode(t, "legacy record, other digest", h.one(now, Op{Kind: OpMark, Namespace: "orders", Items: []Item{{ID: []byte("order-07"), Digest: []byte("other")}}}), CodeConflict)
			want.check(t, h.f, now, "after the new writes, buffered")

			h.reopen()
			waitReady(t, h.f)
			want.check(t, h.f, now, "after a restart")
			// 390 legacy records, 5 moved out and 1 forgotten; 5 moved and
			// 10 new ones in windows (shift 2: 15 records in windows 0–3).
			if legacy, windowed := countKeys(t, h.f); legacy != 384 || windowed != 15 {
				t.Fatalf("%d legacy and %d windowed record keys, want 384 and 15", legacy, windowed)
			}
			e := h.f.st.registry[bloom.Key{Namespace: 1, Bucket: 490301}]
			if !e.legacy || e.count != 310-1+5+10 || e.inserts != 15 || e.windows() != 4 {
				t.Fatalf("bucket 490301: %+v (windows %d), want legacy, 324 records, 15 inserts in 4 windows", e, e.windows())
			}

			// The filters rebuilt from both layouts answer the same.
			if err := h.f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(h.dir, filtersFile)); err != nil {
				t.Fatal(err)
			}
			f, err := New(h.cfg)
			if err != nil {
				t.Fatal(err)
			}
			h.f = f
			waitReady(t, f)
			want.check(t, h.f, now, "after a filter rebuild")

			// A snapshot of the mixed state restores whole.
			r := newHarness(t)
			restoreFrom(t, h.f, r.f)
			waitReady(t, r.f)
			want.check(t, r.f, now, "restored from a snapshot")
			d1, _ := h.f.Digest()
			d2, _ := r.f.Digest()
			if !bytes.Equal(d1, d2) {
				t.Fatal("restored replica's digest differs")
			}

			// Past every record's expiry, every bucket is dropped with both
			// its legacy and its windowed keys.
			end := fixtureT0 + 8*86_400_000
			h.apply(end, Op{Kind: OpTick})
			h.f.mu.Lock()
			h.f.flushLocked()
			h.f.mu.Unlock()
			if legacy, windowed := countKeys(t, h.f); legacy != 0 || windowed != 0 {
				t.Fatalf("after expiry: %d legacy and %d windowed record keys, want none", legacy, windowed)
			}
			if n := len(h.f.st.registry); n != 0 {
				t.Fatalf("after expiry: %d buckets in the registry, want 0", n)
			}
		})
	}
}

// A bucket's new records fill its windows in the order they are written,
// 1<<shift records each; a record rewritten in its bucket keeps its key,
// one forgotten and marked again goes to the current window, and every
// one of them is found (as a duplicate, and by Check) from the database,
// whichever window holds it.
func TestWindowsHoldABucketsRecordsInWriteOrder(t *testing.T) {
	h := newHarness(t) // windows of 4 records
	waitReady(t, h.f)
	const n = 22
	id := func(i int) string { return fmt.Sprintf("w-%02d", i) }
	for i := range n {
		wantCode(t, "new", h.mark(t0, id(i), 60_000), CodeNew)
	}
	// A claim committed in its bucket is rewritten in place.
	r := h.one(t0, Op{Kind: OpClaim, DurationMs: 60_000, Items: []Item{{ID: []byte("lease")}}})
	wantCode(t, "claim", r, CodeAcquired)
	wantCode(t, "commit", h.one(t0, Op{Kind: OpCommit, DurationMs: 60_000, Items: []Item{{ID: []byte("lease"), Fence: r.Record.Fence}}}), CodeOK)
	wantCode(t, "forget", h.one(t0, Op{Kind: OpForget, Items: []Item{{ID: []byte(id(1))}}}), CodeOK)
	wantCode(t, "mark again", h.mark(t0, id(1), 60_000), CodeNew)
	h.f.mu.Lock()
	h.f.flushLocked()
	h.f.mu.Unlock()

	got := recordLocs(t, h.f)
	want := map[string]storage.Loc{"lease": storage.WindowLoc(n / 4)}
	for i := range n {
		want[id(i)] = storage.WindowLoc(uint32(i / 4))
	}
	want[id(1)] = storage.WindowLoc((n + 1) / 4) // the 24th insert
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record windows:\n got %v\nwant %v", got, want)
	}
	for i := range n {
		wantCode(t, "duplicate", h.mark(t0+1, id(i), 60_000), CodeDuplicate)
		wantCode(t, "check", h.check(t0+1, id(i)), CodeSeen)
	}
	wantCode(t, "absent", h.check(t0+1, "w-99"), CodeNotSeen)
}

// A bucket keeps the window size it was created with when a later version
// creates buckets with another (this version's one window a bucket, after
// 0d70e03's windows of 2^20 records): its new records go on filling its
// windows in order, a new bucket's all go to window 0, and every record is
// found, from the buffer and from the database, before and after a
// restart.
func TestBucketsKeepTheirWindowSizeWhenNewOnesGetAnother(t *testing.T) {
	h := newHarness(t) // windows of 4 records, as an older version's
	waitReady(t, h.f)
	old := func(i int) string { return fmt.Sprintf("old-%02d", i) }
	fresh := func(i int) string { return fmt.Sprintf("new-%02d", i) }
	const minute, twoHours = 60_000, 2 * 3_600_000 // two buckets (1 h wide)
	for i := range 10 {
		wantCode(t, "old bucket, old version", h.mark(t0, old(i), minute), CodeNew)
	}

	h.cfg.windowShift = windowShift
	h.reopen()
	waitReady(t, h.f)
	for i := 10; i < 16; i++ {
		wantCode(t, "old bucket, new version", h.mark(t0, old(i), minute), CodeNew)
	}
	for i := range 9 {
		wantCode(t, "new bucket", h.mark(t0, fresh(i), twoHours), CodeNew)
	}
	answers := func(when string) {
		t.Helper()
		for i := range 16 {
			wantCode(t, when+": duplicate "+old(i), h.mark(t0+1, old(i), minute), CodeDuplicate)
			wantCode(t, when+": check "+old(i), h.check(t0+1, old(i)), CodeSeen)
		}
		for i := range 9 {
			wantCode(t, when+": duplicate "+fresh(i), h.mark(t0+1, fresh(i), twoHours), CodeDuplicate)
			wantCode(t, when+": check "+fresh(i), h.check(t0+1, fresh(i)), CodeSeen)
		}
		wantCode(t, when+": absent", h.check(t0+1, "never"), CodeNotSeen)
	}
	answers("buffered")
	h.f.mu.Lock()
	h.f.flushLocked()
	h.f.mu.Unlock()

	got := recordLocs(t, h.f)
	want := map[string]storage.Loc{}
	for i := range 16 {
		want[old(i)] = storage.WindowLoc(uint32(i / 4))
	}
	for i := range 9 {
		want[fresh(i)] = storage.WindowLoc(0)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("record windows:\n got %v\nwant %v", got, want)
	}
	answers("stored")
	h.reopen()
	waitReady(t, h.f)
	answers("after a restart")
}

// Two replicas that give new buckets different window sizes (versions
// 0d70e03 and later, during a rolling upgrade) apply the same entries:
// every answer is the same, on marks and on checks, but their digests
// differ, since the registry entries (and past one window, the keys)
// differ. docs/OPERATIONS.md tells operators so.
func TestReplicasWithDifferentWindowSizesAnswerAlikeAndDigestApart(t *testing.T) {
	windowed := newHarness(t) // windows of 4 records
	single := newHarnessConfig(t, Config{Bloom: bloom.Config{ExpectedPerBucket: 1000}, windowShift: windowShift})
	var entries []Op
	for i := range 30 {
		entries = append(entries, Op{Kind: OpMark, DurationMs: 60_000, Items: []Item{{ID: fmt.Appendf(nil, "id-%02d", i%20)}}})
	}
	entries = append(entries,
		Op{Kind: OpForget, Items: []Item{{ID: []byte("id-03")}}},
		Op{Kind: OpMark, DurationMs: 7_200_000, Items: []Item{{ID: []byte("id-03")}}})
	for i, op := range entries {
		a, b := windowed.one(t0+int64(i), op), single.one(t0+int64(i), op)
		if a.Code != b.Code {
			t.Fatalf("entry %d (%s %s): %s with windows of 4, %s with one window", i, op.Kind, op.Items[0].ID, a.Code, b.Code)
		}
	}
	for _, h := range []*harness{windowed, single} {
		h.f.mu.Lock()
		h.f.flushLocked()
		h.f.mu.Unlock()
	}
	ids := [][]byte{[]byte("id-00"), []byte("id-03"), []byte("id-19"), []byte("id-20")}
	a, err := windowed.f.Check("", ids, t0+100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := single.f.Check("", ids, t0+100)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if a[i].Code != b[i].Code {
			t.Fatalf("check %s: %s with windows of 4, %s with one window", ids[i], a[i].Code, b[i].Code)
		}
	}
	if got := []Code{a[0].Code, a[1].Code, a[2].Code, a[3].Code}; fmt.Sprint(got) != fmt.Sprint([]Code{CodeSeen, CodeSeen, CodeSeen, CodeNotSeen}) {
		t.Fatalf("checks answered %v", got)
	}
	da, err := windowed.f.Digest()
	if err != nil {
		t.Fatal(err)
	}
	db, err := single.f.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(da, db) {
		t.Fatal("replicas with different window sizes have equal digests; docs/OPERATIONS.md says they differ")
	}
}

// One window a bucket holds any number of records: with this version's
// shift the window of the record after 2^32 inserts is still 0.
func TestOneWindowHoldsEveryInsert(t *testing.T) {
	for _, inserts := range []uint64{0, 1, 1 << 20, 1<<32 + 5, 1<<40 - 1} {
		e := bucketEntry{inserts: inserts, shift: windowShift}
		if got := e.nextLoc(); got != storage.WindowLoc(0) {
			t.Errorf("after %d inserts the next record goes to %v, want window 0", inserts, got)
		}
		want := uint32(1)
		if inserts == 0 {
			want = 0
		}
		if got := e.windows(); got != want {
			t.Errorf("after %d inserts: %d windows, want %d", inserts, got, want)
		}
		enc := appendBucketEntry(nil, e)
		if d, err := decodeBucketEntry(enc, 20); err != nil || d != e {
			t.Errorf("round trip of %+v: %+v, %v", e, d, err)
		}
	}
}

// recordLocs maps every stored record's ID to where its key puts it.
func recordLocs(t *testing.T, f *FSM) map[string]storage.Loc {
	t.Helper()
	got := map[string]storage.Loc{}
	err := scanRecords(f.db, func(k, _ []byte) error {
		_, _, loc, rid, ok := storage.ParseRecordKey(k)
		if !ok {
			return fmt.Errorf("bad record key %x", k)
		}
		got[string(rid)] = loc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}
