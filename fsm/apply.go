package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// Apply applies one Raft log entry (raft.FSM). See ApplyBatch.
func (f *FSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies entries (raft.BatchingFSM) and returns one response
// per entry: *ApplyResult for a command, *ApplyErr for an entry that fails
// to decode (skipped alike on every replica), nil for non-command entries
// and for replays (index at or below the applied index).
//
// Writes go to the FSM's write buffer (DESIGN.md, "Write buffer"): a
// pending Pebble batch plus the overlay that makes its records visible to
// lookups and Check. Once it is large enough for Pebble to take it as a
// flushable batch, or holds Buffer.MaxRecords records or MaxEntries
// entries, the buffer is sealed with the applied index in its batch and
// committed in the background (flush.go); Snapshot, DigestState and Close
// commit it first. Replicas may commit at different points; the state
// they reach does not depend on where.
//
// A storage failure panics: a replica that cannot apply must stop rather
// than diverge.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	open := f.cfg.ApplyGate == nil || f.cfg.ApplyGate() // outside f.mu: reads go on while it waits
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.applier.releaseReader()
	out := make([]any, len(logs))
	if f.closed {
		panic("fsm: apply after Close")
	}
	if !open || f.deferred {
		f.deferred = true
		for i, l := range logs {
			if l.Type == raft.LogCommand {
				out[i] = ErrApplyDeferred
			}
		}
		return out
	}
	a := f.applier
	if a.b == nil {
		// Small: it takes the deletions and counts; the records go into
		// a batch sized for them when the buffer is committed.
		a.b = f.db.NewBatch()
	}
	advanced := false
	for i, l := range logs {
		if l.Index <= f.st.applied {
			continue
		}
		if l.Type == raft.LogCommand {
			cmd, err := DecodeCommand(l.Data)
			if err != nil {
				out[i] = &ApplyErr{Err: fmt.Errorf("entry %d: %w", l.Index, err)}
			} else {
				out[i] = a.command(l.Index, &cmd)
			}
		}
		f.st.applied, f.st.appliedTerm = l.Index, l.Term
		a.entries++
		advanced = true
	}
	if !advanced {
		return out
	}
	a.foldHot()
	if a.full() {
		f.handOffLocked()
	}
	close(f.notify)
	f.notify = make(chan struct{})
	return out
}

// ErrApplyDeferred answers entries the FSM did not apply because the node
// stopped while applying was paused (Config.ApplyGate): they are committed
// and apply after the node restarts.
var ErrApplyDeferred = errors.New("fsm: apply deferred (node stopping while its disk was full); the entry is committed and applies after restart")

func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("fsm: storage write failed, stopping rather than diverging: %v", err))
	}
}

// applier holds the write buffer and the working state of ApplyBatch (one
// goroutine, under f.mu held exclusively). The buffer (b, ov, dirty,
// dropped, entries) lives from one flush to the next; the rest is per item.
type applier struct {
	f *FSM
	// b is the pending Pebble batch: every write since the last flush, in
	// apply order (a later write of a key, or a range deletion, supersedes
	// an earlier one as in any Pebble batch). nil after a flush.
	b *pebble.Batch
	// ov overlays the records written since the last flush (not yet
	// visible in the database), keyed by HashKey(nsID, id). Check reads
	// it under f.mu shared. spare is the overlay of the last committed
	// buffer, emptied, for the next hand-off.
	ov, spare *overlay
	// dirty holds the buckets whose count changed since the last flush;
	// dropped the ranges deleted since, compacted after the flush;
	// entries counts the Raft entries applied since.
	dirty   map[bloom.Key]struct{}
	dropped []keyRange
	entries int
	now     int64
	index   uint64
	// hbuf is the current item's HashKey and sc.probe its Bloom probe,
	// computed once per item for the lookup and the filter add.
	hbuf []byte
	sc   lookupScratch
	rep  repeats // the current op's repeated items
	kbuf []byte
	vbuf []byte
	// hot is the bucket most recently written to and hotN the records
	// added to it and not yet counted in st.registry (whose entry for hot
	// exists; hotInserts and hotShift are its inserts and shift when it
	// became hot): consecutive new records nearly always share a bucket,
	// so this saves two map updates per record. foldHot adds hotN to the
	// entry before anything else changes it; readers inside apply see it
	// through bucketEntryLocked.
	hot        bloom.Key
	hotN       uint64
	hotInserts uint64
	hotShift   uint8
	hotSet     bool
}

