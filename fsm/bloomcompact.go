package fsm

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// bloomCompactEvery is how often the background goroutine asks the Bloom
// filters which chains are worth compacting.
const bloomCompactEvery = 2 * time.Second

// bloomQuietFor is how long a bucket must receive no ID before it counts as
// no longer growing, and its chain is compacted to the size it reached. A
// compaction re-reads every record of the bucket (≈ 1 µs per record on 2
// cores with 16 L0 sublevels), so a pause in the load of one poll interval
// should not trigger one: bursts a few seconds apart made each pause a
// rescan of the whole growing bucket (measured: 21–26% of three nodes'
// CPU in the 10 s after a write load stopped). A bucket whose span has
// passed keeps its extra filter bits this much longer.
const bloomQuietFor = 30 * time.Second

// bloomQuietPolls is bloomQuietFor in polls of the compactor. Tests that
// drive compactFilters themselves (a negative interval) take one poll
// without IDs as quiet.
func (f *FSM) bloomQuietPolls() int {
	every := f.cfg.BloomCompactInterval
	if every < 0 {
		return 1
	}
	if every == 0 {
		every = bloomCompactEvery
	}
	return int((bloomQuietFor + every - 1) / every)
}

// bloomCompactor polls compactFilters until ctx ends (every
// Config.BloomCompactInterval; never when it is negative).
func (bg *background) bloomCompactor(ctx context.Context, f *FSM) {
	defer bg.wg.Done()
	every := f.cfg.BloomCompactInterval
	if every < 0 {
		<-ctx.Done()
		return
	}
	if every == 0 {
		every = bloomCompactEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := f.compactFilters(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("bloom compaction failed; the chain keeps its filters", "err", err)
			}
		}
	}
}

// compactFilters rebuilds every chain bloom.CompactionCandidates names (a
// bucket's chain of growing filters, or a filter sized for more IDs than
// arrived) into one filter sized for the bucket's live records, read from
// the chain's hash log or else from a Pebble snapshot. Runs on the
// background goroutine (stopped before the database is closed or swapped).
func (f *FSM) compactFilters(ctx context.Context) error {
	f.mu.RLock()
	keys := f.filters.CompactionCandidates(func(k bloom.Key) (uint, bool) {
		e, ok := f.st.registry[k]
		return uint(e.count), ok
	}, f.bloomQuietPolls(), nil)
	f.mu.RUnlock()
	for _, k := range keys {
		if err := f.compactChain(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

func (f *FSM) compactChain(ctx context.Context, k bloom.Key) error {
	// Begin and snapshot under f.mu: apply holds it exclusively while it
	// adds IDs to the filters and writes them, so every record is in the
	// snapshot, in the write buffer (added here), or added after
	// BeginCompact (and so OR-ed in by Finish): no false negative.
	f.mu.RLock()
	e, live := f.st.registry[k]
	var cp *bloom.Compaction
	if live {
		cp = f.filters.BeginCompact(k, uint(e.count))
	}
	if cp == nil {
		f.mu.RUnlock()
		return nil
	}
	if cp.HasLog() {
		// The chain logged the hash of every ID it was given: no storage
		// read, and no need to hold f.mu for the replay (the log's view
		// was taken under the filters' lock; later adds reach the pending
		// filter), which would stall every apply for as long as it runs
		// (≈ 30 ms per million hashes).
		f.mu.RUnlock()
		if f.beforeLogReplay != nil {
			f.beforeLogReplay()
		}
		cp.FromLog()
		cp.Finish()
		return nil
	}
	add := func(hkey []byte, e *ovEntry) {
		// hkey is HashKey(nsID, id): the namespace ID comes first.
		if e.present && e.bucket == k.Bucket && binary.BigEndian.Uint32(hkey) == k.Namespace {
			cp.Add(hkey)
		}
	}
	f.applier.ov.each(add)
	if f.flushing != nil { // its batch may not be in the snapshot yet
		f.flushing.ov.each(add)
	}
	snap := f.db.NewSnapshot()
	f.mu.RUnlock()
	defer snap.Close()
	var hkey []byte
	i := 0
	for _, r := range storage.BucketRanges(k.Namespace, k.Bucket) {
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: r.Start, UpperBound: r.End})
		if err != nil {
			cp.Abort()
			return err
		}
		for it.First(); it.Valid(); it.Next() {
			if i++; i%4096 == 0 && ctx.Err() != nil {
				break
			}
			if _, _, _, id, ok := storage.ParseRecordKey(it.Key()); ok {
				hkey = bloom.HashKey(hkey[:0], k.Namespace, id)
				cp.Add(hkey)
			}
		}
		if err := errors.Join(ctx.Err(), it.Error(), it.Close()); err != nil {
			cp.Abort()
			return err
		}
	}
	cp.Finish()
	return nil
}
