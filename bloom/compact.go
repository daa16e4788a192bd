package bloom

import (
	"cmp"
	"fmt"
	"slices"
)

// Compaction rebuilds one bucket's chain into a single filter sized for the
// bucket's live IDs at firstShare of the rate budget (9.86 bits per ID at
// 1%): a chain of growing filters costs 15–25 bits per ID (each growth
// segment is tighter than the last, the newest is partly empty) and a
// first filter sized for more IDs than arrived wastes the difference.
// Scalable Bloom filters (Almeida et al. 2007) bound the rate of a growing
// chain but not its size; compaction restores the size of a filter built
// for the final count.
//
// Bits of one filter cannot be re-hashed into a smaller one, so the IDs
// come from the owner's storage (Add), not from the old chain; filters of
// equal size and k can be OR-ed, so IDs added to the bucket while the
// compaction runs go to a pending filter with the new one's size and k (as
// well as to the old chain, which keeps answering) and are OR-ed in by
// Finish. No ID can be lost in between: see BeginCompact.
//
// A Compaction is used by one goroutine.
type Compaction struct {
	f       *Filters
	k       Key
	c       *chain
	nf      *filter
	pending *filter
	limit   uint
	n       uint
	exact   bool
	probe   Probe
	// log is the chain's hash log as of BeginCompact, when the chain
	// keeps a complete one that is not too stale (see FromLog).
	log *logView
}

// idealBits is the size of a compacted filter for n IDs.
func (f *Filters) idealBits(n uint) uint64 {
	w, _ := f.first.shape(n)
	return uint64(w) * 64
}

// CompactionCandidates appends to dst, sorted, the chains worth compacting
// now, given live(k): the bucket's live ID count and whether the bucket
// still exists. A chain is a candidate when its bits exceed a compacted
// filter's for its live IDs by compactWaste (and compactMinBits) and
//   - it received no ID over the last quietCalls calls (at least 1: the
//     bucket stopped growing: its span is past now + TTL, or the load
//     stopped) and, if it was compacted so before, its ID count changed
//     by 10% since, or
//   - it grew 4× since it was last compacted (or since its first filter)
//     and keeps a hash log that covers it, so a bucket that keeps growing is compacted
//     O(log n) times, re-adding each logged hash 1/3 of a time in all
//     (and its IDs are read once more when it stops). A growing chain
//     without a log waits for its bucket to stop rather than re-read it
//     from storage under load.
//
// quietCalls is how long a lull must last before a still-growing bucket is
// compacted to its size so far: a compaction re-reads every record of the
// bucket, so compacting on every short pause in the load (one poll of fsm's
// 2 s) re-read a growing bucket each time it had grown another 10%; a
// lull must now last as long as the caller says (fsm: 30 s) — see
// DESIGN.md, "Compaction".
//
// Callers poll it (fsm: every few seconds); each call also records the
// chains' counts for the next call's "no ID since" test. Nothing while the
// filters are not ready.
func (f *Filters) CompactionCandidates(live func(Key) (n uint, ok bool), quietCalls int, dst []Key) []Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ready {
		return dst
	}
	start := len(dst)
	for k, c := range f.chains {
		n := c.n()
		if n == c.seenN {
			c.quietCalls++
		} else {
			c.quietCalls = 0
		}
		c.seenN, c.growing = n, c.quietCalls == 0
		quiet := c.quietCalls >= max(quietCalls, 1)
		if c.pending != nil {
			continue
		}
		if f.worthCompacting(k, c, n, quiet, live) {
			dst = append(dst, k)
		} else if quiet {
			// The bucket stopped growing and its chain is as small as it
			// will get: its hash log would hold memory for a growth
			// compaction unlikely to come (if one does, it reads storage).
			f.dropLogLocked(c)
		}
	}
	slices.SortFunc(dst[start:], func(a, b Key) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Bucket, b.Bucket))
	})
	return dst
}

// worthCompacting is CompactionCandidates' test for one chain of n IDs.
func (f *Filters) worthCompacting(k Key, c *chain, n uint, quiet bool, live func(Key) (uint, bool)) bool {
	if len(c.segs) == 0 {
		return false
	}
	l, ok := live(k)
	if !ok {
		return false
	}
	ideal, bits := f.idealBits(l), c.bits()
	if float64(bits) <= float64(ideal)*compactWaste || bits < ideal+compactMinBits {
		return false
	}
	base := c.compactedN
	changed := !c.exact || n >= base+base/10 || l*11 <= base*10
	if base == 0 {
		base = c.segs[0].limit
	}
	// A growth compaction reads the chain's hash log. A chain without a
	// usable one (past Config.LogIDs, loaded from a file, rebuilt, or
	// stale) would re-read its whole bucket from storage while the load
	// that grows it goes on: 8.2–8.4 s of a core on each of 3 nodes for a
	// bucket of 7.8M records, and fsm's lock, held while it adds the write
	// buffer's records, delayed applies by up to 130 ms. Such a chain grows
	// segments instead and is compacted once, when its bucket stops.
	return (quiet && changed) || (n >= 4*base && c.logCovers(l))
}

