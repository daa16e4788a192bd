package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// newBuffered opens an FSM with the given buffer limits, its Pebble
// database on fs (nil: the OS's).
func newBuffered(t *testing.T, lim BufferLimits, fs vfs.FS) *FSM {
	t.Helper()
	dir := t.TempDir()
	f, err := New(Config{Dir: dir, Bloom: bloom.Config{ExpectedPerBucket: 1000}, Buffer: lim, Storage: storage.Options{FS: fs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// reopenOn opens a new FSM whose database is the one at dir/db on fs (a
// crash clone): dir is only where Pebble looks on fs; the Bloom filter
// file goes to a fresh OS directory.
func reopenOn(t *testing.T, fs vfs.FS, dbDir string) *FSM {
	t.Helper()
	dir := t.TempDir()
	// Pebble opens Dir/db: give the clone the same layout under dir.
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(dbDir, filepath.Join(dir, dbDirName)); err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Dir: dir, Bloom: bloom.Config{ExpectedPerBucket: 1000}, Storage: storage.Options{FS: fs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// applyAll applies logs[from:] in batches of random size and returns the
// responses, indexed like logs (nil before from).
func applyAll(f *FSM, logs []*raft.Log, from int, rng *rand.Rand) []any {
	out := make([]any, len(logs))
	for i := from; i < len(logs); {
		n := min(1+rng.IntN(16), len(logs)-i)
		copy(out[i:], f.ApplyBatch(logs[i:i+n]))
		i += n
	}
	return out
}

// TestBufferFlushBoundariesChangeNothing: replicas that commit their write
// buffers at different points (every entry; after a few records or
// entries; at Pebble's large-batch size; when a digest or snapshot asks)
// give the same results, the same Check answers at every step, and the
// same state.
func TestBufferFlushBoundariesChangeNothing(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			logs := randomLog(100+seed, 500)
			rng := rand.New(rand.NewPCG(seed, 7))
			ref := newBuffered(t, BufferLimits{MaxEntries: 1}, nil) // commits after every ApplyBatch
			fs := []*FSM{
				newBuffered(t, BufferLimits{}, nil),
				newBuffered(t, BufferLimits{MaxRecords: 1 + rng.IntN(8), MaxEntries: 1 + rng.IntN(20)}, nil),
				newBuffered(t, BufferLimits{MaxBytes: 100 + rng.IntN(2000)}, nil),
			}
			ids := make([][]byte, 40)
			for i := range ids {
				ids[i] = fmt.Appendf(nil, "id-%d", i)
			}
			for i := 0; i < len(logs); {
				n := min(1+rng.IntN(24), len(logs)-i)
				want := fmt.Sprintf("%+v", deref(ref.ApplyBatch(logs[i:i+n])))
				for j, f := range fs {
					// Each replica splits the same entries differently.
					var got []any
					for k := i; k < i+n; {
						m := min(1+rng.IntN(n), i+n-k)
						got = append(got, f.ApplyBatch(logs[k:k+m])...)
						k += m
					}
					if g := fmt.Sprintf("%+v", deref(got)); g != want {
						t.Fatalf("replica %d, entries %d..%d: results differ:\n%s\n%s", j, i+1, i+n, g, want)
					}
				}
				i += n
				now := ref.LastTimestamp()
				for _, ns := range []string{"", "short"} {
					wantC, err := ref.Check(ns, ids, now)
					if err != nil {
						t.Fatal(err)
					}
					for j, f := range fs {
						gotC, err := f.Check(ns, ids, now)
						if err != nil {
							t.Fatal(err)
						}
						if g, w := fmt.Sprintf("%+v", gotC), fmt.Sprintf("%+v", wantC); g != w {
							t.Fatalf("replica %d after entry %d: Check %q differs:\n%s\n%s", j, i, ns, g, w)
						}
					}
				}
				switch rng.IntN(10) {
				case 0: // a digest commits the buffer of one replica
					if _, err := fs[rng.IntN(len(fs))].Digest(); err != nil {
						t.Fatal(err)
					}
				case 1: // so does a snapshot
					s, err := fs[rng.IntN(len(fs))].Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					s.Release()
				}
			}
			want, _ := ref.Digest()
			for j, f := range fs {
				if got, _ := f.Digest(); !bytes.Equal(got, want) {
					t.Fatalf("replica %d: state differs from the replica committing every entry", j)
				}
			}
		})
	}
}

// deref turns []any of *ApplyResult / *ApplyErr into values for printing.
func deref(rs []any) []any {
	out := make([]any, len(rs))
	for i, r := range rs {
		switch r := r.(type) {
		case *ApplyResult:
			out[i] = *r
		case *ApplyErr:
			out[i] = *r
		default:
			out[i] = r
		}
	}
	return out
}

// TestCrashLosesOnlyTheBufferAndReplayIsExact simulates a kill -9 or a
// power loss at random points (Pebble's crashable in-memory file system:
// the clone keeps what was synced plus a random part of what was not, so
// a batch may be cut anywhere in the WAL). The reopened FSM must hold the
// state of a prefix of the log, never a partly applied entry: its applied
// index is persisted in the same batch as the data, at least the last
// snapshot's index (Snapshot commits the buffer and syncs). Raft then
// replays the entries after it: each must give exactly the answer the
// uncrashed replica gave (an entry applied twice would not: a second Mark
// answers DUPLICATE), and the final state must equal the uncrashed one's.
func TestCrashLosesOnlyTheBufferAndReplayIsExact(t *testing.T) {
	between := 0 // runs that reopened past the last snapshot, short of the crash point
	for seed := range uint64(10) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			logs := randomLog(200+seed, 400)
			// The uncrashed replica, entry by entry: its answers, and its
			// state after every prefix of the log.
			ref := newBuffered(t, BufferLimits{}, nil)
			want := make([]any, len(logs))
			prefix := make([][]byte, len(logs)+1)
			for i := 0; i <= len(logs); i++ {
				if i > 0 {
					want[i-1] = deref(ref.ApplyBatch(logs[i-1 : i]))[0]
				}
				d, err := ref.Digest()
				if err != nil {
					t.Fatal(err)
				}
				prefix[i] = d
			}
			wantDigest := prefix[len(logs)]

			mem := vfs.NewCrashableMem()
			lim := BufferLimits{MaxRecords: 1 + rng.IntN(30), MaxEntries: 1 + rng.IntN(40)}
			f := newBuffered(t, lim, mem)
			dbDir := filepath.Join(f.cfg.Dir, dbDirName)
			crashAt := 1 + rng.IntN(len(logs)-1)
			var snapped, synced uint64
			for i := 0; i < crashAt; {
				n := min(1+rng.IntN(16), crashAt-i)
				f.ApplyBatch(logs[i : i+n])
				i += n
				switch rng.IntN(8) {
				case 0:
					// Pebble's WAL reaches the disk (as the OS would write it
					// back): what the FSM committed survives, the buffer not.
					if err := f.db.LogData(nil, pebble.Sync); err != nil {
						t.Fatal(err)
					}
					synced = f.PersistedIndex()
				case 1:
					s, err := f.Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					s.Release()
					snapped = f.AppliedIndex()
				}
			}
			crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})

			g := reopenOn(t, crashed, dbDir)
			p := g.AppliedIndex()
			if p < max(snapped, synced) || p > uint64(crashAt) {
				t.Fatalf("reopened at applied index %d; the last snapshot was at %d, the last WAL sync at %d, the crash after %d", p, snapped, synced, crashAt)
			}
			if p > snapped && p < uint64(crashAt) {
				between++
			}
			// Exactly the state after entry p: the index and the data it
			// covers were persisted together.
			if d, err := g.Digest(); err != nil || !bytes.Equal(d, prefix[p]) {
				t.Fatalf("reopened at applied index %d with a state other than the log prefix up to %d (err %v)", p, p, err)
			}
			if p != g.PersistedIndex() {
				t.Fatalf("reopened with applied %d but persisted %d", p, g.PersistedIndex())
			}
			// Raft re-delivers from its snapshot on: entries at or below p
			// are skipped, the rest applied once.
			got := deref(applyAll(g, logs, int(snapped), rng))
			for i := range logs {
				idx := uint64(i + 1)
				switch {
				case idx <= uint64(snapped):
				case idx <= p:
					if got[i] != nil {
						t.Fatalf("entry %d at or below the persisted index %d applied again: %+v", idx, p, got[i])
					}
				default:
					if g, w := fmt.Sprintf("%+v", got[i]), fmt.Sprintf("%+v", want[i]); g != w {
						t.Fatalf("replayed entry %d (persisted index %d) answers differently:\n%s\n%s", idx, p, g, w)
					}
				}
			}
			t.Logf("crash after %d, last snapshot %d, reopened at %d", crashAt, snapped, p)
			gotDigest, err := g.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotDigest, wantDigest) {
				t.Fatalf("after crash at %d (persisted %d) and replay, state differs from the uncrashed replica", crashAt, p)
			}
		})
	}
	if between == 0 {
		t.Fatal("no run reopened between its last snapshot and its crash point: the replay of a lost buffer was not exercised")
	}
}