// maxReusedOverlay bounds the overlay kept between flushes: one that grew
// past the configured buffer (a huge single entry) is dropped rather than
// held forever.
const maxReusedOverlay = 1 << 18

// releaseReader closes the iterator the applier's lookups share, so it
// pins no memtable or sstable between batches, sees every commit, and
// outlives no database a Restore or Close replaces. REQUIRES: f.mu held
// exclusively.
func (a *applier) releaseReader() {
	if err := a.sc.reader.Release(); err != nil {
		a.f.log.Error("close record reader", "err", err)
	}
}

// discard empties the write buffer (after a flush, or when a restore
// replaces the state it was written against), keeping allocations.
func (a *applier) discard() {
	if a.b != nil {
		a.b.Close()
		a.b = nil
	}
	if a.ov == nil {
		a.ov = newOverlay()
	}
	a.ov.reset()
	a.clearPending()
}

// clearPending forgets the bookkeeping of the buffer (after it was
// discarded or handed to a flush).
func (a *applier) clearPending() {
	if a.dirty == nil {
		a.dirty = make(map[bloom.Key]struct{})
	} else {
		clear(a.dirty)
	}
	a.dropped = nil // handed to the compactor
	a.entries = 0
	a.hot, a.hotN, a.hotSet = bloom.Key{}, 0, false
}

type ovEntry struct {
	rec     Record
	bucket  uint64
	loc     storage.Loc
	present bool
}

// recordBytesLowerBound is a lower bound of the bytes a record's key and
// value take in a Pebble batch (key 'w' nsID bucket window id, or 'r'
// nsID bucket id; value version, state, three varints, two
// length-prefixed byte strings).
func recordBytesLowerBound(idLen int, rec *Record) int {
	return storage.RecordKeyPrefixLen + idLen + 8 + len(rec.Token) + len(rec.Digest)
}

// overlay maps a HashKey to its ovEntry without allocating per write (a
// map[string] key costs one allocation per record). Its index is an
// open-addressing table of its own: a record is written once per apply
// and most writes are of new keys, and a Go map took three lookups per
// write (find, chain head, insert; 5 % of a 3-node write load's CPU in
// cache misses on its control words); the table takes one probe sequence,
// and a tag of the hash in each cell rejects other keys without touching
// their slots. The hash (maphash, random seed, so client-chosen IDs cannot
// aim at one probe sequence) only finds slots, never decides a result, so
// the seed does not make apply nondeterministic.
//
// Slots live in fixed-size chunks rather than one slice: a slice of a
// hundred thousand slots grown by append copied itself (16 MiB and more)
// under f.mu, stalling applies for tens of milliseconds. The table is 8
// bytes a cell, at most half full; it doubles by re-inserting every slot
// under f.mu, which happens only while an overlay first grows: reset keeps
// the table, and the applier reuses its overlays from buffer to buffer.
//
// The overlay outlives the entries that wrote it, so it copies each
// record's token and digest into arena chunks it owns. A chunk is never
// reused (reset starts a new one): records handed out by lookups alias it
// and may still be read, e.g. in an ApplyResult being sent to a client.
type overlay struct {
	seed maphash.Seed
	// table holds, per cell, 0 (empty) or the high 32 bits of the key's
	// hash and its slot index + 1 in the low 32. Its length is a power of
	// two; a key's probe sequence starts at hash & (len-1).
	table  []uint64
	chunks [][]ovSlot // every chunk but the last holds slotChunk slots
	n      int        // slots in use
	keys   []byte
	arena  []byte
	// present counts the slots holding a record, and bytes the lower bound
	// of their size in a Pebble batch (recordBytesLowerBound).
	present, bytes int
}

// arenaChunk is the size of one arena chunk; slotChunk the slots in one
// chunk of slots (128 KiB); minOverlayTable the first table's cells.
const (
	arenaChunk      = 64 << 10
	slotChunk       = 1 << 10
	minOverlayTable = 1 << 10
)

func newOverlay() *overlay {
	return &overlay{seed: maphash.MakeSeed(), table: make([]uint64, minOverlayTable)}
}

// own returns a copy of p in the arena (nil for an empty p).
func (o *overlay) own(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	if cap(o.arena)-len(o.arena) < len(p) {
		o.arena = make([]byte, 0, max(arenaChunk, len(p)))
	}
	n := len(o.arena)
	o.arena = append(o.arena, p...)
	return o.arena[n : n+len(p) : n+len(p)]
}

