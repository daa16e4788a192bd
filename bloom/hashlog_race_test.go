package bloom

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// hashStore is the test's storage for TestHashLogCompactionsRacingAddsMovesAndDrops:
// every live ID (namespace, number) and the bucket holding it, as fsm's
// records and bucket registry. It is guarded by the test's "apply lock",
// which plays fsm.mu: held exclusively while IDs are added to the filters
// and the store changes, shared while a compaction begins and captures its
// source.
type hashStore struct {
	where map[uint32]map[uint64]uint64 // ns → id → bucket
	count map[Key]uint                 // live buckets and their record counts
	lo    map[uint32]uint64            // each namespace's oldest live bucket
}

func hashStoreID(dst []byte, ns uint32, i uint64) []byte {
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], i)
	return HashKey(dst, ns, id[:])
}

func hashOf(data []byte) uint64 {
	var p Probe
	p.Reset(data)
	p.prepare(0)
	return p.h
}

func (s *hashStore) live(k Key) (uint, bool) { n, ok := s.count[k]; return n, ok }

// idsOf returns the HashKeys of bucket k's records (a storage scan).
func (s *hashStore) idsOf(k Key) [][]byte {
	var out [][]byte
	for i, b := range s.where[k.Namespace] {
		if b == k.Bucket {
			out = append(out, hashStoreID(nil, k.Namespace, i))
		}
	}
	return out
}

// checkLogsLocked verifies, with adds excluded, the two properties a
// compaction from a log stands on: f.logged is the sum of the live chains'
// log slots (their chunks' capacity) and within the bound, and every chain that keeps a log has
// logged every ID its bucket holds. It returns a description of the first
// violation, or "".
func (s *hashStore) checkLogsLocked(f *Filters) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	sum := 0
	for k, c := range f.chains {
		if c.log == nil {
			continue
		}
		sum += c.log.slots
		m, slots := 0, 0
		set := make(map[uint64]struct{}, c.log.n)
		for _, ch := range c.log.chunks {
			m += len(ch)
			slots += cap(ch)
			for _, h := range ch {
				set[h] = struct{}{}
			}
		}
		if m != c.log.n || slots != c.log.slots {
			return fmt.Sprintf("%v: log chunks hold %d hashes in %d slots, log.n = %d, slots = %d", k, m, slots, c.log.n, c.log.slots)
		}
		for i, b := range s.where[k.Namespace] {
			if b != k.Bucket {
				continue
			}
			if _, ok := set[hashOf(hashStoreID(nil, k.Namespace, i))]; !ok {
				return fmt.Sprintf("%v: stored ID %d is missing from the chain's hash log (a compaction from it would lose the ID)", k, i)
			}
		}
	}
	if sum != f.logged {
		return fmt.Sprintf("f.logged = %d, the live chains' logs hold %d", f.logged, sum)
	}
	if f.cfg.LogIDs > 0 && f.logged > f.cfg.LogIDs {
		return fmt.Sprintf("f.logged = %d passes LogIDs = %d", f.logged, f.cfg.LogIDs)
	}
	if f.cfg.LogIDs < 0 && sum != 0 {
		return fmt.Sprintf("LogIDs < 0 but %d hashes logged", sum)
	}
	return ""
}

// TestHashLogCompactionsRacingAddsMovesAndDrops is a randomized model check
// of compaction from hash logs. One goroutine plays apply: it adds IDs to
// buckets, moves IDs between buckets (a sliding expiry), forgets them and
// marks them again, expires the oldest bucket, drops a random bucket (which
// is then recreated by later adds), drops a whole namespace, rebuilds the
// filters after a Reset (AddIfLive, as after a crash) and Saves/Loads them
// (chains without logs). Another plays fsm's compactor: it polls
// CompactionCandidates and also compacts random chains, beginning each
// compaction with adds excluded but reading the log view (FromLog) WITHOUT
// the apply lock, so appends to the same log (also to its first chunk,
// which grows by append) race the read; sometimes it aborts. Two readers
// test stored IDs and the logs' invariants all along.
//
// Never allowed: a stored ID answered "definitely not"; a chain keeping a
// log that misses a stored ID; f.logged differing from the logs' sum or
// passing LogIDs; a log view changing under the compaction reading it
// (and, under -race, any data race).
func TestHashLogCompactionsRacingAddsMovesAndDrops(t *testing.T) {
	for _, tc := range []struct {
		name   string
		logIDs int
	}{
		{"bound-reached", 1500}, // chains pass the bound and stop logging
		{"default-bound", 0},
		{"no-logs", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(1) {
				t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testHashLogRace(t, tc.logIDs, seed) })
			}
		})
	}
}