// logCovers reports whether c's hash log can rebuild it for live IDs: it
// has one, and no more than a tenth of the IDs it logged left the bucket
// (forgotten, released, moved), whose bits a rebuild from it would keep.
func (c *chain) logCovers(live uint) bool {
	return c.log != nil && uint(c.log.n)*10 <= live*11
}

// BeginCompact starts a compaction of k's chain for live IDs, or returns
// nil if there is nothing to compact (no chain, one already compacting,
// filters not ready).
//
// The caller must then call FromLog, or, when it reports false, pass to Add
// every ID its bucket held at the moment of this call, and call Finish (or
// Abort). IDs added to the bucket after
// this call (through Add/AddProbe/AddIfLive of f) need not be passed: they
// reach the new filter through the pending one. So the caller must call
// BeginCompact and capture its source (fsm: a Pebble snapshot) with every
// adder excluded (fsm: under fsm.mu, which apply holds exclusively while it
// adds IDs and commits them): an ID committed before the capture is in the
// source, one added after BeginCompact is in the pending filter. IDs that
// are both are harmless (set bits twice, count twice).
func (f *Filters) BeginCompact(k Key, live uint) *Compaction {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.chains[k]
	if !f.ready || c == nil || c.pending != nil {
		return nil
	}
	var log *logView
	if c.log != nil {
		if c.logCovers(live) {
			v := c.log.view()
			log = &v
			live = max(live, uint(v.n))
		} else {
			// More than a tenth of the logged IDs left the bucket (forgotten,
			// released, moved): rebuild from storage, and keep no log that
			// would only grow staler.
			f.dropLogLocked(c)
		}
	}
	limit := max(live, 1)
	if c.growing {
		// IDs keep arriving, also while the compaction runs: without
		// headroom the new filter would start over-full (rate above its
		// share). The next quiet poll compacts it exactly.
		limit += limit / 4
	}
	nf := newFilter(f.first.shape(limit))
	c.pending, c.pendingN = newFilter(len(nf.words), nf.k), 0
	return &Compaction{f: f, k: k, c: c, nf: nf, pending: c.pending, limit: limit, exact: !c.growing, log: log}
}

// HasLog reports whether FromLog will compact from the chain's hash log
// (fsm decides on it whether to capture a storage snapshot under its lock).
func (cp *Compaction) HasLog() bool { return cp.log != nil }

// FromLog adds to the new filter every ID the chain held at BeginCompact,
// from the hashes it logged, and reports true; or it reports false, adding
// nothing, when the chain keeps no such log (it was loaded from a file, its
// log passed Config.LogIDs, or too many of its IDs left the bucket): the
// caller then passes the bucket's records to Add. Logged IDs that left the
// bucket since stay in the filter (at most a tenth more bits set: false
// positives, never false negatives). Lock-free, like Add.
func (cp *Compaction) FromLog() bool {
	if cp.log == nil {
		return false
	}
	for _, c := range cp.log.chunks {
		for _, h := range c {
			cp.addHash(h)
		}
	}
	return true
}

// addHash adds an ID by its hash.
func (cp *Compaction) addHash(h uint64) {
	cp.probe.h, cp.probe.hashed, cp.probe.n = h, true, 0
	cp.probe.prepare(cp.nf.k)
	cp.nf.set(&cp.probe)
	cp.n++
}

// Add adds an ID (from HashKey) of the bucket to the new filter. It takes
// no lock: the new filter is private until Finish.
func (cp *Compaction) Add(data []byte) {
	cp.probe.Reset(data)
	cp.probe.prepare(cp.nf.k)
	cp.nf.set(&cp.probe)
	cp.n++
}

// Finish swaps the new filter in for the chain, with the IDs added since
// BeginCompact OR-ed in. It reports false, changing nothing, if the chain
// was dropped or replaced meanwhile (bucket expired, Reset, Load).
func (cp *Compaction) Finish() bool {
	f := cp.f
	f.mu.Lock()
	defer f.mu.Unlock()
	c := cp.c
	if f.chains[cp.k] != c || c.pending != cp.pending {
		return false
	}
	if err := cp.nf.merge(c.pending); err != nil {
		panic(fmt.Sprintf("bloom: pending filter differs from the compacted one: %v", err)) // same size and k by construction
	}
	n := cp.n + c.pendingN
	c.segs = []segment{{f: cp.nf, n: n, limit: cp.limit}}
	c.pending, c.pendingN = nil, 0
	c.sized, c.compactedN, c.seenN, c.exact = true, n, n, cp.exact
	f.recomputeMaxKLocked()
	return true
}

// Abort ends a compaction without changing the chain.
func (cp *Compaction) Abort() {
	f := cp.f
	f.mu.Lock()
	if cp.c.pending == cp.pending {
		cp.c.pending, cp.c.pendingN = nil, 0
	}
	f.mu.Unlock()
}
