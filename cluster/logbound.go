package cluster

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// DefaultMaxLogBytes is Config.MaxLogBytes's default.
const DefaultMaxLogBytes = 256 << 20

// logEntryOverhead is what one entry costs in the log store besides its
// data and extensions: raft-wal's frame header, padding and index slot, the
// varint index, term and type, and the append time.
const logEntryOverhead = 48

// entryBytes is the size one entry is counted at against MaxLogBytes.
func entryBytes(l *raft.Log) uint64 {
	return uint64(len(l.Data)+len(l.Extensions)) + logEntryOverhead
}

// logSizes is a raft.LogStore that keeps the size of every entry of the
// log, so that the log can be bounded in bytes (Node.runLogBound):
// hashicorp/raft counts it in entries only (TrailingLogs,
// SnapshotThreshold), and group commit puts from one ID to MaxGroupItems
// in an entry. It costs 8 bytes per entry of the log.
type logSizes struct {
	raft.LogStore

	mu sync.Mutex
	// The log holds entries first..first+len(cum)-1 (none when cum is
	// empty); cum[i] is the bytes of every entry stored up to first+i,
	// counted from an arbitrary origin, and base the count before first.
	first uint64
	cum   []uint64
	base  uint64
}

var (
	_ raft.LogStore          = (*logSizes)(nil)
	_ raft.MonotonicLogStore = (*logSizes)(nil)
)

// newLogSizes wraps store and measures the entries it already holds by
// reading each once.
func newLogSizes(store raft.LogStore) (*logSizes, error) {
	s := &logSizes{LogStore: store}
	first, err := store.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("read raft log first index: %w", err)
	}
	last, err := store.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read raft log last index: %w", err)
	}
	if first == 0 || last < first {
		return s, nil
	}
	s.cum = make([]uint64, 0, last-first+1)
	s.first = first
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := store.GetLog(i, &l); err != nil {
			return nil, fmt.Errorf("read raft log entry %d of %d..%d to measure the log: %w", i, first, last, err)
		}
		s.appendLocked(entryBytes(&l))
	}
	return s, nil
}

// IsMonotonic passes the store's answer through.
func (s *logSizes) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (s *logSizes) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *logSizes) StoreLogs(logs []*raft.Log) error {
	if err := s.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range logs {
		next := s.first + uint64(len(s.cum))
		switch {
		case len(s.cum) == 0 || l.Index > next:
			// A first entry, or one after a gap (raft never leaves one; a
			// snapshot install empties the log first): start over.
			s.first, s.cum, s.base = l.Index, s.cum[:0], 0
		case l.Index < next:
			// An overwrite of a suffix (raft deletes it first).
			s.truncateLocked(l.Index)
		}
		s.appendLocked(entryBytes(l))
	}
	return nil
}

func (s *logSizes) appendLocked(n uint64) {
	top := s.base
	if len(s.cum) > 0 {
		top = s.cum[len(s.cum)-1]
	}
	s.cum = append(s.cum, top+n)
}

// truncateLocked drops the entries from index idx on.
func (s *logSizes) truncateLocked(idx uint64) {
	if idx <= s.first {
		s.cum = s.cum[:0]
		return
	}
	if k := idx - s.first; k < uint64(len(s.cum)) {
		s.cum = s.cum[:k]
	}
}

// DeleteRange deletes [lo, hi] from the store, then from the sizes: a
// prefix (compaction behind a snapshot), a suffix (a follower's conflicting
// entries) or everything (after a snapshot install).
func (s *logSizes) DeleteRange(lo, hi uint64) error {
	if err := s.LogStore.DeleteRange(lo, hi); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := uint64(len(s.cum))
	switch {
	case n == 0 || hi < s.first || lo > s.first+n-1:
	case lo <= s.first && hi >= s.first+n-1:
		s.cum = s.cum[:0]
	case lo <= s.first:
		k := hi - s.first + 1
		s.base = s.cum[k-1]
		s.cum = s.cum[k:]
		s.first = hi + 1
		if cap(s.cum) > 1024 && len(s.cum) < cap(s.cum)/4 {
			s.cum = append(make([]uint64, 0, 2*len(s.cum)), s.cum...)
		}
	default:
		s.truncateLocked(lo)
	}
	return nil
}

// logExtent is what the log holds: its first and last index (both 0 when
// empty) and the bytes of its entries.
type logExtent struct {
	First, Last, Bytes uint64
}

// extent returns what the log holds now.
func (s *logSizes) extent() logExtent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cum) == 0 {
		return logExtent{}
	}
	return logExtent{First: s.first, Last: s.first + uint64(len(s.cum)) - 1, Bytes: s.cum[len(s.cum)-1] - s.base}
}

// bytesThrough returns the bytes of the entries up to index idx.
func (s *logSizes) bytesThrough(idx uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cum) == 0 || idx < s.first {
		return 0
	}
	k := min(idx-s.first, uint64(len(s.cum))-1)
	return s.cum[k] - s.base
}