func testHashLogRace(t *testing.T, logIDs int, seed uint64) {
	const (
		nss    = 2
		ids    = 2500 // per namespace
		window = 4    // live buckets per namespace
	)
	ops := 40_000
	if raceEnabled {
		ops = 25_000
	}
	cfg := Config{ExpectedPerBucket: 16, LogIDs: logIDs}
	f := New(cfg)
	f.SetReady(true)
	s := &hashStore{where: map[uint32]map[uint64]uint64{}, count: map[Key]uint{}, lo: map[uint32]uint64{}}
	for ns := uint32(1); ns <= nss; ns++ {
		s.where[ns] = map[uint64]uint64{}
		s.lo[ns] = 100
	}
	var ex sync.RWMutex // the apply lock (fsm.mu)

	var (
		wg                                       sync.WaitGroup
		stop                                     = make(chan struct{})
		failed                                   atomic.Pointer[string]
		finished, fromLog, aborted, refused      atomic.Int64
		probes, logChecks, midCompactionFromLogs atomic.Int64
	)
	fail := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		failed.CompareAndSwap(nil, &msg)
	}

	// The compactor.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 7))
		compact := func(k Key) {
			ex.RLock()
			n, ok := s.count[k]
			if !ok {
				ex.RUnlock()
				return
			}
			cp := f.BeginCompact(k, n)
			if cp == nil {
				ex.RUnlock()
				return
			}
			var src [][]byte
			var viewSum uint64
			viewN := -1
			if cp.log == nil {
				src = s.idsOf(k) // the source captured with adds excluded
			} else {
				viewN = 0
				for _, ch := range cp.log.chunks {
					for _, h := range ch {
						viewSum += h*0x9E3779B97F4A7C15 + 1
						viewN++
					}
				}
				if viewN != cp.log.n {
					fail("%v: view holds %d hashes, says %d", k, viewN, cp.log.n)
				}
			}
			ex.RUnlock()
			if rng.IntN(25) == 0 {
				cp.Abort()
				aborted.Add(1)
				return
			}
			if cp.FromLog() != (viewN >= 0) {
				fail("%v: FromLog = %v with a view of %d hashes", k, !(viewN >= 0), viewN)
				return
			}
			if viewN < 0 {
				for _, d := range src {
					cp.Add(d)
				}
			} else {
				// Read the view again, still without any lock, while
				// apply appends: it must not have changed.
				var again uint64
				for _, ch := range cp.log.chunks {
					for _, h := range ch {
						again += h*0x9E3779B97F4A7C15 + 1
					}
				}
				if again != viewSum {
					fail("%v: the log view changed while the compaction read it", k)
				}
				midCompactionFromLogs.Add(1)
			}
			if cp.Finish() {
				finished.Add(1)
				if viewN >= 0 {
					fromLog.Add(1)
				}
			} else {
				refused.Add(1)
			}
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			ex.RLock()
			keys := f.CompactionCandidates(s.live, 1+rng.IntN(2), nil)
			var all []Key
			for k := range s.count {
				all = append(all, k)
			}
			ex.RUnlock()
			for _, k := range keys {
				compact(k)
			}
			if len(all) > 0 {
				compact(all[rng.IntN(len(all))])
			}
		}
	}()

	// Readers.
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(100+r)))
			var buf []byte
			var p Probe
			var cands []uint64
			for it := 0; ; it++ {
				select {
				case <-stop:
					return
				default:
				}
				ex.RLock()
				if !f.Ready() {
					ex.RUnlock()
					continue
				}
				ns := uint32(1 + rng.IntN(nss))
				for range 64 {
					i := uint64(rng.IntN(ids))
					b, ok := s.where[ns][i]
					if !ok {
						continue
					}
					buf = hashStoreID(buf[:0], ns, i)
					probes.Add(1)
					if !f.MayContain(Key{ns, b}, buf) {
						fail("false negative: ns %d id %d in bucket %d", ns, i, b)
					}
					p.Reset(buf)
					var ready bool
					cands, ready = f.Candidates(ns, &p, cands[:0])
					found := false
					for _, c := range cands {
						found = found || c == b
					}
					if ready && !found {
						fail("false negative (Candidates): ns %d id %d in bucket %d", ns, i, b)
					}
				}
				if it%16 == r {
					if msg := s.checkLogsLocked(f); msg != "" {
						fail("%s", msg)
					}
					logChecks.Add(1)
				}
				ex.RUnlock()
			}
		}()
	}

	// Apply.
	rng := rand.New(rand.NewPCG(seed, 1))
	var buf []byte
	add := func(ns uint32, i, b uint64) {
		k := Key{ns, b}
		old, had := s.where[ns][i]
		if had && old == b {
			return // as fsm: a record rewritten in its bucket is not re-added
		}
		if had {
			s.count[Key{ns, old}]--
		}
		s.where[ns][i] = b
		s.count[k]++
		f.Add(k, hashStoreID(buf[:0], ns, i))
	}
	dropBucket := func(ns uint32, b uint64) {
		k := Key{ns, b}
		for i, bb := range s.where[ns] {
			if bb == b {
				delete(s.where[ns], i)
			}
		}
		delete(s.count, k)
		f.Drop(k)
	}
	var saveLoads, rebuilds, nsDrops, expiries int
	for op := 0; op < ops && failed.Load() == nil; op++ {
		ex.Lock()
		ns := uint32(1 + rng.IntN(nss))
		lo := s.lo[ns]
		switch x := rng.IntN(1000); {
		case x < 600: // a new ID, or one moved to another live bucket
			add(ns, uint64(rng.IntN(ids)), lo+uint64(rng.IntN(window)))
		case x < 650: // a burst into the newest bucket: chains grow
			b := lo + window - 1
			for range 1 + rng.IntN(200) {
				add(ns, uint64(rng.IntN(ids)), b)
			}
		case x < 850: // forget (later marks add it again)
			i := uint64(rng.IntN(ids))
			if b, ok := s.where[ns][i]; ok {
				s.count[Key{ns, b}]--
				delete(s.where[ns], i)
			}
		case x < 870: // the oldest bucket expires
			dropBucket(ns, lo)
			s.lo[ns] = lo + 1
			expiries++
		case x < 880: // a live bucket dropped; later adds recreate its chain
			dropBucket(ns, lo+uint64(rng.IntN(window)))
		case x < 883: // the namespace is deleted (its ID reused: storage is empty too)
			s.where[ns] = map[uint64]uint64{}
			for k := range s.count {
				if k.Namespace == ns {
					delete(s.count, k)
				}
			}
			f.DropNamespace(ns)
			nsDrops++
		case x < 887: // crash and rebuild: Reset, then every record back (AddIfLive)
			f.Reset()
			for ns, m := range s.where {
				for i, b := range m {
					k := Key{ns, b}
					f.AddIfLive(k, hashStoreID(buf[:0], ns, i), s.count[k], func(k Key) bool { _, ok := s.count[k]; return ok })
				}
			}
			f.SetReady(true)
			rebuilds++
		case x < 890: // clean restart: Save, Load (chains keep no log)
			var saved bytes.Buffer
			if err := f.Save(&saved, uint64(op)); err != nil {
				ex.Unlock()
				t.Fatal(err)
			}
			if _, err := f.Load(bytes.NewReader(saved.Bytes())); err != nil {
				ex.Unlock()
				t.Fatal(err)
			}
			saveLoads++
		default: // mark again an ID in its own bucket or another (re-mark / sliding)
			i := uint64(rng.IntN(ids))
			b := lo + uint64(rng.IntN(window))
			if old, ok := s.where[ns][i]; ok && rng.IntN(2) == 0 {
				b = max(old, b)
			}
			add(ns, i, b)
		}
		if op%64 == 0 {
			if msg := s.checkLogsLocked(f); msg != "" {
				fail("after op %d: %s", op, msg)
			}
		}
		ex.Unlock()
	}
	close(stop)
	wg.Wait()
	if p := failed.Load(); p != nil {
		t.Fatal(*p)
	}
	// A final sweep over every stored ID, compactions done.
	for ns, m := range s.where {
		for i, b := range m {
			if !f.MayContain(Key{ns, b}, hashStoreID(buf[:0], ns, i)) {
				t.Fatalf("false negative at the end: ns %d id %d bucket %d", ns, i, b)
			}
		}
	}
	if msg := s.checkLogsLocked(f); msg != "" {
		t.Fatal(msg)
	}
	t.Logf("compactions: %d finished (%d from logs), %d refused, %d aborted; %d from-log reads raced apply; %d probes, %d log checks; %d expiries, %d ns drops, %d rebuilds, %d save/loads; hash log bytes now %d",
		finished.Load(), fromLog.Load(), refused.Load(), aborted.Load(), midCompactionFromLogs.Load(), probes.Load(), logChecks.Load(), expiries, nsDrops, rebuilds, saveLoads, f.Stats().HashLogBytes)
	if logIDs >= 0 && fromLog.Load() == 0 {
		t.Fatal("no compaction ran from a hash log: the test does not test what it says")
	}
	if finished.Load() == 0 {
		t.Fatal("no compaction finished")
	}
}