func (o *overlay) slot(i int) *ovSlot { return &o.chunks[i/slotChunk][i%slotChunk] }

func (o *overlay) key(s *ovSlot) []byte { return o.keys[s.off : s.off+s.n] }

// each calls fn for every key and entry of the overlay, in insertion order.
func (o *overlay) each(fn func(k []byte, e *ovEntry)) {
	for i := range o.n {
		s := o.slot(i)
		fn(o.key(s), &s.e)
	}
}

type ovSlot struct {
	off, n int    // key is keys[off:off+n]
	h      uint64 // the key's hash, to move it when the table grows
	size   int    // recordBytesLowerBound of e.rec if e.present
	e      ovEntry
}

// find returns the slot of key k (hash h), or -1 and the empty cell where
// k would be inserted.
func (o *overlay) find(h uint64, k []byte) (slot, cell int) {
	tag := h >> 32
	mask := len(o.table) - 1
	for c := int(h) & mask; ; c = (c + 1) & mask {
		v := o.table[c]
		if v == 0 {
			return -1, c
		}
		if v>>32 == tag {
			i := int(uint32(v)) - 1
			if bytes.Equal(o.key(o.slot(i)), k) {
				return i, c
			}
		}
	}
}

func (o *overlay) get(k []byte) (ovEntry, bool) {
	if o.n == 0 {
		return ovEntry{}, false
	}
	return o.getHash(maphash.Bytes(o.seed, k), k)
}

func (o *overlay) getHash(h uint64, k []byte) (ovEntry, bool) {
	if i, _ := o.find(h, k); i >= 0 {
		return o.slot(i).e, true
	}
	return ovEntry{}, false
}

func (o *overlay) put(k []byte, e ovEntry) { o.putHash(maphash.Bytes(o.seed, k), k, e) }

func (o *overlay) putHash(h uint64, k []byte, e ovEntry) {
	e.rec.Token, e.rec.Digest = o.own(e.rec.Token), o.own(e.rec.Digest)
	size := 0
	if e.present {
		size = recordBytesLowerBound(len(k)-4, &e.rec) // k is HashKey: nsID(4) id
		o.present++
		o.bytes += size
	}
	i, cell := o.find(h, k)
	if i >= 0 {
		s := o.slot(i)
		if s.e.present {
			o.present--
			o.bytes -= s.size
		}
		s.e, s.size = e, size
		return
	}
	if 2*(o.n+1) > len(o.table) {
		o.grow()
		_, cell = o.find(h, k)
	}
	c := o.n / slotChunk
	if c == len(o.chunks) {
		o.chunks = append(o.chunks, make([]ovSlot, slotChunk))
	}
	o.chunks[c][o.n%slotChunk] = ovSlot{off: len(o.keys), n: len(k), h: h, size: size, e: e}
	o.table[cell] = h>>32<<32 | uint64(o.n+1)
	o.n++
	o.keys = append(o.keys, k...)
}

// grow doubles the table and re-inserts every slot (the overlay never
// removes a slot, so there are no deleted cells to skip).
func (o *overlay) grow() {
	o.table = make([]uint64, 2*len(o.table))
	mask := len(o.table) - 1
	for i := range o.n {
		h := o.slot(i).h
		c := int(h) & mask
		for o.table[c] != 0 {
			c = (c + 1) & mask
		}
		o.table[c] = h>>32<<32 | uint64(i+1)
	}
}

// reset empties the overlay, keeping its memory unless one huge batch
// grew it past maxReusedOverlay entries.
func (o *overlay) reset() {
	if o.n > maxReusedOverlay {
		*o = *newOverlay()
		return
	}
	clear(o.table)
	for c := range o.chunks[:(o.n+slotChunk-1)/slotChunk] {
		clear(o.chunks[c]) // drop references to the arena
	}
	o.n, o.keys, o.arena = 0, o.keys[:0], nil
	o.present, o.bytes = 0, 0
}

func (a *applier) command(index uint64, cmd *Command) *ApplyResult {
	st := &a.f.st
	now := max(cmd.TimestampMs, st.lastTs, 0)
	st.lastTs = now
	a.now, a.index = now, index
	a.dropExpired()
	res := &ApplyResult{Index: index, Ops: make([]OpResult, len(cmd.Ops))}
	for i := range cmd.Ops {
		res.Ops[i] = a.op(&cmd.Ops[i])
	}
	return res
}

