package bloom

import (
	"fmt"
	"math"
	"math/bits"
	"reflect"

	"github.com/cespare/xxhash/v2"
)

// A filter is a blocked Bloom filter (Putze, Sanders & Singler 2007,
// "Cache-, Hash- and Space-Efficient Bloom Filters", §3): the hash of an
// ID picks one 1024-bit block and the ID's k bits are all set in, and
// tested in, that block. A test or add touches one block (two adjacent
// 64-byte cache lines, which x86's adjacent-line prefetcher fetches
// together) where a standard filter touches k scattered lines: the bit
// tests were cache misses, 7 per filter per ID, and most of the filters'
// CPU.
//
// The price is memory: blocks receive a Poisson-distributed number of IDs
// and the overfull ones answer "maybe" more often, so a blocked filter
// needs more bits for a rate than a standard one (0.95% needs 9.86 bits
// per ID at 1024-bit blocks against 9.69; at 512-bit blocks over 10, above
// the 10 bits per live ID target). Sizing uses the blocked formula
// (blockedFP), not the standard one.
//
// Bit layout (persisted by Save; changing it needs a new file magic):
//
//   - h = xxhash64(HashKey(nsID, id)) (github.com/cespare/xxhash/v2, seed 0).
//   - Block of an ID in a filter of B blocks: ((h>>32) · B) >> 32 when
//     B ≤ 2³² (Lemire's fastrange on the high half of h); the high 64 bits
//     of the 128-bit product h · B above that. Block b is words
//     [16b, 16b+16) of the filter.
//   - The ID's positions come from a SplitMix64 stream seeded by h: word j
//     (j = 0, 1, ...) is mix(h + (j+1)·0x9E3779B97F4A7C15) with Steele et
//     al.'s finalizer (mix64 below), and position i is the 16-bit chunk
//     i mod 4 of word i/4, low chunk first. Position q sets bit
//     (q · blockBits) >> 16 of the block, i.e. q >> 6 for a 1024-bit block:
//     bit j of a block is bit j mod 64 (least significant first) of its
//     word j / 64. Positions may repeat, as the sizing formula assumes.
//   - A filter smaller than one block (a bucket of a few dozen IDs) is one
//     short block of w < 16 words (blockBits = 64w) so a 10-ID bucket
//     costs 16 bytes, not 128.
//
// Positions do not depend on the filter except through the block index,
// so a Probe computes them once for every filter it is tested against
// (Candidates tests ~30 buckets' chains). Positions come from a stream
// rather than double hashing (a + i·b mod 1024): double hashing gives
// at most 2¹⁹ position patterns per block, so an absent ID matches the
// pattern of one of the block's ~100 IDs with probability ~2·10⁻⁴, a
// floor 2% of the compacted target and above the target of a chain's
// later growth segments (P/64 ≈ 1.6·10⁻⁴).
type filter struct {
	words   []uint64 // nblocks blocks of blockWords, or one short block
	nblocks uint64
	k       int
}

const (
	blockWords = 16
	blockBits  = blockWords * 64
	// maxK bounds the positions per ID (a Probe computes up to maxK);
	// growth segments at P/2²⁰ need about 30.
	maxK = 48
	// golden is SplitMix64's increment, 2⁶⁴/φ.
	golden = 0x9E3779B97F4A7C15
)

// mix64 is SplitMix64's output function (Steele, Lea & Flood 2014, with
// Stafford's "Mix13" constants).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Probe is one ID's hash and in-block positions, computed once and then
// tested against, or added to, any number of filters: a lookup probes
// every live bucket of a namespace, so hashing per filter would cost
// O(buckets) hashes per ID. The zero Probe is empty; Reset fills it. A
// Probe is not safe for concurrent use.
type Probe struct {
	data   []byte
	h      uint64
	hashed bool
	n      int // positions computed
	pos    [maxK]uint16
}

// Reset makes p the probe of data (from HashKey). p keeps a reference to
// data until the next Reset; it is hashed on first use.
func (p *Probe) Reset(data []byte) {
	p.data = data
	p.hashed = false
	p.n = 0
}

