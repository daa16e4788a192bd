// Package bloom keeps a node's in-memory Bloom filters over the message IDs
// it stores, one filter chain per (namespace, expiry bucket), so "definitely
// not seen" is answered without touching storage and an expired bucket's IDs
// leave memory together with the bucket.
//
// The filters are blocked Bloom filters of our own (Putze, Sanders &
// Singler 2007; see filter in blocked.go for the persisted bit layout): one
// 64-bit xxhash per ID picks a 1024-bit block in each filter and k bits in
// it, so a test or add touches two adjacent cache lines instead of k
// scattered ones, and the k positions are computed once per ID for every
// bucket it is tested against. A bucket that outgrows its first filter
// gets another one with a tighter rate, as in scalable Bloom filters
// (Almeida et al. 2007), so the bucket's compound false-positive rate stays
// below the configured one. Such a chain costs 20–25 bits per ID where one
// right-sized filter costs 9.86, so the owner compacts it (BeginCompact)
// into one filter sized for the bucket's live IDs, rebuilt from the hashes
// the chain logged (FromLog) each time it has grown 4×, and from the log
// or else from storage once the bucket stops growing.
//
// A Filters value is safe for concurrent use.
package bloom

import (
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
)

// Config sizes the filters.
type Config struct {
	// ExpectedPerBucket is the number of IDs the first filter of a bucket
	// is sized for when nothing better is known: the namespace has no other
	// bucket to size it like (default 100 000). Buckets that outgrow it
	// chain more filters until compacted; smaller ones are shrunk by
	// compaction.
	ExpectedPerBucket uint
	// FPRate is the target false-positive rate per bucket, in (0, 0.5]
	// (default 0.01).
	FPRate float64
	// LogIDs bounds how many ID hashes the filters keep, over all chains,
	// so that a growing chain is compacted from memory rather than from a
	// scan of storage (8-byte slots, counted as allocated; default
	// 4 194 304, 32 MiB; negative: none). Chains created by a rebuild
	// (AddIfLive) keep none: they are sized from their bucket's count. A
	// chain that would pass the bound stops logging, grows segments while
	// its bucket grows, and is compacted from storage once the bucket
	// stops. A chain's log is freed once its bucket stopped
	// growing (CompactionCandidates' quietCalls) and the chain needs no
	// compaction, when it goes stale (BeginCompact), and with the chain.
	LogIDs int
}

func (c Config) withDefaults() Config {
	if c.ExpectedPerBucket == 0 {
		c.ExpectedPerBucket = 100_000
	}
	if c.FPRate <= 0 || c.FPRate > 0.5 {
		c.FPRate = 0.01
	}
	if c.LogIDs == 0 {
		c.LogIDs = DefaultLogIDs
	}
	return c
}

// Sizing of chains. A chain's false-positive budget is FPRate: a lookup of
// an absent ID answers "maybe" if any segment does, so the chain's rate is
// at most the sum of its segments' rates (Almeida et al. 2007, "Scalable
// Bloom Filters", Inf. Process. Lett. 101(6), §3: P ≤ Σ P0·r^i).
const (
	// firstShare of the budget goes to a chain's first filter when its
	// size is known and to a compacted filter: at 0.95% a right-sized
	// blocked filter costs 9.86 bits per ID (k = 7; a standard one 9.69),
	// under the 10 bits per live ID target, and the remaining 0.05% pays
	// for growth segments should a bucket grow after all.
	firstShare = 0.95
	// blindShare is the first filter's share when its size is a guess
	// (ExpectedPerBucket): growth is likely, so the budget is split as in
	// Almeida et al. with r = 1/2 (P/2, P/4, ...), which costs less over
	// a chain of doublings than 0.9P followed by tight segments.
	blindShare = 0.5
	// Each further segment gets half the budget left after the segments
	// before it (their estimated rates at their actual fill), i.e. the
	// tightening ratio r = 1/2 of Almeida et al., made robust to segments
	// filled past their design size.
	tighten = 0.5
	// minSegment is the smallest growth segment, in IDs.
	minSegment = 64
	// minFirst bounds from below the first filter of a chain sized like
	// the namespace's newest bucket, so a hint of a handful of IDs does not
	// start a chain of dozens of doublings.
	minFirst = 1024
	// A chain is worth compacting when its bits exceed those of a
	// compacted filter for its live IDs by compactWaste (and by at least
	// compactMinBits, so tiny chains are not rebuilt to save a few words).
	compactWaste   = 1.1
	compactMinBits = 1024
)

