package bloom

import (
	"slices"
	"testing"
)

// A chain compacted from its hash log is bit for bit the chain compacted
// from storage: the log holds the same hashes storage would give, and IDs
// added while the compaction runs reach both through the pending filter.
func TestCompactionFromLogEqualsCompactionFromStorage(t *testing.T) {
	k := Key{Namespace: 3, Bucket: 9}
	var buf []byte
	grow := func(f *Filters, from, to uint64) {
		for i := from; i < to; i++ {
			f.Add(k, testID(buf[:0], k, i))
		}
	}
	fromLog, fromStorage := New(Config{ExpectedPerBucket: 1000}), New(Config{ExpectedPerBucket: 1000, LogIDs: -1})
	for _, f := range []*Filters{fromLog, fromStorage} {
		f.SetReady(true)
		grow(f, 0, 70_000) // past one log chunk, so a view spans two
	}
	if n := len(fromLog.chains[k].segs); n < 3 {
		t.Fatalf("want a grown chain, have %d segments", n)
	}
	if got := fromLog.Stats().HashLogBytes; got != 8*2*logChunk {
		t.Fatalf("hash log holds %d bytes, want two chunks, %d", got, 8*2*logChunk)
	}
	if got := fromStorage.Stats().HashLogBytes; got != 0 {
		t.Fatalf("LogIDs < 0 keeps %d bytes of hashes", got)
	}

	cpLog := fromLog.BeginCompact(k, 70_000)
	grow(fromLog, 70_000, 71_000) // applied while the compaction runs
	if !cpLog.FromLog() {
		t.Fatal("a chain that logged every ID refused to compact from its log")
	}
	cpStorage := fromStorage.BeginCompact(k, 70_000)
	grow(fromStorage, 70_000, 71_000)
	if cpStorage.FromLog() {
		t.Fatal("a chain without a log claimed to compact from one")
	}
	for i := range uint64(70_000) {
		cpStorage.Add(testID(buf[:0], k, i))
	}
	if !cpLog.Finish() || !cpStorage.Finish() {
		t.Fatal("finish refused")
	}
	a, b := fromLog.chains[k].segs, fromStorage.chains[k].segs
	if len(a) != 1 || len(b) != 1 || a[0].n != 71_000 || b[0].n != 71_000 {
		t.Fatalf("after compaction: %d and %d segments", len(a), len(b))
	}
	if a[0].f.k != b[0].f.k || !slices.Equal(a[0].f.words, b[0].f.words) {
		t.Fatal("the filter compacted from the log differs from the one compacted from storage")
	}
	measure(t, fromLog, liveSet{k: 71_000}, 1000, 1)
}

