package fsm

import (
	"context"
	"fmt"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// lookupScratch holds the buffers one lookup goroutine reuses.
type lookupScratch struct {
	probe bloom.Probe
	cands []uint64
	kbuf  []byte
	vbuf  []byte
	// reader, when set, reads stored records through one iterator from
	// lookup to lookup: the applier's, released when a committed buffer
	// leaves the overlays (retireLocked) and at the end of every
	// ApplyBatch. Lookups without one open an iterator each (a Check
	// releases mu between its IDs, and a Restore may close the database
	// meanwhile).
	reader *storage.RecordReader
	// loc is where the record the last lookup found is keyed in its
	// bucket (a write of it in the same bucket keeps the key).
	loc storage.Loc
}

// lookupLocked finds the record of id in ns (hkey = HashKey(ns.ID, id)):
// first in the write buffer's overlay, then in the overlay of the buffer
// being committed (flush.go), whose entries shadow the database
// (a buffered removal hides the stored record, which the pending batch
// deletes), then in the database (lookupStored). fromDB tells which: a
// stored record aliases sc.vbuf; a buffered one aliases the overlay's
// arena, never reused. REQUIRES: f.mu held (shared or exclusive) and
// sc.probe Reset to hkey.
//
// The Bloom filters are asked first: every record written, buffered or
// not, was added to its bucket's chain by the apply that wrote it (under
// f.mu), so when they are ready and no bucket may hold the ID it is in
// neither overlay nor the database, and the overlays' map lookups (a
// hash and a cache miss each) are skipped for the IDs most lookups are
// about: new ones in marks, absent ones in checks.
func (f *FSM) lookupLocked(ns *NamespaceConfig, id, hkey []byte, sc *lookupScratch) (rec Record, bucket uint64, found, fromDB bool, err error) {
	cands, ready := f.filters.Candidates(ns.ID, &sc.probe, sc.cands[:0])
	sc.cands = cands
	if ready && len(cands) == 0 {
		f.filters.Observe(false, false)
		return Record{}, 0, false, false, nil
	}
	e, ok := f.applier.ov.get(hkey)
	if !ok && f.flushing != nil {
		e, ok = f.flushing.ov.get(hkey)
	}
	if ok {
		if !e.present {
			return Record{}, 0, false, false, nil
		}
		// An expiry drop after the write may have deleted the record's
		// bucket (the pending batch holds the range deletion): then the
		// record is gone. A dropped bucket never comes back: every write
		// expires after the apply's time, so into a later bucket.
		if _, live := f.st.registry[bloom.Key{Namespace: ns.ID, Bucket: e.bucket}]; live {
			sc.loc = e.loc
			return e.rec, e.bucket, true, false, nil
		}
		return Record{}, 0, false, false, nil
	}
	rec, bucket, found, err = f.lookupStored(ns, id, sc, ready)
	return rec, bucket, found, true, err
}

// lookupStored finds the stored record of id in ns by probing the
// namespace's live buckets, newest first: when the filters are ready, only
// the buckets in sc.cands (those whose Bloom filter did not say
// "definitely not"). The returned record aliases sc.vbuf. REQUIRES: f.mu
// held (shared or exclusive).
//
// At most one record per ID exists across buckets: apply deletes the old
// key whenever it moves or replaces a record.
func (f *FSM) lookupStored(ns *NamespaceConfig, id []byte, sc *lookupScratch, ready bool) (Record, uint64, bool, error) {
	if !ready {
		// Filters rebuilding: every live bucket may hold the ID.
		bs := f.st.buckets[ns.ID]
		for i := len(bs) - 1; i >= 0; i-- {
			e, _ := f.bucketEntryLocked(bloom.Key{Namespace: ns.ID, Bucket: bs[i]})
			rec, found, err := f.getRecord(ns, bs[i], e, id, sc)
			if err != nil || found {
				return rec, bs[i], found, err
			}
		}
		return Record{}, 0, false, nil
	}
	for _, b := range sc.cands {
		e, live := f.bucketEntryLocked(bloom.Key{Namespace: ns.ID, Bucket: b})
		if !live {
			continue // chains are dropped with their buckets; never trust one that outlived it
		}
		rec, found, err := f.getRecord(ns, b, e, id, sc)
		if err != nil {
			return Record{}, 0, false, err
		}
		if found {
			f.filters.Observe(true, true)
			return rec, b, true, nil
		}
	}
	f.filters.Observe(len(sc.cands) > 0, false)
	return Record{}, 0, false, nil
}

// getRecord reads id's record in bucket b (registry entry e), trying each
// of its windows newest first (redeliveries are mostly of recent IDs),
// then its legacy key if the bucket may have one; it aliases sc.vbuf and
// sets sc.loc.
func (f *FSM) getRecord(ns *NamespaceConfig, b uint64, e bucketEntry, id []byte, sc *lookupScratch) (Record, bool, error) {
	r := sc.reader
	if r == nil {
		// One iterator for every window of this lookup.
		var own storage.RecordReader
		defer own.Release()
		r = &own
	}
	get := func(loc storage.Loc) (Record, bool, error) {
		sc.kbuf = storage.AppendRecordKey(sc.kbuf[:0], ns.ID, b, loc, id)
		v, found, err := r.Get(f.db, sc.kbuf, sc.vbuf[:0])
		sc.vbuf = v
		if err != nil {
			return Record{}, false, fmt.Errorf("get record: %w", err)
		}
		if !found {
			return Record{}, false, nil
		}
		sc.loc = loc
		rec, err := decodeRecord(v)
		return rec, err == nil, err
	}
	for w := e.windows(); w > 0; w-- {
		if rec, found, err := get(storage.WindowLoc(w - 1)); err != nil || found {
			return rec, found, err
		}
	}
	if e.legacy {
		return get(storage.LegacyLoc)
	}
	return Record{}, false, nil
}

// bucketEntryLocked is k's registry entry, with the records the applier
// has added to its hot bucket and not yet folded in, and whether the
// bucket is live. REQUIRES: f.mu held.
func (f *FSM) bucketEntryLocked(k bloom.Key) (bucketEntry, bool) {
	e, ok := f.st.registry[k]
	if a := f.applier; a.hotSet && a.hot == k {
		e.count += a.hotN
		e.inserts += a.hotN
	}
	return e, ok
}

// Check answers, for each id, whether it is recorded and live at nowMs in
// namespace nsName ("" = default): CodeSeen with its Record, or CodeNotSeen.
// It reads this replica only; the caller provides linearizability (read
// index) when asked for. Returns an error wrapping ErrNamespaceNotFound for
// an unknown namespace.
//
// The Bloom filters screen the whole batch first (bloom.Screen: one lock,
// overlapping cache misses); an ID they rule out is answered without
// taking mu, since every record of the namespace is in a chain before an
// apply releases mu. The others are looked up one by one under mu, with
// their candidate buckets computed again there: a record may have moved
// to another bucket since the screen.
func (f *FSM) Check(nsName string, ids [][]byte, nowMs int64) ([]ItemResult, error) {
	if nsName == "" {
		nsName = DefaultNamespace
	}
	f.mu.RLock()
	ns := f.st.namespaces[nsName]
	var nsID uint32
	if ns != nil {
		nsID = ns.ID
	}
	f.mu.RUnlock()
	if ns == nil {
		return nil, &NamespaceError{Name: nsName, Err: ErrNamespaceNotFound}
	}
	cs := f.checkScratch.Get().(*batchProbes)
	defer f.checkScratch.Put(cs)
	cs.reset(nsID, ids)
	if f.beforeScreen != nil {
		f.beforeScreen()
	}
	screened := f.filters.Screen(nsID, cs.probes, cs.maybe)
	if screened {
		// The screen counts only if the namespace lived through it: one
		// deleted just before has no chains left, which would rule out
		// every ID. Namespace IDs are never reused, so the same ID now
		// means it was never deleted in between.
		f.mu.RLock()
		cur := f.st.namespaces[nsName]
		f.mu.RUnlock()
		if cur == nil {
			return nil, &NamespaceError{Name: nsName, Err: ErrNamespaceNotFound}
		}
		screened = cur.ID == nsID
	}

	out := make([]ItemResult, len(ids))
	var sc lookupScratch
	ruledOut := 0
	for i, id := range ids {
		if screened && !cs.maybe[i] {
			out[i] = ItemResult{Code: CodeNotSeen}
			ruledOut++
			continue
		}
		f.mu.RLock()
		ns := f.st.namespaces[nsName]
		if ns == nil {
			f.mu.RUnlock()
			return nil, &NamespaceError{Name: nsName, Err: ErrNamespaceNotFound}
		}
		hkey := cs.hkey(i)
		if ns.ID == nsID {
			sc.probe = cs.probes[i]
		} else { // deleted and created again since the screen
			hkey = bloom.HashKey(nil, ns.ID, id)
			sc.probe.Reset(hkey)
		}
		rec, _, found, _, err := f.lookupLocked(ns, id, hkey, &sc)
		f.mu.RUnlock()
		if err != nil {
			return nil, err
		}
		if found && rec.live(max(nowMs, 0)) {
			out[i] = ItemResult{Code: CodeSeen, Record: rec.clone()}
		} else {
			out[i] = ItemResult{Code: CodeNotSeen}
		}
	}
	f.filters.ObserveNegatives(ruledOut)
	return out, nil
}

// ExpiredBuckets returns how many buckets have fully expired at nowMs but
// are not yet dropped; the leader then proposes an OpTick to drop them.
func (f *FSM) ExpiredBuckets(nowMs int64) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for nsID, bs := range f.st.buckets {
		w := f.st.nsByID[nsID].BucketWidthMs
		for _, b := range bs {
			if int64(b+1)*w > nowMs {
				break
			}
			n++
		}
	}
	return n
}

// Digest returns a SHA-256 over every key and value of the state (applied
// index included): replicas with equal digests hold identical state. It is
// DigestState's digest, without the index it covers.
func (f *FSM) Digest() ([]byte, error) {
	d, err := f.DigestState(context.Background())
	return d.Digest, err
}
