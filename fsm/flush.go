package fsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// A full write buffer is committed to Pebble off the apply path
// (DESIGN.md, "Write buffer"): ApplyBatch seals it — the counts and the
// applied index go into its batch, its overlay becomes the flushing
// overlay — and a goroutine writes its records, sorted, and commits the
// batch, while applies go on into a new buffer. Lookups read the active
// overlay, then the flushing one, then the database; the flushing overlay
// is dropped only after its batch is committed, so every record is in one
// of the three at every moment. Encoding, sorting and committing a full
// buffer took 114–305 ms on 2 shared cores (3 nodes in one process,
// mark-new 50×1); under f.mu that was a stall of every apply and read.
//
// At most one buffer is in flight: a buffer that fills while the previous
// one is still being written waits for it, and so do Snapshot, digests,
// Close, Restore and every other caller of flushLocked, which then commits
// the active buffer in place. A buffer that drops buckets or a namespace
// is also committed in place (rare: at most one bucket per bucket width):
// its records' liveness depends on the state at the drop, which the next
// applies change.

// flushJob is one sealed write buffer on its way to the database.
type flushJob struct {
	b  *pebble.Batch
	ov *overlay
	// live reports whether a bucket still exists; nil when the buffer
	// dropped nothing, so every buffered record's bucket is live.
	live    func(bloom.Key) bool
	applied uint64
	dropped []keyRange
	done    chan struct{} // closed once b is committed
	retired bool          // guarded by f.mu
}

// flushScratch is the scratch of the one flush that runs at a time.
type flushScratch struct {
	order []recOrder
	spare []recOrder // sortRecords' second array
	enc   []byte
}

// full reports whether the write buffer should be committed now: Pebble
// takes it without skiplist inserts, it reached a count bound, or it drops
// buckets or a namespace (rare: at most one bucket per bucket width and
// namespace), whose space comes back only once the range deletion is in
// the database and compacted.
func (a *applier) full() bool {
	lim := a.f.cfg.Buffer
	bytes, count := a.b.Len()+a.ov.bytes, int(a.b.Count())+a.ov.present
	return len(a.dropped) > 0 || a.f.db.LargeBatch(bytes, count) ||
		a.ov.n >= lim.MaxRecords ||
		a.entries >= lim.MaxEntries ||
		(lim.MaxBytes > 0 && bytes >= lim.MaxBytes)
}

// handOffLocked commits the full write buffer: in the background unless it
// dropped buckets. REQUIRES: f.mu held exclusively.
func (f *FSM) handOffLocked() {
	if len(f.applier.dropped) > 0 {
		f.flushLocked()
		return
	}
	f.awaitFlushLocked()
	job := f.sealLocked()
	f.flushing = job
	f.flushWG.Add(1)
	go func() {
		defer f.flushWG.Done()
		if f.beforeFlush != nil {
			f.beforeFlush()
		}
		// At background priority (storage.DB.Background): this commit is a
		// burst of CPU on every replica at once. Not flushLocked's commit,
		// which holds f.mu and so blocks applies and reads while it runs.
		f.db.Background(func() { job.write(f.db, &f.scratch) })
		close(job.done)
		f.mu.Lock()
		f.retireLocked(job)
		f.mu.Unlock()
	}()
}

// flushLocked commits the write buffer with the bucket counts, applied
// index and last timestamp it covers, in one Pebble batch (unsynced, like
// every apply before the buffer: see DESIGN.md, Durability), after the
// buffer in flight if there is one; on return the database holds every
// applied entry. A crash loses the buffers and nothing else: Pebble holds
// a state as of its persisted applied index, and Raft replays the entries
// after it. REQUIRES: f.mu held exclusively.
func (f *FSM) flushLocked() {
	f.awaitFlushLocked()
	if f.st.applied == f.persisted || f.applier.b == nil {
		return
	}
	job := f.sealLocked()
	job.live = func(k bloom.Key) bool { _, ok := f.st.registry[k]; return ok }
	job.write(f.db, &f.scratch)
	close(job.done)
	f.retireLocked(job)
}