// A view of a log whose first chunk is still growing by append (and
// reallocating), and of one that spans a full chunk and a new one, stays
// the prefix it was while appends go on concurrently (run with -race).
func TestHashLogViewStableWhileAppending(t *testing.T) {
	for _, start := range []int{0, 5, 16, logChunk - 3, logChunk, logChunk + 7} {
		var l hashLog
		for i := range start {
			l.add(uint64(i)+1, l.growth())
		}
		v := l.view()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range 3*logChunk + 11 {
				l.add(uint64(start+i)+1, l.growth())
			}
		}()
		n := 0
		for _, ch := range v.chunks {
			for _, h := range ch {
				n++
				if h != uint64(n) {
					t.Fatalf("start %d: view entry %d is %d", start, n, h)
				}
			}
		}
		<-done
		if n != start || v.n != start {
			t.Fatalf("start %d: view holds %d (n %d)", start, n, v.n)
		}
		m := 0
		for _, ch := range l.chunks {
			if len(ch) > logChunk {
				t.Fatalf("a chunk of %d hashes", len(ch))
			}
			for _, h := range ch {
				m++
				if h != uint64(m) {
					t.Fatalf("log entry %d is %d", m, h)
				}
			}
		}
		if m != l.n || m != start+3*logChunk+11 {
			t.Fatalf("log holds %d, n %d", m, l.n)
		}
	}
}