// newestWithin returns how many of the newest entries fit in budget bytes.
func (s *logSizes) newestWithin(budget uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.cum)
	if n == 0 {
		return 0
	}
	top := s.cum[n-1]
	// The first j whose entries j..n-1 fit: the bytes before j are at
	// least top-budget.
	j := sort.Search(n, func(j int) bool {
		before := s.base
		if j > 0 {
			before = s.cum[j-1]
		}
		return before+budget >= top
	})
	return uint64(n - j)
}

// logPlan is what runLogBound decides from the log's sizes: how many
// entries raft keeps behind a snapshot, and whether to take one now.
type logPlan struct {
	// Step is how much log a snapshot must let raft drop before one is
	// taken: MaxLogBytes/16, or a quarter of the latest snapshot's size
	// when larger. A snapshot writes the whole store, so snapshots write
	// at most about four bytes per byte of log they truncate, and a small
	// store does not snapshot for every few entries.
	Step uint64
	// Keep is what raft may keep behind a snapshot: MaxLogBytes less a
	// step, at least MaxLogBytes/2.
	Keep uint64
	// Trailing is raft's TrailingLogs: Config.TrailingLogs, or fewer when
	// that many of the newest entries exceed Keep.
	Trailing uint64
	// Snapshot: a snapshot at the applied index would let raft drop at
	// least Step bytes.
	Snapshot bool
}

// planLog decides for a log bound of maxBytes, given the sizes, raft's
// configured trailing entries, the latest snapshot (index and size, 0 when
// none) and the FSM's applied index. Raft's compaction after a snapshot
// at index S keeps the entries after min(S, last-TrailingLogs); the log
// thus holds at most Keep bytes behind the last snapshot and Step more
// before the next, plus what is appended while a snapshot is taken: at
// most maxBytes, or maxBytes/2 and a quarter of a snapshot when that is
// more (a store over twice the bound).
func planLog(s *logSizes, maxBytes, trailing, snapIndex, snapSize, applied uint64) logPlan {
	p := logPlan{Step: max(maxBytes/16, snapSize/4), Trailing: trailing}
	p.Keep = maxBytes - min(p.Step, maxBytes/2)
	ext := s.extent()
	if fit := s.newestWithin(p.Keep); ext.Last != 0 && fit < ext.Last-ext.First+1 {
		// Only a log that does not fit is held to what fits: raft
		// counts TrailingLogs back from the last entry it holds when it
		// truncates, later than now.
		p.Trailing = min(trailing, fit)
	}
	if ext.Last == 0 || applied <= snapIndex {
		return p
	}
	// Raft truncates through min(new snapshot index, last-trailing).
	if ext.Last <= p.Trailing {
		return p
	}
	through := min(applied, ext.Last-p.Trailing)
	p.Snapshot = s.bytesThrough(through) >= p.Step
	return p
}

// runLogBound keeps the Raft log within Config.MaxLogBytes: every
// TickInterval it lowers raft's TrailingLogs to the newest entries that
// fit in Keep, and takes a snapshot once one would let raft drop Step
// bytes of log (logPlan). Raft's own snapshots (SnapshotThreshold entries, checked
// every SnapshotInterval) still happen; both truncate the log behind them.
func (n *Node) runLogBound() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.TickInterval)
	defer t.Stop()
	var failedAt uint64 // applied index of the last failed snapshot
	for {
		select {
		case <-t.C:
		case <-n.stop:
			return
		}
		var snapIndex, snapSize uint64
		if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
			snapIndex, snapSize = metas[0].Index, uint64(max(metas[0].Size, 0))
		}
		applied := n.fsm.AppliedIndex()
		p := planLog(n.sizes, n.cfg.MaxLogBytes, n.trailingLogs, snapIndex, snapSize, applied)
		n.setTrailingLogs(p.Trailing)
		if !p.Snapshot || applied == failedAt {
			continue
		}
		// Snapshot blocks until the snapshot is written and the log
		// truncated; raft takes one snapshot at a time.
		err := n.raft.Snapshot().Error()
		switch {
		case err == nil, errors.Is(err, raft.ErrNothingNewToSnapshot):
			failedAt = 0
		case errors.Is(err, raft.ErrRaftShutdown):
			return
		default:
			failedAt = applied
			n.log.Warn("snapshot to bound the raft log failed; trying again once more entries are applied", "err", err,
				"log_bytes", n.sizes.extent().Bytes, "max_log_bytes", n.cfg.MaxLogBytes)
		}
	}
}

// setTrailingLogs sets raft's TrailingLogs, unless it already has that
// value.
func (n *Node) setTrailingLogs(v uint64) {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	rc := n.raft.ReloadableConfig()
	if rc.TrailingLogs == v {
		return
	}
	rc.TrailingLogs = v
	if err := n.raft.ReloadConfig(rc); err != nil {
		n.log.Warn("could not lower raft's trailing logs to bound the log in bytes", "trailing_logs", v, "err", err)
	}
}