func (a *applier) op(op *Op) OpResult {
	st := &a.f.st
	switch op.Kind {
	case OpTick:
		return OpResult{}
	case OpRaiseFenceEpoch:
		return a.raiseFenceEpoch(op.FenceEpoch)
	case OpCreateNamespace:
		return a.createNamespace(op.Config)
	case OpUpdateNamespace:
		return a.updateNamespace(op.Config)
	case OpDeleteNamespace:
		return a.deleteNamespace(op.Namespace)
	case OpSetNode:
		if op.Node.ID == "" {
			return OpResult{Err: invalid("node.id", "empty")}
		}
		st.nodes[op.Node.ID] = op.Node.GRPCAddr
		must(a.b.Set(storage.NodeKey(op.Node.ID), []byte(op.Node.GRPCAddr), nil))
		return OpResult{}
	case OpSetNodeRegion:
		if op.Node.ID == "" {
			return OpResult{Err: invalid("node.id", "empty")}
		}
		st.nodes[op.Node.ID] = op.Node.GRPCAddr
		must(a.b.Set(storage.NodeKey(op.Node.ID), []byte(op.Node.GRPCAddr), nil))
		a.setRegion(op.Node.ID, op.Node.Region)
		return OpResult{}
	case OpRemoveNode:
		if op.Node.ID == "" {
			return OpResult{Err: invalid("node.id", "empty")}
		}
		// The ID is retired even when the node table does not hold it (a
		// member removed before its join recorded an address): it left
		// the Raft configuration all the same.
		if !st.retired[op.Node.ID] {
			st.retired[op.Node.ID] = true
			must(a.b.Set(storage.RetiredNodeKey(op.Node.ID), nil, nil))
		}
		if _, ok := st.nodes[op.Node.ID]; !ok {
			return OpResult{Err: fmt.Errorf("%w: %q", ErrNodeNotFound, op.Node.ID)}
		}
		delete(st.nodes, op.Node.ID)
		must(a.b.Delete(storage.NodeKey(op.Node.ID), nil))
		if _, ok := st.roles[op.Node.ID]; ok {
			delete(st.roles, op.Node.ID)
			must(a.b.Delete(storage.NodeRoleKey(op.Node.ID), nil))
		}
		a.setRegion(op.Node.ID, "")
		return OpResult{}
	case OpSetNodeRole:
		if op.Node.ID == "" {
			return OpResult{Err: invalid("node.id", "empty")}
		}
		if op.Node.Role == RoleMember {
			delete(st.roles, op.Node.ID)
			must(a.b.Delete(storage.NodeRoleKey(op.Node.ID), nil))
			return OpResult{}
		}
		st.roles[op.Node.ID] = op.Node.Role
		must(a.b.Set(storage.NodeRoleKey(op.Node.ID), []byte{byte(op.Node.Role)}, nil))
		return OpResult{}
	case OpSetSetting:
		if op.Setting.Name == "" {
			return OpResult{Err: invalid("setting.name", "empty")}
		}
		if op.Setting.Name == ClusterIDSetting {
			return a.applyClusterID(op.Setting)
		}
		if op.Setting.Unset {
			if _, ok := st.settings[op.Setting.Name]; ok {
				delete(st.settings, op.Setting.Name)
				must(a.b.Delete(storage.SettingKey(op.Setting.Name), nil))
			}
			return OpResult{}
		}
		st.settings[op.Setting.Name] = op.Setting.Value
		must(a.b.Set(storage.SettingKey(op.Setting.Name), []byte(op.Setting.Value), nil))
		return OpResult{}
	}
	name := op.Namespace
	if name == "" {
		name = DefaultNamespace
	}
	ns := st.namespaces[name]
	if ns == nil {
		return OpResult{Err: &NamespaceError{Name: name, Err: ErrNamespaceNotFound}}
	}
	// Re-validate against the namespace as of this entry: its limits may
	// have changed since the edge checked. Deterministic, and an invalid op
	// applies nothing.
	if err := Validate(op, ns, Limits{MaxBatch: 1 << 30}); err != nil {
		return OpResult{Err: err}
	}
	if op.Kind == OpClaim && a.index > maxFenceIndex {
		return OpResult{Err: fmt.Errorf("%w: Raft index %d exceeds the %d bits of a fencing token's index", ErrFenceRange, a.index, FenceIndexBits)}
	}
	res := OpResult{Items: make([]ItemResult, len(op.Items))}
	a.rep.reset(op)
	for i := range op.Items {
		res.Items[i] = a.item(op, ns, i)
	}
	a.rep.reset(nil) // holds nothing of the entry past its apply
	return res
}