// TestBufferedRecordsAndBucketDrops: records still in the buffer answer
// Check; an expiry drop of their bucket removes them from reads at once
// and from the database at commit; a Forget of a buffered record hides the
// stored one; a deleted namespace's buffered records never reappear.
func TestBufferedRecordsAndBucketDrops(t *testing.T) {
	h := newHarness(t)
	h.f.cfg.Buffer = BufferLimits{MaxRecords: 1 << 20, MaxEntries: 1 << 20}.withDefaults()
	wantCode(t, "mark", h.mark(t0, "a", 10_000), CodeNew)
	h.f.mu.Lock()
	h.f.flushLocked() // "a" is in Pebble
	h.f.mu.Unlock()
	wantCode(t, "mark b", h.mark(t0, "b", 10_000), CodeNew)
	if p, a := h.f.PersistedIndex(), h.f.AppliedIndex(); p >= a {
		t.Fatalf("persisted %d, applied %d: b should be buffered", p, a)
	}
	wantCode(t, "buffered b", h.check(t0, "b"), CodeSeen)
	// Forget "a" (stored) while buffered: the removal shadows Pebble.
	wantCode(t, "forget a", h.one(t0, Op{Kind: OpForget, Items: []Item{{ID: []byte("a")}}}), CodeOK)
	wantCode(t, "forgotten a", h.check(t0, "a"), CodeNotSeen)
	wantCode(t, "mark a again", h.mark(t0, "a", 10_000), CodeNew)
	wantCode(t, "forget a again", h.one(t0, Op{Kind: OpForget, Items: []Item{{ID: []byte("a")}}}), CodeOK)
	// Expiry: a tick past both records' bucket drops it.
	h.apply(t0+3_600_000, Op{Kind: OpTick})
	wantCode(t, "expired b", h.check(t0+3_600_000, "b"), CodeNotSeen)
	wantCode(t, "mark b after expiry", h.mark(t0+3_600_000, "b", 10_000), CodeNew)
	d1, _ := h.f.Digest()
	n := 0
	if err := scanRecords(h.f.db, func(k, _ []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d records in the database after the commit, want 1 (b)", n)
	}
	// A namespace deleted with buffered records, and one created after it.
	cfg := FillNamespaceDefaults(NamespaceConfig{Name: "x"})
	h.apply(t0+3_600_000, Op{Kind: OpCreateNamespace, Config: cfg})
	h.one(t0+3_600_000, Op{Kind: OpMark, Namespace: "x", Items: []Item{{ID: []byte("q")}}})
	h.apply(t0+3_600_000, Op{Kind: OpDeleteNamespace, Namespace: "x"})
	h.apply(t0+3_600_000, Op{Kind: OpCreateNamespace, Config: cfg})
	r, err := h.f.Check("x", [][]byte{[]byte("q")}, t0+3_600_000)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "q in the recreated namespace", r[0], CodeNotSeen)
	h.reopen() // Close commits the buffer
	if p, a := h.f.PersistedIndex(), h.f.AppliedIndex(); p != a || a != h.index {
		t.Fatalf("after reopen persisted %d, applied %d, want %d", p, a, h.index)
	}
	d2, _ := h.f.Digest()
	if bytes.Equal(d1, d2) {
		t.Fatal("the namespace ops changed nothing")
	}
	wantCode(t, "b after reopen", h.check(t0+3_600_000, "b"), CodeSeen)
}