// The log is memory spent only where it pays, and a compaction never
// trusts a log that does not hold every ID of the bucket.
func TestHashLogIsBoundedAndKeptOnlyWhileUseful(t *testing.T) {
	var buf []byte
	add := func(f *Filters, k Key, from, to uint64) {
		for i := from; i < to; i++ {
			f.Add(k, testID(buf[:0], k, i))
		}
	}
	logs := func(f *Filters, k Key) bool {
		cp := f.BeginCompact(k, f.chains[k].n())
		if cp == nil {
			t.Fatalf("no compaction of %v", k)
		}
		defer cp.Abort()
		return cp.log != nil
	}
	a, b := Key{Namespace: 1, Bucket: 1}, Key{Namespace: 1, Bucket: 2}

	t.Run("bounded", func(t *testing.T) {
		// Slots are counted as allocated: a's first chunk doubles 16 →
		// 4096 for 3000 IDs; b's reaches 512 and its next doubling would
		// pass 5000 slots, so b stops logging; a's next (8192) would too.
		f := New(Config{ExpectedPerBucket: 100, LogIDs: 5000})
		f.SetReady(true)
		add(f, a, 0, 3000)
		add(f, b, 0, 3000)
		if got := f.Stats().HashLogBytes; got != 8*4096 {
			t.Fatalf("hash logs hold %d bytes, want a's 4096 slots, %d", got, 8*4096)
		}
		if !logs(f, a) || logs(f, b) {
			t.Fatalf("logs kept: a %v, b %v; want a only", logs(f, a), logs(f, b))
		}
		add(f, a, 3000, 5000) // past the bound: a stops logging too
		if logs(f, a) || f.Stats().HashLogBytes != 0 {
			t.Fatalf("a chain past the bound still logs (%d bytes)", f.Stats().HashLogBytes)
		}
	})

	t.Run("loaded chains keep none", func(t *testing.T) {
		f := New(Config{ExpectedPerBucket: 100})
		f.SetReady(true)
		add(f, a, 0, 3000)
		g := saveLoad(t, f, 1, Config{ExpectedPerBucket: 100})
		add(g, a, 3000, 4000)
		if logs(g, a) {
			t.Fatal("a chain loaded from a file (whose hashes are not saved) offered a log")
		}
		if got := g.Stats().HashLogBytes; got != 0 {
			t.Fatalf("loaded filters hold %d bytes of hashes", got)
		}
	})

	t.Run("stale logs are dropped", func(t *testing.T) {
		f := New(Config{ExpectedPerBucket: 100})
		f.SetReady(true)
		add(f, a, 0, 3000)
		// 2000 of the 3000 IDs left the bucket (forgotten, moved): the
		// log would set their bits again.
		cp := f.BeginCompact(a, 1000)
		if cp.FromLog() {
			t.Fatal("compacted from a log of which two thirds left the bucket")
		}
		cp.Abort()
		if got := f.Stats().HashLogBytes; got != 0 {
			t.Fatalf("a stale log was kept: %d bytes", got)
		}
	})

	t.Run("freed once the bucket stops growing", func(t *testing.T) {
		f := New(Config{ExpectedPerBucket: 100})
		f.SetReady(true)
		add(f, a, 0, 3000) // a grown chain: compacted when quiet
		add(f, b, 0, 50)   // a small one
		live := liveSet{a: 3000, b: 50}
		if f.CompactionCandidates(live.get, 3, nil); f.Stats().HashLogBytes != 8*(4096+64) {
			t.Fatal("logs dropped while the buckets were growing")
		}
		// Polls 2 and 3 compact a (grown 4×); poll 4 finds both quiet and
		// compacts b (sized for 100, holding 50) from its log; poll 5
		// frees the logs of chains that are quiet and need nothing more.
		for range 4 {
			for _, k := range f.CompactionCandidates(live.get, 3, nil) {
				cp := f.BeginCompact(k, live[k])
				if !cp.FromLog() {
					t.Fatalf("%v: no log to compact from", k)
				}
				cp.Finish()
			}
		}
		if got := f.Stats().HashLogBytes; got != 0 {
			t.Fatalf("quiet buckets still hold %d bytes of hashes", got)
		}
		if n := len(f.chains[a].segs); n != 1 {
			t.Fatalf("quiet grown chain has %d segments, want it compacted", n)
		}
		measure(t, f, live, 100, 1)
	})

	t.Run("dropped with the bucket", func(t *testing.T) {
		f := New(Config{ExpectedPerBucket: 100})
		f.SetReady(true)
		add(f, a, 0, 100)
		add(f, b, 0, 200)
		add(f, Key{Namespace: 2, Bucket: 1}, 0, 300)
		f.Drop(a) // slots: a 128, b 256, the other namespace's 512
		if got := f.Stats().HashLogBytes; got != 8*(256+512) {
			t.Fatalf("after Drop: %d bytes, want %d", got, 8*(256+512))
		}
		f.DropNamespace(1)
		if got := f.Stats().HashLogBytes; got != 8*512 {
			t.Fatalf("after DropNamespace: %d bytes, want %d", got, 8*512)
		}
		f.Reset()
		if got := f.Stats().HashLogBytes; got != 0 {
			t.Fatalf("after Reset: %d bytes", got)
		}
	})
}
