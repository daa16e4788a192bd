package bloom

// hashLog keeps the hash of every ID added to one chain, in the order
// added, so the chain can be compacted from memory: a filter of any size is
// rebuilt from the hashes alone (the block and the positions derive from
// the hash, see filter). The alternative, re-reading the bucket's records
// from storage, costs about 1.6 µs per record with Pebble's L0 full of
// overlapping files (measured: 10.5% of three nodes' CPU during a surge
// into a new bucket), where re-adding a logged hash costs one block write.
//
// Hashes live in chunks that are never written below their length once
// handed to a view, so a compaction reads the first n of them without the
// filters' lock while later adds append: appends only write beyond n, and
// a chunk that grows is copied to a new array (views keep the old one).
// The first chunk doubles from 16 slots up to logChunk, so a bucket of ten
// IDs costs a few words, not a whole chunk. The filters bound and report
// the logs by their slots (capacity), which is their memory.
type hashLog struct {
	chunks [][]uint64
	n      int
	slots  int // capacity of every chunk: the log's memory in hashes
}

// logChunk is the size of a full chunk, in hashes (512 KiB).
const logChunk = 1 << 16

// firstChunk is the capacity of a new log's first chunk.
const firstChunk = 16

// growth returns how many slots the next add allocates (0 when the last
// chunk has room).
func (l *hashLog) growth() int {
	if len(l.chunks) == 0 {
		return firstChunk
	}
	last := l.chunks[len(l.chunks)-1]
	switch {
	case len(last) < cap(last):
		return 0
	case cap(last) < logChunk:
		return min(2*cap(last), logChunk) - cap(last)
	default:
		return logChunk
	}
}

// add appends h. g must be growth(): the caller has already asked it, to
// keep the filters' bound, and the slots it names are allocated here — a
// new chunk when the last is a full logChunk (or there is none), else the
// last one copied into an array g slots larger.
func (l *hashLog) add(h uint64, g int) {
	if g > 0 {
		l.slots += g
		if len(l.chunks) == 0 || cap(l.chunks[len(l.chunks)-1]) == logChunk {
			l.chunks = append(l.chunks, make([]uint64, 0, g))
		} else {
			last := l.chunks[len(l.chunks)-1]
			grown := make([]uint64, len(last), cap(last)+g)
			copy(grown, last)
			l.chunks[len(l.chunks)-1] = grown
		}
	}
	last := &l.chunks[len(l.chunks)-1]
	*last = append(*last, h)
	l.n++
}

// view returns the hashes logged so far, readable while add goes on.
func (l *hashLog) view() logView {
	return logView{chunks: append([][]uint64(nil), l.chunks...), n: l.n}
}

// logView is a prefix of a hashLog: its chunk headers were copied, so
// later appends (which write past them, or to new arrays) do not change it.
type logView struct {
	chunks [][]uint64
	n      int
}