// repeats recognises, within one op, an item that repeats the ID and the
// request token of an earlier item of the same op: the same logical call
// naming one ID twice (`mark X X`, a broker batch holding a redelivered
// message twice). The first occurrence decides; a repeat is answered as a
// second call would be, never as a retry of its earlier sibling, although
// it finds a record carrying its own token (DESIGN.md, "Repeats within a
// request").
//
// The scope is one op, that is one client request: the grouper puts
// separate requests into separate ops of one entry, and a request retried
// while its first attempt was still in flight may land in the same entry
// as that attempt, as another op, and must answer alike. The key is the ID
// and the token, not the ID alone: a Batcher request carries many
// callers' items, each with its own token, and a caller's retry sharing a
// request with another caller's first try of the same ID must still get
// its own first answer.
//
// Only the retry branches of Mark and Claim ask (an item whose token
// matches its record's), so a request without repeats or retries pays
// nothing; the first ask builds the set of the items before it, and later
// asks extend it, O(items) per op in all.
type repeats struct {
	op   *Op
	seen map[string]struct{}
	n    int // op.Items[:n] are in seen
	key  []byte
}

func (r *repeats) reset(op *Op) { r.op, r.seen, r.n = op, nil, 0 }

// of reports whether op.Items[i] repeats the ID and token of an earlier
// item of the op.
func (r *repeats) of(i int) bool {
	if r.seen == nil {
		r.seen = make(map[string]struct{}, i)
	}
	for ; r.n < i; r.n++ {
		r.seen[string(r.keyOf(&r.op.Items[r.n]))] = struct{}{}
	}
	_, ok := r.seen[string(r.keyOf(&r.op.Items[i]))]
	return ok
}

// keyOf returns the item's ID and token as one key, the ID's length first so
// that no two pairs share it.
func (r *repeats) keyOf(it *Item) []byte {
	r.key = binary.AppendUvarint(r.key[:0], uint64(len(it.ID)))
	r.key = append(r.key, it.ID...)
	return append(r.key, it.Token...)
}

// setRegion records node id's region ("" removes it).
func (a *applier) setRegion(id, region string) {
	st := &a.f.st
	if region == "" {
		if _, ok := st.regions[id]; ok {
			delete(st.regions, id)
			must(a.b.Delete(storage.NodeRegionKey(id), nil))
		}
		return
	}
	st.regions[id] = region
	must(a.b.Set(storage.NodeRegionKey(id), []byte(region), nil))
}

