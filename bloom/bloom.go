// Package bloom keeps a node's in-memory Bloom filters over the message IDs
// it stores, one filter chain per (namespace, expiry bucket), so "definitely
// not seen" is answered without touching storage and an expired bucket's IDs
// leave memory together with the bucket.
//
// Filters come from github.com/bits-and-blooms/bloom/v3 (Bloom 1970;
// sizing per Kirsch & Mitzenmacher double hashing). A bucket that outgrows
// its expected size gets another, larger filter with a tighter rate, as in
// scalable Bloom filters (Almeida et al. 2007), so the bucket's compound
// false-positive rate stays below the configured one.
//
// A Filters value is safe for concurrent use.
package bloom

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

// Config sizes the filters.
type Config struct {
	// ExpectedPerBucket is the number of IDs one bucket's first filter is
	// sized for (default 100 000). Larger buckets chain more filters.
	ExpectedPerBucket uint
	// FPRate is the target false-positive rate per bucket, in (0, 0.5]
	// (default 0.01).
	FPRate float64
}

func (c Config) withDefaults() Config {
	if c.ExpectedPerBucket == 0 {
		c.ExpectedPerBucket = 100_000
	}
	if c.FPRate <= 0 || c.FPRate > 0.5 {
		c.FPRate = 0.01
	}
	return c
}

// Key identifies one bucket's filter chain.
type Key struct {
	Namespace uint32
	Bucket    uint64
}

// segment is one filter of a chain with the number of IDs added to it.
type segment struct {
	f     *bbloom.BloomFilter
	n     uint
	limit uint
}

type chain struct {
	segs []segment
}

// n is the number of IDs added to the chain.
func (c *chain) n() uint {
	var n uint
	for i := range c.segs {
		n += c.segs[i].n
	}
	return n
}

