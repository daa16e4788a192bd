package bloom

// hashLog keeps the hash of every ID added to one chain, in the order
// added, so the chain can be compacted from memory: a filter of any size is
// rebuilt from the hashes alone (the block and the positions derive from
// the hash, see filter). The alternative, re-reading the bucket's records
// from storage, costs about 1.6 µs per record with Pebble's L0 full of
// overlapping files (measured: 10.5% of three nodes' CPU during a surge
// into a new bucket), where re-adding a logged hash costs one block write.
//
// Hashes live in chunks that are never moved once full, so a compaction
// reads the first n of them without the filters' lock while later adds
// append: appends only write beyond n. The first chunk grows by append,
// so a bucket of ten IDs costs a few words, not a whole chunk.
type hashLog struct {
	chunks [][]uint64
	n      int
}

// logChunk is the size of every chunk but the first's growth, in hashes
// (512 KiB).
const logChunk = 1 << 16

func (l *hashLog) add(h uint64) {
	if len(l.chunks) == 0 || len(l.chunks[len(l.chunks)-1]) == logChunk {
		c := make([]uint64, 0, 16)
		if len(l.chunks) > 0 {
			c = make([]uint64, 0, logChunk)
		}
		l.chunks = append(l.chunks, c)
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
// later appends (which write past them, or to new chunks) do not change it.
type logView struct {
	chunks [][]uint64
	n      int
}