func (a *applier) item(op *Op, ns *NamespaceConfig, i int) ItemResult {
	it := &op.Items[i]
	a.hbuf = bloom.HashKey(a.hbuf[:0], ns.ID, it.ID)
	a.sc.probe.Reset(a.hbuf)
	rec, bucket, found := a.lookup(ns, it.ID, a.hbuf)
	live := found && rec.live(a.now)
	now := a.now
	switch op.Kind {
	case OpMark:
		ttl := op.DurationMs
		if ttl == 0 {
			ttl = ns.DefaultTTLMs
		}
		if !live {
			nr := Record{State: StateCommitted, FirstSeenMs: now, ExpiresMs: now + ttl, Token: it.Token, Digest: it.Digest, Fence: rec.Fence}
			a.write(ns, it.ID, found, bucket, &nr)
			return ItemResult{Code: CodeNew, Record: nr}
		}
		repeat := false
		if rec.State == StateCommitted && len(it.Token) > 0 && string(it.Token) == string(rec.Token) {
			if repeat = a.rep.of(i); !repeat {
				return ItemResult{Code: CodeNew, Record: rec} // a retry of the winning call
			}
		}
		if !equalDigest(rec.Digest, it.Digest) {
			return ItemResult{Code: CodeConflict, Record: rec}
		}
		// A repeat writes nothing, as the retry answer it replaces did not:
		// in a first attempt its sibling just set the expiry, and in a
		// retried request the sliding sighting was the first attempt's. So
		// every entry reaches the state it reached before repeats were
		// recognised (DESIGN.md, "Repeats within a request").
		if !repeat && ns.Mode == ExpirySliding && rec.State == StateCommitted && now+ttl > rec.ExpiresMs {
			rec.ExpiresMs = now + ttl
			a.write(ns, it.ID, true, bucket, &rec)
		}
		return ItemResult{Code: CodeDuplicate, Record: rec}
	case OpClaim:
		lease := op.DurationMs
		if lease == 0 {
			lease = ns.DefaultLeaseMs
		}
		if !live {
			nr := Record{State: StateLeased, FirstSeenMs: now, ExpiresMs: now + lease, Token: it.Token, Digest: it.Digest, Fence: MakeFence(a.f.st.fenceEpoch, a.index)}
			a.write(ns, it.ID, found, bucket, &nr)
			return ItemResult{Code: CodeAcquired, Record: nr}
		}
		if rec.State == StateLeased {
			if len(it.Token) > 0 && string(it.Token) == string(rec.Token) && !a.rep.of(i) {
				return ItemResult{Code: CodeAcquired, Record: rec} // a retry of the winning call
			}
			return ItemResult{Code: CodeInProgress, Record: rec}
		}
		if !equalDigest(rec.Digest, it.Digest) {
			return ItemResult{Code: CodeConflict, Record: rec}
		}
		return ItemResult{Code: CodeDuplicate, Record: rec}
	case OpCommit:
		if !found || !holds(&rec, it) || rec.ExpiresMs <= now {
			return lost(rec, found, it, now)
		}
		switch rec.State {
		case StateLeased:
			ttl := op.DurationMs
			if ttl == 0 {
				ttl = ns.DefaultTTLMs
			}
			rec.State, rec.ExpiresMs = StateCommitted, now+ttl
			a.write(ns, it.ID, true, bucket, &rec)
			return ItemResult{Code: CodeOK, Record: rec}
		case StateCommitted:
			return ItemResult{Code: CodeOK, Record: rec} // a retried commit
		}
		return lost(rec, found, it, now)
	case OpRenew:
		if !live || rec.State != StateLeased || !holds(&rec, it) {
			return lost(rec, found, it, now)
		}
		lease := op.DurationMs
		if lease == 0 {
			lease = ns.DefaultLeaseMs
		}
		rec.ExpiresMs = now + lease
		a.write(ns, it.ID, true, bucket, &rec)
		return ItemResult{Code: CodeOK, Record: rec}
	case OpRelease:
		if !found || !holds(&rec, it) || rec.ExpiresMs <= now {
			return lost(rec, found, it, now)
		}
		switch rec.State {
		case StateLeased:
			rec.State = StateReleased
			a.write(ns, it.ID, true, bucket, &rec)
			return ItemResult{Code: CodeOK}
		case StateReleased:
			return ItemResult{Code: CodeOK} // a retried release
		}
		return lost(rec, found, it, now)
	case OpForget:
		if found {
			a.remove(ns, it.ID, bucket)
		}
		return ItemResult{Code: CodeOK}
	}
	panic("unreachable: op kind checked by Validate")
}

// holds reports whether lease item it names the lease rec records: its
// fencing token, and the request token of the claim that granted it. An
// item without a token is checked by its fence alone: entries written
// before holders had to prove their claim (the edge now refuses such
// items), which must apply as they did then.
func holds(rec *Record, it *Item) bool {
	return rec.Fence == it.Fence && (len(it.Token) == 0 || string(it.Token) == string(rec.Token))
}

// lost is the CodeLeaseLost answer for lease item it on the record rec
// (found: it exists) at now: the live record as details, and why, checked
// in this order (the first that holds is the most useful to the holder):
// no record; a live committed one (the work is done: do not redo it);
// another lease (fencing token or claim's request token); released (by
// this lease's holder); expired.
func lost(rec Record, found bool, it *Item, now int64) ItemResult {
	live := found && rec.live(now)
	res := ItemResult{Code: CodeLeaseLost}
	if live {
		res.Record = rec
	}
	switch {
	case !found:
		res.Reason = LostNotClaimed
	case rec.State == StateCommitted && rec.ExpiresMs > now:
		res.Reason = LostAlreadyCommitted
	case !holds(&rec, it):
		res.Reason = LostTokenMismatch
	case rec.State == StateReleased:
		res.Reason = LostNotClaimed
	default: // the holder's own lease or committed record, expired
		res.Reason = LostExpired
	}
	return res
}

// lookup finds the stored record of id in ns, if any (live or not); see
// FSM.lookupLocked. A record read from the database is cloned.
func (a *applier) lookup(ns *NamespaceConfig, id, hkey []byte) (Record, uint64, bool) {
	a.sc.loc = storage.LegacyLoc
	rec, bucket, found, fromDB, err := a.f.lookupLocked(ns, id, hkey, &a.sc)
	must(err)
	if found && fromDB {
		rec = rec.clone()
	}
	return rec, bucket, found
}

