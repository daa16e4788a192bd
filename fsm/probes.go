package fsm

import "github.com/dedupnode/dedupnode/bloom"

// batchProbes holds the hashed keys and Bloom probes of a Check's IDs
// (pooled in FSM.checkScratch), hashed once for the filters' screen and
// the lookups that follow.
type batchProbes struct {
	keys   []byte // HashKey of every ID, one after the other
	ends   []int  // keys[ends[i-1]:ends[i]] is ID i's
	probes []bloom.Probe
	maybe  []bool
}

// reset prepares cs for the IDs ids of namespace nsID.
func (cs *batchProbes) reset(nsID uint32, ids [][]byte) {
	n := len(ids)
	cs.keys, cs.ends = cs.keys[:0], cs.ends[:0]
	if cap(cs.probes) < n {
		cs.probes, cs.maybe = make([]bloom.Probe, n), make([]bool, n)
	}
	cs.probes, cs.maybe = cs.probes[:n], cs.maybe[:n]
	for _, id := range ids {
		cs.keys = bloom.HashKey(cs.keys, nsID, id)
		cs.ends = append(cs.ends, len(cs.keys))
	}
	// Only now that keys no longer grows (and moves) do the probes point
	// into it.
	for i := range cs.probes {
		cs.probes[i].Reset(cs.hkey(i))
	}
}

// hkey is ID i's hashed key.
func (cs *batchProbes) hkey(i int) []byte {
	start := 0
	if i > 0 {
		start = cs.ends[i-1]
	}
	return cs.keys[start:cs.ends[i]:cs.ends[i]]
}