// DefaultLogIDs is Config.LogIDs's default: 32 MiB of hashes, a surge of
// four million IDs into new buckets.
const DefaultLogIDs = 1 << 22

// Key identifies one bucket's filter chain.
type Key struct {
	Namespace uint32
	Bucket    uint64
}

// segment is one filter of a chain with the number of IDs added to it.
type segment struct {
	f     *filter
	n     uint
	limit uint
}

type chain struct {
	segs []segment
	// sized says the first segment was sized from knowledge (the
	// namespace's newest bucket, a rebuild's record count, a compaction),
	// so the first growth segment is small (see growLocked).
	sized bool
	// pending receives the IDs added while a compaction of this chain
	// runs; it has the new filter's m and k, so it is OR-ed into it.
	pending  *filter
	pendingN uint
	// compactedN is the number of IDs at the last compaction (0: never);
	// seenN the count at the last CompactionCandidates call and quietCalls
	// how many calls in a row saw no ID arrive, to tell chains that
	// stopped growing.
	compactedN uint
	seenN      uint
	quietCalls int
	// growing: the last CompactionCandidates call saw IDs arrive, so a
	// compaction now gets headroom; exact: the last compaction had none.
	growing, exact bool
	// log holds the hash of every ID added since the chain was created
	// (nil: not kept, or no longer complete), so a compaction need not
	// read storage; see hashLog.
	log *hashLog
}

// n is the number of IDs added to the chain.
func (c *chain) n() uint {
	var n uint
	for i := range c.segs {
		n += c.segs[i].n
	}
	return n
}

// bits is the chain's filter memory in bits.
func (c *chain) bits() uint64 {
	var b uint64
	for i := range c.segs {
		b += c.segs[i].f.bits()
	}
	return b
}

// mayContain tests every segment with p, prepared for the filters' maxK.
func (c *chain) mayContain(p *Probe) bool {
	for i := range c.segs {
		if c.segs[i].f.has(p) {
			return true
		}
	}
	return false
}

// bucketChain is one entry of a namespace's chain index.
type bucketChain struct {
	bucket uint64
	c      *chain
}

// Filters is the set of filter chains of one node.
type Filters struct {
	cfg Config
	// first and blind size a chain's first filter (and a compaction's)
	// at firstShare and blindShare of the budget: computing a sizing
	// takes about a millisecond, and CompactionCandidates needs first's
	// for every chain on every poll.
	first, blind sizing

	mu     sync.RWMutex
	chains map[Key]*chain
	// byNS lists each namespace's chains by ascending bucket, so a lookup
	// walks a namespace's buckets without a map access per bucket.
	byNS map[uint32][]bucketChain
	// maxK is the largest K of any segment: how many locations a Probe
	// needs. Recomputed when segments go away (compaction, drops), so one
	// long-gone tight segment does not make every probe compute more.
	maxK  int
	ready bool
	// logged counts the slots (capacity, in hashes) of every chain's log,
	// bounded by cfg.LogIDs.
	logged int

	maybe  atomic.Uint64 // lookups answered "maybe" where the ID was absent or present
	falseP atomic.Uint64 // "maybe" answers that storage then found absent
	neg    atomic.Uint64 // "definitely not" answers
}