// awaitFlushLocked waits for the buffer in flight, if any, to be
// committed. It holds f.mu meanwhile: the flush needs no lock to write.
func (f *FSM) awaitFlushLocked() {
	if job := f.flushing; job != nil {
		<-job.done
		f.retireLocked(job)
	}
}

// sealLocked ends the write buffer: its counts, applied index and last
// timestamp go into its batch, and the applier starts a new buffer.
func (f *FSM) sealLocked() *flushJob {
	a := f.applier
	a.foldHot()
	a.flushCounts()
	must(a.b.Set(storage.MetaKey(metaApplied), encodeApplied(f.st.applied, f.st.appliedTerm), nil))
	must(a.b.Set(storage.MetaKey(metaTs), encodeVarint(f.st.lastTs), nil))
	job := &flushJob{b: a.b, ov: a.ov, applied: f.st.applied, dropped: a.dropped, done: make(chan struct{})}
	a.b, a.ov, a.spare = nil, a.spare, nil
	if a.ov == nil {
		a.ov = newOverlay()
	}
	a.clearPending()
	return job
}

// retireLocked records a committed buffer: the persisted index moves to
// it, its dropped ranges go to the compactor, its overlay is emptied for
// reuse. Idempotent: the flush goroutine and a waiter may both call it.
func (f *FSM) retireLocked(job *flushJob) {
	if job.retired {
		return
	}
	job.retired = true
	// Its records now live only in the database, where a view opened
	// before its commit would miss them. (ApplyBatch commits after its
	// entries, so today this releases nothing a lookup still needs.)
	f.applier.releaseReader()
	if f.flushing == job {
		f.flushing = nil
	}
	f.persisted = job.applied
	if len(job.dropped) > 0 {
		f.bg.compact(job.dropped)
	}
	job.ov.reset()
	f.applier.spare = job.ov
}

// write commits the buffer: its batch's writes, then its records, in one
// batch allocated for exactly that much, so that tens of MiB of records are
// copied into it once instead of again at every doubling of a batch grown
// by appends.
func (job *flushJob) write(db *storage.DB, sc *flushScratch) {
	sc.encodeRecords(job.ov, job.live)
	b := db.NewBatchWithSize(job.b.Len() + sc.batchBytes())
	must(b.Apply(job.b, nil))
	job.b.Close()
	job.b = nil
	sc.appendRecords(b)
	must(b.Commit(pebble.NoSync))
	b.Close()
}

// encodeRecords encodes the overlay's live records and sorts them by key,
// for appendRecords to add to the buffer's batch after every other write
// of the buffer: the batch then holds, in apply order,
// the deletions (moved and forgotten records' old keys, dropped buckets
// and namespaces) and the small keys (counts, namespaces, nodes),
// followed by one Set per live record. That is the state the entries
// produce: a record written and then superseded, removed, or dropped with
// its bucket or namespace has no present overlay entry in a live bucket,
// and a deletion never follows the final version of a key (the overlay
// holds that version: a later deletion would have replaced it). Writing
// the large part sorted makes Pebble's sort of the flushable batch's index
// nearly linear. Dropped buckets never come back, so the liveness test
// below is the one lookups apply; live nil means every bucket is live.
func (sc *flushScratch) encodeRecords(ov *overlay, live func(bloom.Key) bool) {
	// One pass in slot order (sequential memory) encodes every live
	// record's key and value into enc; the sorted pass then reads one
	// contiguous span per record instead of its slot, its key and its
	// token and digest in the arena (cache misses at random places of a
	// buffer of tens of MiB). Both are sized once from the overlay's
	// counts instead of growing by copies.
	sc.order = slices.Grow(sc.order[:0], ov.present)
	sc.enc = slices.Grow(sc.enc[:0], ov.bytes)
	var last bloom.Key
	lastLive, haveLast := true, false
	ov.each(func(k []byte, e *ovEntry) {
		if !e.present {
			return
		}
		key := bloom.Key{Namespace: binary.BigEndian.Uint32(k), Bucket: e.bucket}
		if live != nil && (!haveLast || key != last) {
			lastLive = live(key)
			last, haveLast = key, true
		}
		if !lastLive {
			return
		}
		off := len(sc.enc)
		sc.enc = storage.AppendRecordKey(sc.enc, key.Namespace, key.Bucket, e.loc, k[4:])
		klen := len(sc.enc) - off
		sc.enc = appendRecord(sc.enc, &e.rec)
		if uint64(len(sc.enc)) > math.MaxUint32 || klen > math.MaxUint16 || len(sc.enc)-off-klen > math.MaxUint16 {
			panic(fmt.Sprintf("fsm: write buffer record too large to sort (%d bytes of keys and values)", len(sc.enc)))
		}
		var pre [8]byte
		copy(pre[:], k[4:])
		sc.order = append(sc.order, recOrder{ns: key.Namespace, bucket: key.Bucket, loc: e.loc, pre: binary.BigEndian.Uint64(pre[:]),
			off: uint32(off), klen: uint16(klen), vlen: uint16(len(sc.enc) - off - klen)})
	})
	sc.order, sc.spare = sortRecords(sc.order, sc.spare, sc.enc)
}