// mayContain tests every segment with locations computed once.
func (c *chain) mayContain(locs []uint64) bool {
	for i := range c.segs {
		f := c.segs[i].f
		if f.TestLocations(locs[:f.K()]) {
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

	mu     sync.RWMutex
	chains map[Key]*chain
	// byNS lists each namespace's chains by ascending bucket, so a lookup
	// walks a namespace's buckets without a map access per bucket.
	byNS  map[uint32][]bucketChain
	maxK  uint // largest K of any segment: how many locations a Probe needs
	ready bool

	maybe  atomic.Uint64 // lookups answered "maybe" where the ID was absent or present
	falseP atomic.Uint64 // "maybe" answers that storage then found absent
	neg    atomic.Uint64 // "definitely not" answers
}

// New returns an empty, not-ready set of filters (see SetReady).
func New(cfg Config) *Filters {
	return &Filters{cfg: cfg.withDefaults(), chains: make(map[Key]*chain), byNS: make(map[uint32][]bucketChain)}
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

// Probe is one ID's filter locations (bits-and-blooms Locations), hashed
// once and then tested against, or added to, any number of filters: a
// lookup probes every live bucket of a namespace, so hashing per filter
// would cost O(buckets) hashes per ID. The zero Probe is empty; Reset fills
// it. A Probe is not safe for concurrent use.
type Probe struct {
	data []byte
	locs []uint64
}

// Reset makes p the probe of data (from HashKey). p keeps a reference to
// data until the next Reset.
func (p *Probe) Reset(data []byte) {
	p.data = data
	p.locs = p.locs[:0]
}

// locations returns at least k locations, hashing on first use.
func (p *Probe) locations(k uint) []uint64 {
	if uint(len(p.locs)) < k {
		// Locations(data, k)[i] is the i-th location of every filter
		// with K >= i (before the modulo by its size), so one set
		// serves filters of any K up to k.
		p.locs = bbloom.Locations(p.data, max(k, 8))
	}
	return p.locs
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
	f.addLocked(k, p, 0)
	f.mu.Unlock()
}

// AddIfLive is Add for rebuilds: it only adds if live(k) holds under the
// lock, so a rebuild racing with bucket drops leaves no dead chains.
// sizeHint, when larger than ExpectedPerBucket, sizes the first filter of
// a chain created now (the rebuild knows each bucket's record count).
func (f *Filters) AddIfLive(k Key, data []byte, sizeHint uint, live func(Key) bool) {
	var p Probe
	p.Reset(data)
	f.mu.Lock()
	if live(k) {
		f.addLocked(k, &p, sizeHint)
	}
	f.mu.Unlock()
}

func (f *Filters) addLocked(k Key, p *Probe, sizeHint uint) {
	c := f.chains[k]
	if c == nil {
		c = &chain{}
		f.chains[k] = c
		f.indexLocked(k, c)
		if sizeHint == 0 {
			sizeHint = f.newestLocked(k.Namespace, k.Bucket)
		}
	}
	if len(c.segs) == 0 || c.segs[len(c.segs)-1].n >= c.segs[len(c.segs)-1].limit {
		i := len(c.segs)
		// Segment i holds twice segment i-1's IDs at rate FPRate/2^(i+1):
		// the rates sum to less than FPRate. Segment 0 holds
		// ExpectedPerBucket IDs, or as many as the hint (the newest other
		// bucket of the namespace; the bucket's count in a rebuild), so a
		// steady load gets one right-sized filter per bucket and a lookup
		// tests one filter per bucket, not one per doubling.
		var n uint
		if i == 0 {
			n = max(f.cfg.ExpectedPerBucket, min(sizeHint, 1<<32))
		} else {
			n = c.segs[i-1].limit * 2
		}
		p := f.cfg.FPRate / math.Pow(2, float64(i+1))
		bf := bbloom.NewWithEstimates(n, p)
		f.maxK = max(f.maxK, bf.K())
		c.segs = append(c.segs, segment{f: bf, limit: n})
	}
	s := &c.segs[len(c.segs)-1]
	m := uint64(s.f.Cap())
	bs := s.f.BitSet()
	for _, l := range p.locations(s.f.K())[:s.f.K()] {
		bs.Set(uint(l % m)) // as BloomFilter.Add does
	}
	s.n++
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
	for i := range c.segs {
		if c.segs[i].f.Test(data) {
			return true
		}
	}
	return false
}

// MayContainProbe is MayContain with a Probe.
func (f *Filters) MayContainProbe(k Key, p *Probe) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c := f.chains[k]
	if c == nil {
		return false
	}
	return c.mayContain(p.locations(f.maxK))
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
	locs := p.locations(f.maxK)
	for i := len(bcs) - 1; i >= 0; i-- {
		if bcs[i].c.mayContain(locs) {
			dst = append(dst, bcs[i].bucket)
		}
	}
	return dst, true
}

// Drop forgets the chain of k (its bucket expired or was deleted).
func (f *Filters) Drop(k Key) {
	f.mu.Lock()
	if _, ok := f.chains[k]; ok {
		delete(f.chains, k)
		bcs := slices.DeleteFunc(f.byNS[k.Namespace], func(e bucketChain) bool { return e.bucket == k.Bucket })
		if len(bcs) == 0 {
			delete(f.byNS, k.Namespace)
		} else {
			f.byNS[k.Namespace] = bcs
		}
	}
	f.mu.Unlock()
}

// DropNamespace forgets every chain of a namespace.
func (f *Filters) DropNamespace(nsID uint32) {
	f.mu.Lock()
	for _, e := range f.byNS[nsID] {
		delete(f.chains, Key{Namespace: nsID, Bucket: e.bucket})
	}
	delete(f.byNS, nsID)
	f.mu.Unlock()
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
	Filters     uint64
	MemoryBytes uint64
	IDs         uint64
	BitsPerID   float64
	FPRate      float64 // configured
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
			s.MemoryBytes += uint64(seg.f.Cap() / 8)
			s.IDs += uint64(seg.n)
		}
	}
	s.Ready = f.ready
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