// prepare hashes p if needed and computes at least k positions.
func (p *Probe) prepare(k int) {
	if !p.hashed {
		p.h = xxhash.Sum64(p.data)
		p.hashed = true
		p.n = 0
	}
	for p.n < k {
		z := mix64(p.h + uint64(p.n/4+1)*golden)
		p.pos[p.n] = uint16(z)
		p.pos[p.n+1] = uint16(z >> 16)
		p.pos[p.n+2] = uint16(z >> 32)
		p.pos[p.n+3] = uint16(z >> 48)
		p.n += 4
	}
}

// newFilter returns an empty filter of nwords words (nwords < blockWords:
// one short block; else a multiple of blockWords) with k positions per ID.
func newFilter(nwords int, k int) *filter {
	nb := uint64(1)
	if nwords > blockWords {
		nb = uint64(nwords / blockWords)
	}
	return &filter{words: allocWords(nwords), nblocks: nb, k: k}
}

// allocWords allocates n words whose first is 128-byte aligned when n
// spans at least one block, so that every block is two whole cache lines
// (one adjacent-line pair). Go's allocator already places pointer-free
// objects of multiples of 128 bytes at such addresses (size classes and
// pages); the retry with one block of slack only guards against that
// changing. reflect reads the address without package unsafe.
func allocWords(n int) []uint64 {
	w := make([]uint64, n)
	if n < blockWords || reflect.ValueOf(&w[0]).Pointer()%(blockWords*8) == 0 {
		return w
	}
	w = make([]uint64, n+blockWords)
	off := int((blockWords*8 - reflect.ValueOf(&w[0]).Pointer()%(blockWords*8)) / 8)
	return w[off : off+n : off+n]
}

// bits is the filter's size in bits.
func (f *filter) bits() uint64 { return uint64(len(f.words)) * 64 }

// block returns the index of h's block.
func (f *filter) block(h uint64) uint64 {
	if f.nblocks <= 1<<32 {
		return ((h >> 32) * f.nblocks) >> 32
	}
	hi, _ := bits.Mul64(h, f.nblocks)
	return hi
}

// has reports whether every bit of p is set. p must be prepared for f.k.
func (f *filter) has(p *Probe) bool {
	if len(f.words) < blockWords {
		return f.hasShort(p)
	}
	blk := (*[blockWords]uint64)(f.words[f.block(p.h)*blockWords:])
	for _, q := range p.pos[:f.k] {
		b := q >> 6
		if blk[b>>6]&(1<<(b&63)) == 0 {
			return false
		}
	}
	return true
}

func (f *filter) hasShort(p *Probe) bool {
	mb := uint32(len(f.words)) * 64
	for _, q := range p.pos[:f.k] {
		b := uint32(q) * mb >> 16
		if f.words[b>>6]&(1<<(b&63)) == 0 {
			return false
		}
	}
	return true
}

// set sets p's bits. p must be prepared for f.k.
func (f *filter) set(p *Probe) {
	if len(f.words) < blockWords {
		mb := uint32(len(f.words)) * 64
		for _, q := range p.pos[:f.k] {
			b := uint32(q) * mb >> 16
			f.words[b>>6] |= 1 << (b & 63)
		}
		return
	}
	blk := (*[blockWords]uint64)(f.words[f.block(p.h)*blockWords:])
	for _, q := range p.pos[:f.k] {
		b := q >> 6
		blk[b>>6] |= 1 << (b & 63)
	}
}

// merge ORs g into f: the filter of both sets. Both must have the same
// geometry (words and k).
func (f *filter) merge(g *filter) error {
	if len(f.words) != len(g.words) || f.k != g.k {
		return fmt.Errorf("bloom: merge of %d words k=%d into %d words k=%d", len(g.words), g.k, len(f.words), f.k)
	}
	for i, w := range g.words {
		f.words[i] |= w
	}
	return nil
}

// Sizing.

// sizing is the shape of a blocked filter meeting a false-positive rate:
// k positions per ID, and at most lambda IDs per block on average (1024 /
// lambda bits per ID).
type sizing struct {
	p      float64
	lambda float64
	k      int
}