// batchBytes is the size the sorted records take in a pebble.Batch: a
// kind byte and two uvarint lengths per record besides its key and value.
func (sc *flushScratch) batchBytes() int {
	return len(sc.enc) + len(sc.order)*(1+2*binary.MaxVarintLen16)
}

// appendRecords adds the records encodeRecords sorted to b, in key order.
func (sc *flushScratch) appendRecords(b *pebble.Batch) {
	enc := sc.enc
	for _, r := range sc.order {
		k := r.key(enc)
		must(b.Set(k, enc[int(r.off)+len(k):int(r.off)+len(k)+int(r.vlen)], nil))
	}
	if cap(sc.enc) > maxReusedEnc {
		sc.enc = nil
	}
}

// maxReusedEnc bounds encodeRecords' scratch kept between flushes.
const maxReusedEnc = 32 << 20

// sortRecords sorts order by key and returns it, with the array it did not
// return for the next call's spare. A buffer's records nearly always share
// one namespace, bucket and write window (a few span two windows, or hold
// rewrites in older ones), and their IDs are random. So the records are
// first split into their (layout, namespace, bucket, window) groups, in
// key order, and each group of 4096 records or more is sorted by a
// counting pass on the ID's first byte, splitting it into 256 runs, and a
// second on its second byte, splitting each run into 256 more: only the
// records sharing their first two bytes (one or two, at a buffer's size)
// are compared. The passes scatter into 256 places at a time, which the
// caches follow. It replaced 256 comparison sorts of a run each, 2.8 % of
// a 3-node write load's CPU (one comparison sort of the whole had been 7 %
// of ApplyMarkNew3FSMs's). Fewer than 4096 records in all (where the split
// saves little), or more than maxSortGroups groups, take the full sort.
func sortRecords(order, spare []recOrder, enc []byte) (sorted, next []recOrder) {
	less := func(x, y recOrder) int {
		if !sameGroup(x, y) {
			return compareGroups(x, y)
		}
		if x.pre != y.pre {
			return cmp.Compare(x.pre, y.pre)
		}
		return bytes.Compare(x.key(enc), y.key(enc))
	}
	if len(order) < 4096 {
		slices.SortFunc(order, less)
		return order, spare
	}
	// The groups, in key order, and each group's first index in spare.
	var groups [maxSortGroups]recOrder
	var start [maxSortGroups + 1]int
	n, g := 0, 0
	for _, r := range order {
		if n > 0 && sameGroup(groups[g], r) {
			start[g+1]++ // nearly always: the group of the record before
			continue
		}
		g = 0
		for g < n && !sameGroup(groups[g], r) {
			g++
		}
		if g == n {
			if n == maxSortGroups {
				slices.SortFunc(order, less)
				return order, spare
			}
			groups[n] = r
			n++
		}
		start[g+1]++
	}
	idx := make([]int, n) // group positions in key order
	for g := range idx {
		idx[g] = g
	}
	slices.SortFunc(idx, func(a, b int) int { return compareGroups(groups[a], groups[b]) })
	var pos [maxSortGroups + 1]int
	at := 0
	for _, g := range idx {
		pos[g] = at
		at += start[g+1]
	}
	spare = slices.Grow(spare[:0], len(order))[:len(order)]
	if n > 1 {
		// Scatter the groups into spare in key order, then back into order.
		next := pos
		g := 0
		for _, r := range order {
			if !sameGroup(groups[g], r) {
				g = 0
				for !sameGroup(groups[g], r) {
					g++
				}
			}
			spare[next[g]] = r
			next[g]++
		}
		copy(order, spare)
	}
	for g := range n {
		lo, hi := pos[g], pos[g]+start[g+1]
		if hi-lo < 4096 {
			slices.SortFunc(order[lo:hi], less)
			continue
		}
		radixSortGroup(order[lo:hi], spare[lo:hi], less)
	}
	return order, spare
}