// write stores rec for id, moving it out of oldBucket if it lived there:
// a record that stays in its bucket keeps its key (a.sc.loc, where lookup
// found it); a new or moved one goes to its bucket's current window.
// REQUIRES: id is the current item's (a.hbuf and a.sc.probe are its, and
// lookup was its last).
// The overlay copies rec's byte slices (they alias the command).
func (a *applier) write(ns *NamespaceConfig, id []byte, had bool, oldBucket uint64, rec *Record) {
	nb := uint64(rec.ExpiresMs / ns.BucketWidthMs)
	loc := a.sc.loc
	if had && oldBucket != nb {
		a.deleteKey(ns, id, oldBucket, loc)
	}
	if !had || oldBucket != nb {
		loc = a.addToBucket(ns.ID, nb)
		a.f.filters.AddProbe(bloom.Key{Namespace: ns.ID, Bucket: nb}, &a.sc.probe)
	}
	// The record goes to the batch at commit (appendRecords), from the
	// overlay: only its last version, in key order.
	a.ov.put(a.hbuf, ovEntry{rec: *rec, bucket: nb, loc: loc, present: true})
}

// remove deletes id's record. REQUIRES: id is the current item's, and
// lookup found it.
func (a *applier) remove(ns *NamespaceConfig, id []byte, bucket uint64) {
	a.deleteKey(ns, id, bucket, a.sc.loc)
	a.ov.put(a.hbuf, ovEntry{})
}

func (a *applier) deleteKey(ns *NamespaceConfig, id []byte, bucket uint64, loc storage.Loc) {
	a.foldHot()
	a.kbuf = storage.AppendRecordKey(a.kbuf[:0], ns.ID, bucket, loc, id)
	must(a.b.Delete(a.kbuf, nil))
	k := bloom.Key{Namespace: ns.ID, Bucket: bucket}
	if e, ok := a.f.st.registry[k]; ok && e.count > 0 {
		e.count--
		a.f.st.registry[k] = e
		a.dirty[k] = struct{}{}
	}
}

// addToBucket counts a new record in (nsID, bucket) and returns its key's
// place there: the bucket's current window.
func (a *applier) addToBucket(nsID uint32, bucket uint64) storage.Loc {
	k := bloom.Key{Namespace: nsID, Bucket: bucket}
	if a.hotSet && a.hot == k {
		loc := storage.WindowLoc(uint32((a.hotInserts + a.hotN) >> a.hotShift))
		a.hotN++
		return loc
	}
	a.foldHot()
	st := &a.f.st
	e, ok := st.registry[k]
	if !ok {
		bs := st.buckets[nsID]
		i, _ := slices.BinarySearch(bs, bucket)
		st.buckets[nsID] = slices.Insert(bs, i, bucket)
		e = bucketEntry{shift: a.f.windowShift}
		st.registry[k] = e
	}
	a.hot, a.hotN, a.hotSet = k, 1, true
	a.hotInserts, a.hotShift = e.inserts, e.shift
	return e.nextLoc()
}

// foldHot adds the pending records of the hot bucket to its registry
// entry.
func (a *applier) foldHot() {
	if !a.hotSet {
		return
	}
	if e, ok := a.f.st.registry[a.hot]; ok && a.hotN > 0 {
		e.count += a.hotN
		e.inserts += a.hotN
		a.f.st.registry[a.hot] = e
		a.dirty[a.hot] = struct{}{}
	}
	a.hot, a.hotN, a.hotSet = bloom.Key{}, 0, false
}

// flushCounts writes the registry entries of buckets touched in this batch.
func (a *applier) flushCounts() {
	for k := range a.dirty {
		e, ok := a.f.st.registry[k]
		if !ok {
			continue // dropped in this batch
		}
		must(a.b.Set(storage.BucketKey(k.Namespace, k.Bucket), appendBucketEntry(nil, e), nil))
	}
}

// dropExpired deletes every bucket whose whole time span has passed: one
// range deletion each, O(buckets) regardless of how many IDs they hold.
func (a *applier) dropExpired() {
	st := &a.f.st
	for nsID, bs := range st.buckets {
		ns := st.nsByID[nsID]
		n := 0
		for n < len(bs) && int64(bs[n]+1)*ns.BucketWidthMs <= a.now {
			a.dropBucket(nsID, bs[n])
			n++
		}
		if n > 0 {
			st.buckets[nsID] = slices.Delete(bs, 0, n)
			if len(st.buckets[nsID]) == 0 {
				delete(st.buckets, nsID)
			}
		}
	}
}