// New returns an empty, not-ready set of filters (see SetReady).
func New(cfg Config) *Filters {
	cfg = cfg.withDefaults()
	return &Filters{
		cfg:    cfg,
		first:  sizingFor(cfg.FPRate * firstShare),
		blind:  sizingFor(cfg.FPRate * blindShare),
		chains: make(map[Key]*chain),
		byNS:   make(map[uint32][]bucketChain),
	}
}

// Config returns the effective configuration.
func (f *Filters) Config() Config { return f.cfg }

// Reset drops every filter and marks the set not ready: lookups must go to
// storage until SetReady(true) after a rebuild.
func (f *Filters) Reset() {
	f.mu.Lock()
	f.chains = make(map[Key]*chain)
	f.byNS = make(map[uint32][]bucketChain)
	f.ready = false
	f.maxK = 0
	f.logged = 0
	f.mu.Unlock()
}

// SetReady says whether the filters cover every stored ID.
func (f *Filters) SetReady(ready bool) {
	f.mu.Lock()
	f.ready = ready
	f.mu.Unlock()
}

// Ready reports whether MayContain answers may be trusted for "definitely not".
func (f *Filters) Ready() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ready
}

// HashKey appends the bytes hashed for an ID: the namespace ID then the ID.
func HashKey(dst []byte, nsID uint32, id []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, nsID)
	return append(dst, id...)
}

// Add records data (from HashKey) in the chain of k, creating it if needed.
func (f *Filters) Add(k Key, data []byte) {
	var p Probe
	p.Reset(data)
	f.AddProbe(k, &p)
}

// AddProbe is Add with a Probe.
func (f *Filters) AddProbe(k Key, p *Probe) {
	f.mu.Lock()
	f.addLocked(k, p, 0, true)
	f.mu.Unlock()
}

// AddIfLive is Add for rebuilds: it only adds if live(k) holds under the
// lock, so a rebuild racing with bucket drops leaves no dead chains.
// sizeHint, when not 0, sizes the first filter of a chain created now (the
// rebuild knows each bucket's record count), so a rebuilt bucket gets one
// right-sized filter.
func (f *Filters) AddIfLive(k Key, data []byte, sizeHint uint, live func(Key) bool) {
	var p Probe
	p.Reset(data)
	f.mu.Lock()
	if live(k) {
		// No log: a rebuild creates every bucket's chain at once, sized
		// from its count, and their logs would take the bound from the
		// buckets that grow after it.
		f.addLocked(k, &p, sizeHint, false)
	}
	f.mu.Unlock()
}

func (f *Filters) addLocked(k Key, p *Probe, sizeHint uint, logNew bool) {
	c := f.chains[k]
	if c == nil {
		c = &chain{}
		if logNew && f.cfg.LogIDs > 0 {
			c.log = &hashLog{}
		}
		f.chains[k] = c
		if sizeHint == 0 {
			// Under a steady load each bucket receives about what the
			// namespace's newest one did.
			if h := f.newestLocked(k.Namespace, k.Bucket); h > 0 {
				sizeHint = max(h, min(minFirst, f.cfg.ExpectedPerBucket))
			}
		}
		f.indexLocked(k, c)
	}
	if len(c.segs) == 0 || c.segs[len(c.segs)-1].n >= c.segs[len(c.segs)-1].limit {
		f.growLocked(c, sizeHint)
	}
	s := &c.segs[len(c.segs)-1]
	p.prepare(s.f.k)
	s.f.set(p)
	s.n++
	if c.log != nil {
		if g := c.log.growth(); f.logged+g <= f.cfg.LogIDs {
			c.log.add(p.h, g)
			f.logged += g
		} else {
			f.dropLogLocked(c)
		}
	}
	if c.pending != nil {
		p.prepare(c.pending.k)
		c.pending.set(p)
		c.pendingN++
	}
}