// blockedFP is the expected false-positive rate of a filter of 1024-bit
// blocks holding lambda IDs per block on average with k positions per ID
// (Putze et al. 2007, §3): the IDs of a block are Poisson(λ)-distributed
// (conservative: with n IDs over B blocks they are Binomial(n, 1/B)), and a
// block holding i IDs answers "maybe" for an absent one with the standard
// filter's probability (1 − (1 − 1/1024)^(k·i))^k:
//
//	fp = Σᵢ Pois(i; λ) · (1 − (1 − 1/1024)^(k·i))^k
func blockedFP(lambda float64, k int) float64 {
	if lambda <= 0 {
		return 0
	}
	q := math.Pow(1-1.0/blockBits, float64(k)) // a bit stays 0 after one ID
	mode := math.Floor(lambda)
	lg, _ := math.Lgamma(mode + 1)
	pm := math.Exp(mode*math.Log(lambda) - lambda - lg)
	qm := math.Pow(q, mode)
	sum := pm * powi(1-qm, k)
	// Sum outwards from the mode until the terms no longer matter.
	p, qi := pm, qm
	for i := mode + 1; ; i++ {
		p *= lambda / i
		qi *= q
		t := p * powi(1-qi, k)
		sum += t
		if p < sum*1e-12 || p == 0 {
			break
		}
	}
	p, qi = pm, qm
	for i := mode; i > 0; i-- {
		p *= i / lambda
		qi /= q
		t := p * powi(1-qi, k)
		sum += t
		if t < sum*1e-12 {
			break
		}
	}
	return sum
}

// stdFP is the false-positive rate of one block of m bits holding exactly n
// IDs with k positions each: (1 − (1 − 1/m)^(k·n))^k.
func stdFP(m, n uint64, k int) float64 {
	return powi(1-math.Pow(1-1/float64(m), float64(k)*float64(n)), k)
}

func powi(x float64, k int) float64 {
	r := 1.0
	for ; k > 0; k >>= 1 {
		if k&1 == 1 {
			r *= x
		}
		x *= x
	}
	return r
}

// sizingFor returns the k and the largest mean fill (IDs per block) that
// keep blockedFP ≤ p, with k chosen for the fewest bits per ID. It costs
// about a millisecond: callers cache it for the fixed shares of the
// budget (Filters.first, Filters.blind); growth segments compute theirs.
func sizingFor(p float64) sizing {
	best := sizing{p: p, k: 1}
	worse := 0
	for k := 1; k <= maxK && worse < 2; k++ {
		// blockedFP grows with λ: bisect for the largest λ meeting p.
		lo, hi := 0.0, float64(blockBits)
		for range 50 {
			mid := (lo + hi) / 2
			if blockedFP(mid, k) <= p {
				lo = mid
			} else {
				hi = mid
			}
		}
		if lo > best.lambda {
			best.lambda, best.k, worse = lo, k, 0
		} else {
			worse++ // the best k is unimodal in k: stop after two worse
		}
	}
	best.lambda = max(best.lambda, 1e-3)
	return best
}

// shape returns the words and k of a filter for n IDs at s.p: whole
// blocks at s's fill, or, when n fits in one block, the smallest short
// block (whole words) whose exact rate for n IDs meets s.p.
func (s sizing) shape(n uint) (nwords, k int) {
	n = max(n, 1)
	blocks := math.Ceil(float64(n) / s.lambda)
	if blocks > 1 {
		return int(blocks) * blockWords, s.k
	}
	for w := 1; w <= blockWords; w++ {
		m := uint64(w) * 64
		// The standard filter's best k, (m/n)·ln 2, or a neighbour.
		k0 := int(float64(m) / float64(n) * math.Ln2)
		for k := max(k0-1, 1); k <= min(k0+1, maxK); k++ {
			if stdFP(m, uint64(n), k) <= s.p {
				return w, k
			}
		}
	}
	return blockWords, s.k // n ≤ λ: not reached, one full block meets p
}

// estRate is the expected false-positive rate of f holding n IDs: the
// blocked formula at n / blocks IDs per block, or, for a one-block filter
// (every ID in it), the standard one.
func estRate(f *filter, n uint) float64 {
	if f.nblocks == 1 {
		return stdFP(f.bits(), uint64(n), f.k)
	}
	return blockedFP(float64(n)/float64(f.nblocks), f.k)
}