// maxSortGroups bounds the groups sortRecords splits a buffer into before
// it falls back to one comparison sort.
const maxSortGroups = 16

// sameGroup reports whether x and y share the part of their key before the
// ID (a Loc names the layout too).
func sameGroup(x, y recOrder) bool {
	return x.loc == y.loc && x.bucket == y.bucket && x.ns == y.ns
}

// compareGroups orders records by the part of their key before the ID:
// legacy keys ('r') before windowed ones ('w'), then namespace, bucket and
// window.
func compareGroups(x, y recOrder) int {
	xw, yw := x.loc != storage.LegacyLoc, y.loc != storage.LegacyLoc
	switch {
	case xw != yw:
		if xw {
			return 1
		}
		return -1
	case x.ns != y.ns:
		return cmp.Compare(x.ns, y.ns)
	case x.bucket != y.bucket:
		return cmp.Compare(x.bucket, y.bucket)
	}
	return cmp.Compare(x.loc, y.loc)
}

// radixSortGroup sorts order, records of one group, by their IDs' first
// two bytes and then less, using spare (as long) as scratch.
func radixSortGroup(order, spare []recOrder, less func(x, y recOrder) int) {
	var start [257]int
	splitByte(order, spare, 56, &start)
	var sub [257]int
	for d := range 256 {
		lo, hi := start[d], start[d+1]
		if hi-lo < 2 {
			copy(order[lo:hi], spare[lo:hi])
			continue
		}
		splitByte(spare[lo:hi], order[lo:hi], 48, &sub)
		for e := range 256 {
			if run := order[lo+sub[e] : lo+sub[e+1]]; len(run) > 1 {
				slices.SortFunc(run, less)
			}
		}
	}
}

// splitByte copies src into dst ordered by the byte of pre at bit shift
// (stable), and leaves in start the bounds of each byte's run in dst:
// start[b] to start[b+1].
func splitByte(src, dst []recOrder, shift uint, start *[257]int) {
	*start = [257]int{}
	for _, r := range src {
		start[int(byte(r.pre>>shift))+1]++
	}
	for d := 1; d <= 256; d++ {
		start[d] += start[d-1]
	}
	pos := *start
	for _, r := range src {
		d := byte(r.pre >> shift)
		dst[pos[d]] = r
		pos[d]++
	}
}

// recOrder sorts buffered records by key: legacy keys first, then
// namespace, bucket, window, then the ID (its first 8 bytes as an
// integer, zero-padded, then the whole key). The record's key is
// enc[off:off+klen], its value the vlen bytes after it.
type recOrder struct {
	ns         uint32
	off        uint32
	bucket     uint64
	pre        uint64
	klen, vlen uint16
	loc        storage.Loc
}

func (r recOrder) key(enc []byte) []byte { return enc[r.off : r.off+uint32(r.klen)] }