// growLocked appends a segment to c. The first holds sizeHint IDs at
// firstShare of the budget, or ExpectedPerBucket at blindShare; each
// further one gets half the budget the others left (tighten) and twice
// the previous one's size (Almeida et al.'s growth factor s = 2), except
// that a sized chain's first growth segment is a quarter of its first
// filter (a well-sized bucket overflows by little). Tried: 1/16 then 4×
// (s = 4); fewer segments in a surge, but up to 4× overshoot at tight
// rates (63 bits per ID before compaction for 32 buckets filled
// round-robin, against 25).
func (f *Filters) growLocked(c *chain, sizeHint uint) {
	P := f.cfg.FPRate
	var n uint
	var sz sizing
	if len(c.segs) == 0 {
		n, sz = f.cfg.ExpectedPerBucket, f.blind
		if sizeHint > 0 {
			n, sz, c.sized = min(sizeHint, 1<<32), f.first, true
		}
	} else {
		used := 0.0
		for i := range c.segs {
			used += estRate(c.segs[i].f, c.segs[i].n)
		}
		last := max(c.segs[len(c.segs)-1].limit, c.segs[len(c.segs)-1].n)
		if c.sized && len(c.segs) == 1 {
			n = last / 4
		} else {
			n = last * 2
		}
		n = max(n, minSegment)
		sz = sizingFor(max((P-used)*tighten, P/(1<<20)))
	}
	bf := newFilter(sz.shape(n))
	f.maxK = max(f.maxK, bf.k)
	c.segs = append(c.segs, segment{f: bf, limit: n})
}

// dropLogLocked frees c's log: the chain is compacted from storage from
// now on, and only once its bucket stops growing.
func (f *Filters) dropLogLocked(c *chain) {
	if c.log != nil {
		f.logged -= c.log.slots
		c.log = nil
	}
}

// indexLocked inserts a new chain into its namespace's index.
func (f *Filters) indexLocked(k Key, c *chain) {
	bcs := f.byNS[k.Namespace]
	i, _ := slices.BinarySearchFunc(bcs, k.Bucket, func(e bucketChain, b uint64) int {
		switch {
		case e.bucket < b:
			return -1
		case e.bucket > b:
			return 1
		}
		return 0
	})
	f.byNS[k.Namespace] = slices.Insert(bcs, i, bucketChain{k.Bucket, c})
}

// newestLocked returns how many IDs the newest chain of nsID other than
// bucket holds (0 if none).
func (f *Filters) newestLocked(nsID uint32, bucket uint64) uint {
	bcs := f.byNS[nsID]
	for i := len(bcs) - 1; i >= 0; i-- {
		if bcs[i].bucket != bucket {
			return bcs[i].c.n()
		}
	}
	return 0
}

// MayContain reports whether data may be in the chain of k. false means
// definitely not (when Ready). A missing chain answers false.
func (f *Filters) MayContain(k Key, data []byte) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c := f.chains[k]
	if c == nil {
		return false
	}
	var p Probe
	p.Reset(data)
	p.prepare(f.maxK)
	return c.mayContain(&p)
}

// MayContainProbe is MayContain with a Probe.
func (f *Filters) MayContainProbe(k Key, p *Probe) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c := f.chains[k]
	if c == nil {
		return false
	}
	p.prepare(f.maxK)
	return c.mayContain(p)
}

// Candidates appends to dst, newest first, every bucket of namespace nsID
// whose chain may contain the probed ID, and reports whether the filters
// are ready. When not ready the answer must not be trusted (dst is returned
// unchanged): callers probe every live bucket instead. One lock and one
// hash per call, whatever the number of buckets.
func (f *Filters) Candidates(nsID uint32, p *Probe, dst []uint64) ([]uint64, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.ready {
		return dst, false
	}
	bcs := f.byNS[nsID]
	if len(bcs) == 0 {
		return dst, true
	}
	p.prepare(f.maxK)
	for i := len(bcs) - 1; i >= 0; i-- {
		if bcs[i].c.mayContain(p) {
			dst = append(dst, bcs[i].bucket)
		}
	}
	return dst, true
}

