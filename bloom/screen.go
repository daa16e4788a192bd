package bloom

import "runtime"

// Screen tells, for each probe in ps (of IDs of namespace nsID), whether
// some chain of the namespace may hold its ID: maybe[i] false means no
// bucket holds it (Invariant 4), as Candidates returning none would. It
// reports false and sets nothing while the filters are not ready.
//
// It serves a batch of lookups (a Check) under one read lock instead of one
// per ID, and first loads the word each probe's first position tests in
// every segment, so the cache misses of the batch overlap: a test's early
// exit depends on the word it loads, so a loop of tests waits for one miss
// after the other. The tests that follow then hit the cache.
func (f *Filters) Screen(nsID uint32, ps []Probe, maybe []bool) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.ready {
		return false
	}
	bcs := f.byNS[nsID]
	if len(bcs) == 0 {
		clear(maybe[:len(ps)])
		return true
	}
	for i := range ps {
		ps[i].prepare(f.maxK)
	}
	var sink uint64
	for _, bc := range bcs {
		for si := range bc.c.segs {
			sink ^= bc.c.segs[si].f.touch(ps)
		}
	}
	runtime.KeepAlive(sink) // the loads are the point
	for i := range ps {
		maybe[i] = false
		for j := len(bcs) - 1; j >= 0; j-- {
			if bcs[j].c.mayContain(&ps[i]) {
				maybe[i] = true
				break
			}
		}
	}
	return true
}

// touch loads, for each probe, the word of f its first position tests,
// and returns them XOR-ed. A short filter (one block of a few words) is
// skipped: it is a cache line or two that the first test brings in.
func (f *filter) touch(ps []Probe) uint64 {
	if len(f.words) < blockWords {
		return 0
	}
	var sink uint64
	for i := range ps {
		sink ^= f.words[f.block(ps[i].h)*blockWords+uint64(ps[i].pos[0]>>12)]
	}
	return sink
}

// ObserveNegatives counts n lookups the filters answered "definitely not"
// (Observe(false, false) n times).
func (f *Filters) ObserveNegatives(n int) {
	if n > 0 {
		f.neg.Add(uint64(n))
	}
}