// The hash logs' memory is what HashLogBytes reports and what Config.LogIDs
// bounds: their chunks' capacity, not the count of hashes in them. (Counting
// hashes once understated it about 2×: a first chunk grown by append ends
// up to 25% larger than it holds, and the 65 537th hash of a chain
// allocates a whole new 512 KiB chunk.) Chains that logged just past a
// chunk boundary, until the bound stops one of them.
func TestHashLogMemoryMatchesItsAccounting(t *testing.T) {
	const perChain = logChunk + 1
	f := New(Config{ExpectedPerBucket: 1000, LogIDs: 4 * perChain})
	f.SetReady(true)
	var buf []byte
	for b := range uint64(4) {
		k := Key{Namespace: 1, Bucket: b}
		for i := range uint64(perChain) {
			f.Add(k, testID(buf[:0], k, i))
		}
		st := f.Stats()
		var held uint64
		logs := 0
		f.mu.RLock()
		for _, c := range f.chains {
			if c.log != nil {
				logs++
				for _, ch := range c.log.chunks {
					held += 8 * uint64(cap(ch))
				}
			}
		}
		f.mu.RUnlock()
		t.Logf("%d chains, %d logging: HashLogBytes %d, chunks hold %d, bound %d", b+1, logs, st.HashLogBytes, held, 8*f.cfg.LogIDs)
		if held != st.HashLogBytes {
			t.Fatalf("the hash logs hold %d bytes of chunks where HashLogBytes reports %d", held, st.HashLogBytes)
		}
		if held > 8*uint64(f.cfg.LogIDs) {
			t.Fatalf("the hash logs hold %d bytes, past the bound of %d", held, 8*f.cfg.LogIDs)
		}
	}
	// Two full chunks per chain: the bound fits two such chains.
	if st := f.Stats(); st.HashLogBytes != 2*2*8*logChunk {
		t.Fatalf("HashLogBytes %d, want two chains of two chunks (%d)", st.HashLogBytes, 2*2*8*logChunk)
	}
}