// Drop forgets the chain of k (its bucket expired or was deleted).
func (f *Filters) Drop(k Key) {
	f.mu.Lock()
	if c, ok := f.chains[k]; ok {
		f.dropLogLocked(c)
		delete(f.chains, k)
		bcs := slices.DeleteFunc(f.byNS[k.Namespace], func(e bucketChain) bool { return e.bucket == k.Bucket })
		if len(bcs) == 0 {
			delete(f.byNS, k.Namespace)
		} else {
			f.byNS[k.Namespace] = bcs
		}
		f.recomputeMaxKLocked()
	}
	f.mu.Unlock()
}

// DropNamespace forgets every chain of a namespace.
func (f *Filters) DropNamespace(nsID uint32) {
	f.mu.Lock()
	for _, e := range f.byNS[nsID] {
		f.dropLogLocked(e.c)
		delete(f.chains, Key{Namespace: nsID, Bucket: e.bucket})
	}
	delete(f.byNS, nsID)
	f.recomputeMaxKLocked()
	f.mu.Unlock()
}

// recomputeMaxKLocked sets maxK from the segments that remain: O(chains),
// run when segments go away (a drop, a compaction), not per ID.
func (f *Filters) recomputeMaxKLocked() {
	var k int
	for _, c := range f.chains {
		for i := range c.segs {
			k = max(k, c.segs[i].f.k)
		}
	}
	f.maxK = k
}

// Observe records the outcome of a lookup for the observed false-positive
// rate: maybe is what the filters said, found is what storage said.
func (f *Filters) Observe(maybe, found bool) {
	switch {
	case !maybe:
		f.neg.Add(1)
	case !found:
		f.maybe.Add(1)
		f.falseP.Add(1)
	default:
		f.maybe.Add(1)
	}
}

// Stats describes the filters' memory and accuracy.
type Stats struct {
	Filters uint64
	// MemoryBytes is the filters' bit arrays, including
	// those of compactions in progress.
	MemoryBytes uint64
	// HashLogBytes is the memory of the chains' hash logs: 8 bytes per
	// slot allocated (a little more than one per logged ID), at most
	// Config.LogIDs slots.
	HashLogBytes uint64
	// IDs counts the IDs added to the chains: a compacted chain counts the
	// live IDs it was rebuilt from, so after compaction this is the live
	// count (IDs moved or deleted since still count until the next one).
	IDs       uint64
	BitsPerID float64
	FPRate    float64 // configured
	// ObservedFPRate is false positives / (false positives + true
	// negatives): among lookups of absent IDs, the share the filters
	// answered "maybe".
	ObservedFPRate float64
	MaybeLookups   uint64
	FalsePositives uint64
	Ready          bool
}

// Stats returns current figures.
func (f *Filters) Stats() Stats {
	f.mu.RLock()
	var s Stats
	for _, c := range f.chains {
		for _, seg := range c.segs {
			s.Filters++
			s.IDs += uint64(seg.n)
		}
		s.MemoryBytes += c.bits() / 8
		if c.pending != nil {
			s.MemoryBytes += c.pending.bits() / 8
		}
	}
	s.Ready = f.ready
	s.HashLogBytes = 8 * uint64(f.logged)
	f.mu.RUnlock()
	if s.IDs > 0 {
		s.BitsPerID = float64(s.MemoryBytes*8) / float64(s.IDs)
	}
	s.FPRate = f.cfg.FPRate
	s.MaybeLookups = f.maybe.Load()
	s.FalsePositives = f.falseP.Load()
	if denom := s.FalsePositives + f.neg.Load(); denom > 0 {
		s.ObservedFPRate = float64(s.FalsePositives) / float64(denom)
	}
	return s
}
