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

// Filters is the set of filter chains of one node.
type Filters struct {
	cfg Config

	mu     sync.RWMutex
	chains map[Key]*chain
	ready  bool

	maybe  atomic.Uint64 // lookups answered "maybe" where the ID was absent or present
	falseP atomic.Uint64 // "maybe" answers that storage then found absent
	neg    atomic.Uint64 // "definitely not" answers
}

// New returns an empty, not-ready set of filters (see SetReady).
func New(cfg Config) *Filters {
	return &Filters{cfg: cfg.withDefaults(), chains: make(map[Key]*chain)}
}

// Config returns the effective configuration.
func (f *Filters) Config() Config { return f.cfg }

// Reset drops every filter and marks the set not ready: lookups must go to
// storage until SetReady(true) after a rebuild.
func (f *Filters) Reset() {
	f.mu.Lock()
	f.chains = make(map[Key]*chain)
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

// Add records data (from HashKey) in the chain of k, creating it if needed.
func (f *Filters) Add(k Key, data []byte) {
	f.mu.Lock()
	f.addLocked(k, data)
	f.mu.Unlock()
}

// AddIfLive is Add for rebuilds: it only adds if live(k) holds under the
// lock, so a rebuild racing with bucket drops leaves no dead chains.
func (f *Filters) AddIfLive(k Key, data []byte, live func(Key) bool) {
	f.mu.Lock()
	if live(k) {
		f.addLocked(k, data)
	}
	f.mu.Unlock()
}

func (f *Filters) addLocked(k Key, data []byte) {
	c := f.chains[k]
	if c == nil {
		c = &chain{}
		f.chains[k] = c
	}
	if len(c.segs) == 0 || c.segs[len(c.segs)-1].n >= c.segs[len(c.segs)-1].limit {
		i := len(c.segs)
		// Segment i holds ExpectedPerBucket * 2^i IDs at rate FPRate/2^(i+1):
		// the rates sum to less than FPRate.
		n := f.cfg.ExpectedPerBucket << min(i, 20)
		p := f.cfg.FPRate / math.Pow(2, float64(i+1))
		c.segs = append(c.segs, segment{f: bbloom.NewWithEstimates(n, p), limit: n})
	}
	s := &c.segs[len(c.segs)-1]
	s.f.Add(data)
	s.n++
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

// Drop forgets the chain of k (its bucket expired or was deleted).
func (f *Filters) Drop(k Key) {
	f.mu.Lock()
	delete(f.chains, k)
	f.mu.Unlock()
}

// DropNamespace forgets every chain of a namespace.
func (f *Filters) DropNamespace(nsID uint32) {
	f.mu.Lock()
	for k := range f.chains {
		if k.Namespace == nsID {
			delete(f.chains, k)
		}
	}
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
