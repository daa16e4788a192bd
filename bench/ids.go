package bench

import (
	"crypto/rand"
	"encoding/binary"
	mrand "math/rand/v2"
)

// IDGen produces message IDs for one worker. It is not safe for concurrent
// use: give each worker its own (NewIDGen with the worker's index).
//
// Fresh IDs are unique within a run for id sizes of 8 bytes and more: their
// first 8 bytes are a bijective mix of (worker, sequence) keyed by the run
// seed, so two fresh IDs of one run never collide, and the remaining bytes are
// pseudo-random, so IDs of different runs collide only by chance (2^-64 per
// pair for 16-byte IDs). Shorter IDs are truncated mixes and may repeat.
type IDGen struct {
	size   int
	seed   uint64
	worker uint64
	seq    uint64
	rng    *mrand.Rand
	// recent holds fresh IDs handed out earlier, for duplicate picks.
	recent  [][]byte
	nrecent int
	next    int
	fresh   []int // scratch for Mixed
}

// RecentCap is how many earlier fresh IDs a generator remembers for Mixed.
const RecentCap = 4096

// workerBits bounds the worker index folded into the sequence space.
const workerBits = 20

// NewRunSeed returns a random seed for one benchmark run.
func NewRunSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return binary.LittleEndian.Uint64(b[:])
}

// NewIDGen returns the generator of one worker. size must be >= 1.
func NewIDGen(seed uint64, worker int, size int) *IDGen {
	if size < 1 {
		size = 1
	}
	return &IDGen{
		size:   size,
		seed:   seed,
		worker: uint64(worker) & (1<<workerBits - 1),
		rng:    mrand.New(mrand.NewPCG(seed, uint64(worker)+0x9e3779b97f4a7c15)),
	}
}

// mix64 is the splitmix64 finalizer: a bijection on uint64.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Fresh fills dst with a new ID, never handed out before in this run (for
// sizes >= 8), and returns it. dst is reused if it has capacity.
func (g *IDGen) Fresh(dst []byte) []byte {
	if cap(dst) < g.size {
		dst = make([]byte, g.size)
	}
	dst = dst[:g.size]
	// (worker, seq) -> unique 64-bit value; keyed so runs differ.
	v := g.seq<<workerBits | g.worker
	g.seq++
	h := mix64(v ^ g.seed) // XOR with a constant, then a bijection: unique per v
	var head [8]byte
	binary.BigEndian.PutUint64(head[:], h)
	n := copy(dst, head[:])
	for i := n; i < len(dst); i += 8 {
		r := g.rng.Uint64()
		for j := 0; j < 8 && i+j < len(dst); j++ {
			dst[i+j] = byte(r >> (8 * j))
		}
	}
	g.remember(dst)
	return dst
}

func (g *IDGen) remember(id []byte) {
	if g.recent == nil {
		g.recent = make([][]byte, RecentCap)
	}
	slot := g.recent[g.next]
	if cap(slot) < len(id) {
		slot = make([]byte, len(id))
	}
	slot = slot[:len(id)]
	copy(slot, id)
	g.recent[g.next] = slot
	g.next = (g.next + 1) % RecentCap
	if g.nrecent < RecentCap {
		g.nrecent++
	}
}

// Repeat fills dst with a copy of a fresh ID handed out earlier by this
// generator and reports whether there was one.
func (g *IDGen) Repeat(dst []byte) ([]byte, bool) {
	if g.nrecent == 0 {
		return dst, false
	}
	src := g.recent[g.rng.IntN(g.nrecent)]
	dst = append(dst[:0], src...)
	return dst, true
}

// Mixed fills batch with IDs of which about ratio are repeats of IDs this
// generator handed out in EARLIER batches (never one of the same batch), sets
// isDup[i] for the repeats (isDup may be nil), and returns how many repeats
// it chose. The batch's slices are reused.
func (g *IDGen) Mixed(batch [][]byte, isDup []bool, ratio float64) int {
	// Snapshot how many earlier IDs exist, so repeats come from earlier
	// batches only: the fresh IDs of this batch are remembered after.
	avail := g.nrecent
	dups := 0
	fresh := g.fresh[:0]
	for i := range batch {
		if isDup != nil {
			isDup[i] = false
		}
		if avail > 0 && g.rng.Float64() < ratio {
			// pick among the avail entries written before this batch
			idx := g.next - 1 - g.rng.IntN(avail)
			if idx < 0 {
				idx += RecentCap
			}
			batch[i] = append(batch[i][:0], g.recent[idx]...)
			if isDup != nil {
				isDup[i] = true
			}
			dups++
			continue
		}
		fresh = append(fresh, i)
	}
	for _, i := range fresh {
		batch[i] = g.Fresh(batch[i])
	}
	g.fresh = fresh
	return dups
}

// FreshBatch fills every slot of batch with a fresh ID.
func (g *IDGen) FreshBatch(batch [][]byte) {
	for i := range batch {
		batch[i] = g.Fresh(batch[i])
	}
}

// Intn returns a pseudo-random int in [0,n) from the worker's generator.
func (g *IDGen) Intn(n int) int { return g.rng.IntN(n) }

// Token returns 16 pseudo-random bytes (a request token).
func (g *IDGen) Token() []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, g.rng.Uint64())
	binary.LittleEndian.PutUint64(b[8:], g.rng.Uint64())
	return b
}