func (a *applier) dropBucket(nsID uint32, bucket uint64) {
	a.foldHot()
	k := bloom.Key{Namespace: nsID, Bucket: bucket}
	all := storage.BucketRanges(nsID, bucket) // legacy, then windowed
	ranges := all[:]
	if !a.f.st.registry[k].legacy {
		ranges = all[1:] // no legacy key was ever written in this bucket
	}
	for _, r := range ranges {
		must(a.b.DeleteRange(r.Start, r.End, nil))
		a.dropped = append(a.dropped, keyRange{r.Start, r.End})
	}
	must(a.b.Delete(storage.BucketKey(nsID, bucket), nil))
	delete(a.f.st.registry, k)
	delete(a.dirty, k)
	a.f.filters.Drop(k)
}

// raiseFenceEpoch sets the fencing epoch to max(current, epoch).
func (a *applier) raiseFenceEpoch(epoch uint64) OpResult {
	st := &a.f.st
	if epoch > MaxFenceEpoch {
		return OpResult{Err: fmt.Errorf("%w: epoch %d exceeds %d", ErrFenceRange, epoch, MaxFenceEpoch), FenceEpoch: st.fenceEpoch}
	}
	if epoch > st.fenceEpoch {
		st.fenceEpoch = epoch
		must(a.b.Set(storage.MetaKey(metaFenceEpoch), encodeUvarint(epoch), nil))
	}
	return OpResult{FenceEpoch: st.fenceEpoch}
}

func (a *applier) createNamespace(cfg NamespaceConfig) OpResult {
	st := &a.f.st
	if err := ValidateNamespaceConfig(&cfg); err != nil {
		return OpResult{Err: err}
	}
	if cur := st.namespaces[cfg.Name]; cur != nil {
		return OpResult{Err: &NamespaceError{Name: cfg.Name, Err: ErrNamespaceExists}, Namespace: *cur}
	}
	cfg.ID = st.nsSeq
	st.nsSeq++
	a.putNamespace(&cfg)
	must(a.b.Set(storage.MetaKey(metaNsSeq), encodeUvarint(uint64(st.nsSeq)), nil))
	return OpResult{Namespace: cfg}
}

func (a *applier) updateNamespace(upd NamespaceConfig) OpResult {
	cur := a.f.st.namespaces[upd.Name]
	if cur == nil {
		return OpResult{Err: &NamespaceError{Name: upd.Name, Err: ErrNamespaceNotFound}}
	}
	merged := MergeNamespaceUpdate(*cur, upd)
	if err := ValidateNamespaceConfig(&merged); err != nil {
		return OpResult{Err: err}
	}
	a.putNamespace(&merged)
	return OpResult{Namespace: merged}
}

func (a *applier) putNamespace(ns *NamespaceConfig) {
	st := &a.f.st
	c := *ns
	st.namespaces[c.Name] = &c
	st.nsByID[c.ID] = &c
	must(a.b.Set(storage.NamespaceKey(c.Name), encodeNamespace(&c), nil))
}

func (a *applier) deleteNamespace(name string) OpResult {
	st := &a.f.st
	if name == DefaultNamespace || name == "" {
		return OpResult{Err: invalid("name", "the default namespace cannot be deleted")}
	}
	ns := st.namespaces[name]
	if ns == nil {
		return OpResult{Err: &NamespaceError{Name: name, Err: ErrNamespaceNotFound}}
	}
	a.foldHot()
	ranges := storage.NamespaceRecordRanges(ns.ID)
	for _, r := range ranges {
		must(a.b.DeleteRange(r.Start, r.End, nil))
		a.dropped = append(a.dropped, keyRange{r.Start, r.End})
	}
	for _, b := range st.buckets[ns.ID] {
		must(a.b.Delete(storage.BucketKey(ns.ID, b), nil))
		k := bloom.Key{Namespace: ns.ID, Bucket: b}
		delete(st.registry, k)
		delete(a.dirty, k)
	}
	delete(st.buckets, ns.ID)
	a.f.filters.DropNamespace(ns.ID)
	// Buffered records of the namespace are unreachable: a namespace
	// created later gets a new ID.
	must(a.b.Delete(storage.NamespaceKey(name), nil))
	delete(st.namespaces, name)
	delete(st.nsByID, ns.ID)
	return OpResult{Namespace: *ns}
}