// TestRecordsBeingCommittedStayVisible: while a full buffer is written to
// Pebble in the background, applies go on into a new buffer, and the
// sealed buffer's records answer Check and apply's lookups from its
// overlay (a second mark is a DUPLICATE, a forget in the new buffer hides
// one); the database holds none of them yet. Once the write is done the
// persisted index reaches the sealed buffer, and a reopened FSM holds
// every record.
func TestRecordsBeingCommittedStayVisible(t *testing.T) {
	h := newHarness(t)
	h.f.cfg.Buffer = BufferLimits{MaxRecords: 10, MaxEntries: 1 << 20}.withDefaults()
	started, release := make(chan struct{}), make(chan struct{})
	var hold, unhold sync.Once
	h.f.beforeFlush = func() { hold.Do(func() { close(started); <-release }) }
	// Runs before the harness closes the FSM (cleanups run last first):
	// Close waits for the held write.
	t.Cleanup(func() { unhold.Do(func() { close(release) }) })
	id := func(i int) string { return fmt.Sprintf("id-%d", i) }
	for i := range 10 {
		wantCode(t, "mark "+id(i), h.mark(t0, id(i), 10_000), CodeNew)
	}
	<-started // the tenth record filled the buffer; its write waits
	sealed := h.index
	if p := h.f.PersistedIndex(); p >= sealed {
		t.Fatalf("persisted index %d while the buffer up to %d is held", p, sealed)
	}
	stored := 0
	if err := scanRecords(h.f.db, func(k, _ []byte) error { stored++; return nil }); err != nil {
		t.Fatal(err)
	}
	if stored != 0 {
		t.Fatalf("%d records in the database before the held write", stored)
	}
	for i := range 10 {
		wantCode(t, "check "+id(i), h.check(t0, id(i)), CodeSeen)
	}
	wantCode(t, "mark again", h.mark(t0, id(3), 10_000), CodeDuplicate)
	wantCode(t, "forget", h.one(t0, Op{Kind: OpForget, Items: []Item{{ID: []byte(id(4))}}}), CodeOK)
	wantCode(t, "forgotten", h.check(t0, id(4)), CodeNotSeen)
	wantCode(t, "mark new", h.mark(t0, "fresh", 10_000), CodeNew)
	unhold.Do(func() { close(release) })
	deadline := time.Now().Add(30 * time.Second)
	for h.f.PersistedIndex() < sealed {
		if time.Now().After(deadline) {
			t.Fatalf("persisted index %d, want ≥ %d after the write was released", h.f.PersistedIndex(), sealed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.reopen()
	for i := range 10 {
		want := CodeSeen
		if i == 4 {
			want = CodeNotSeen
		}
		wantCode(t, "after reopen "+id(i), h.check(t0, id(i)), want)
	}
	wantCode(t, "fresh after reopen", h.check(t0, "fresh"), CodeSeen)
}

// TestCheckOfANamespaceDeletedDuringItsScreen: a Check reads its namespace,
// then screens its IDs with the Bloom filters without fsm.mu. A namespace
// deleted in between has no chains left, which rules out every ID, yet no
// moment had the namespace with those IDs absent: the Check must say the
// namespace is not found. Deleted and created again in between, the IDs
// are looked up in the new namespace (absent there).
func TestCheckOfANamespaceDeletedDuringItsScreen(t *testing.T) {
	h := newHarness(t)
	waitReady(t, h.f) // the screen runs only once the filters are ready
	cfg := FillNamespaceDefaults(NamespaceConfig{Name: "x"})
	h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
	h.one(t0, Op{Kind: OpMark, Namespace: "x", Items: []Item{{ID: []byte("q")}, {ID: []byte("r")}}})
	r, err := h.f.Check("x", [][]byte{[]byte("q"), []byte("s")}, t0)
	if err != nil || r[0].Code != CodeSeen || r[1].Code != CodeNotSeen {
		t.Fatalf("before the delete: %v %v, want seen, not seen", r, err)
	}

	h.f.beforeScreen = func() {
		h.f.beforeScreen = nil
		h.apply(t0, Op{Kind: OpDeleteNamespace, Namespace: "x"})
	}
	r, err = h.f.Check("x", [][]byte{[]byte("q"), []byte("r")}, t0)
	if !errors.Is(err, ErrNamespaceNotFound) {
		t.Fatalf("namespace deleted during the check: %v %v, want ErrNamespaceNotFound", r, err)
	}

	h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
	h.one(t0, Op{Kind: OpMark, Namespace: "x", Items: []Item{{ID: []byte("q")}}})
	h.f.beforeScreen = func() {
		h.f.beforeScreen = nil
		h.apply(t0, Op{Kind: OpDeleteNamespace, Namespace: "x"})
		h.apply(t0, Op{Kind: OpCreateNamespace, Config: cfg})
		h.one(t0, Op{Kind: OpMark, Namespace: "x", Items: []Item{{ID: []byte("r")}}})
	}
	r, err = h.f.Check("x", [][]byte{[]byte("q"), []byte("r")}, t0)
	if err != nil || r[0].Code != CodeNotSeen || r[1].Code != CodeSeen {
		t.Fatalf("namespace created again during the check: %v %v, want q not seen, r seen", r, err)
	}
}
