package fsm

import (
	"context"
	"errors"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// background runs the work tied to one open database: the Bloom filter
// rebuild at open/restore, compaction of Bloom filter chains
// (bloomcompact.go), and compactions of dropped bucket ranges so range
// deletions turn into free disk space.
type background struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	compactCh chan []keyRange
	once      sync.Once
}

// startBackground starts the compactor and, unless the filters are already
// ready (loaded from a file that matches the database), rebuilds them from a
// snapshot of the database. REQUIRES: f.mu held or exclusive access, and
// f.db open.
func startBackground(f *FSM) *background {
	ctx, cancel := context.WithCancel(context.Background())
	bg := &background{cancel: cancel, compactCh: make(chan []keyRange, 64)}
	bg.wg.Add(2)
	go bg.compactor(ctx, f, f.db)
	go bg.bloomCompactor(ctx, f)
	if f.filters.Ready() {
		return bg
	}
	// Reset and snapshot together, under the caller's exclusion: entries
	// applied after this point add to the new filters themselves.
	f.filters.Reset()
	snap := f.db.NewSnapshot()
	bg.wg.Add(1)
	go func() {
		defer bg.wg.Done()
		defer snap.Close()
		if err := f.rebuildFilters(ctx, snap); err != nil {
			if ctx.Err() == nil {
				f.log.Error("bloom rebuild failed; reads keep going to storage", "err", err)
			}
			return
		}
		f.filters.SetReady(true)
	}()
	return bg
}

// compactor compacts dropped ranges of db, which outlives it (the
// background is stopped before db is closed or swapped).
func (bg *background) compactor(ctx context.Context, f *FSM, db *storage.DB) {
	defer bg.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case rs := <-bg.compactCh:
			for _, r := range rs {
				if err := db.Compact(ctx, r.start, r.end, false); err != nil && ctx.Err() == nil {
					f.log.Warn("compaction of dropped range failed", "err", err)
				}
			}
		}
	}
}

// compact queues ranges for compaction without blocking apply; if the queue
// is full the ranges are left to Pebble's automatic compactions.
func (bg *background) compact(rs []keyRange) {
	select {
	case bg.compactCh <- rs:
	default:
	}
}

func (bg *background) stop() {
	bg.once.Do(func() {
		bg.cancel()
		bg.wg.Wait()
	})
}

// rebuildFilters adds every record in snap to the filters, in chunks that
// take f.mu shared (lock order: f.mu, then the filters' own lock).
func (f *FSM) rebuildFilters(ctx context.Context, snap *pebble.Snapshot) error {
	for _, r := range storage.RecordRanges() {
		if err := f.rebuildFiltersFrom(ctx, snap, r); err != nil {
			return err
		}
	}
	return nil
}

// rebuildFiltersFrom adds the records of one key range of snap.
func (f *FSM) rebuildFiltersFrom(ctx context.Context, snap *pebble.Snapshot, r storage.KeyRange) error {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: r.Start, UpperBound: r.End})
	if err != nil {
		return err
	}
	var hkey []byte
	live := func(k bloom.Key) bool { _, ok := f.st.registry[k]; return ok }
	// Each chain's first filter is sized for its bucket's record count, so
	// a rebuilt bucket has one filter, not a chain of doublings.
	size := func(k bloom.Key) uint { return uint(f.st.registry[k].count) }
	it.First()
	for it.Valid() && ctx.Err() == nil {
		f.mu.RLock()
		for i := 0; i < 4096 && it.Valid(); i++ {
			if nsID, b, _, id, ok := storage.ParseRecordKey(it.Key()); ok {
				hkey = bloom.HashKey(hkey[:0], nsID, id)
				k := bloom.Key{Namespace: nsID, Bucket: b}
				f.filters.AddIfLive(k, hkey, size(k), live)
			}
			it.Next()
		}
		f.mu.RUnlock()
	}
	return errors.Join(ctx.Err(), it.Error(), it.Close())
}
