package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// Defaults of the Raft log cache (Config.LogCacheEntries, LogCacheBytes).
const (
	defaultLogCacheEntries = 512
	defaultLogCacheBytes   = 32 << 20
)

// logCacheOverhead is what one cached entry costs besides its data (the
// raft.Log value and the ring slot), counted against the byte bound.
const logCacheOverhead = 128

// logCache is a raft.LogStore that keeps the most recently stored entries
// in memory, as raft.LogCache does, so the leader's replication and a
// follower's apply read them without going to bbolt. It differs in two
// ways, both about memory:
//
//   - It holds at most maxBytes of entry data, not only a count of entries.
//     Group commit puts up to MaxGroupItems IDs (MaxGroupBytes, 8 MiB) in
//     one entry, so 512 entries of a bulk load can be hundreds of MiB.
//   - It keeps its own copy of each raft.Log value. On the leader raft
//     hands StoreLogs pointers into its apply futures (&logFuture.log), so
//     raft.LogCache kept every cached entry's future alive, and with it
//     the FSM's response (one fsm.ItemResult of ~90 B per ID) long after
//     the caller was answered.
//
// The cached entries are one contiguous range of indexes [first, last]; the
// newest entry is always cached, even when larger than maxBytes alone.
type logCache struct {
	store    raft.LogStore
	maxBytes int

	mu    sync.RWMutex
	ring  []raft.Log // entry i lives at ring[i%len(ring)] while first <= i <= last
	first uint64     // 0 when empty
	last  uint64
	bytes int
}

var _ raft.LogStore = (*logCache)(nil)
var _ raft.MonotonicLogStore = (*logCache)(nil)

func newLogCache(store raft.LogStore, entries, maxBytes int) *logCache {
	return &logCache{store: store, maxBytes: maxBytes, ring: make([]raft.Log, max(entries, 1))}
}

// logSize counts capacity, not length: the leader's entry buffer grew by
// append and its spare capacity stays allocated while the entry is cached.
func logSize(l *raft.Log) int { return logCacheOverhead + cap(l.Data) + cap(l.Extensions) }

// IsMonotonic passes the store's answer through (raft.LogCache does too).
func (c *logCache) IsMonotonic() bool {
	m, ok := c.store.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (c *logCache) GetLog(idx uint64, log *raft.Log) error {
	c.mu.RLock()
	if c.first != 0 && idx >= c.first && idx <= c.last {
		*log = c.ring[idx%uint64(len(c.ring))]
		c.mu.RUnlock()
		return nil
	}
	c.mu.RUnlock()
	return c.store.GetLog(idx, log)
}

func (c *logCache) StoreLog(log *raft.Log) error { return c.StoreLogs([]*raft.Log{log}) }

func (c *logCache) StoreLogs(logs []*raft.Log) error {
	if err := c.store.StoreLogs(logs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		if c.first != 0 && l.Index != c.last+1 {
			c.resetLocked() // not contiguous (raft never does this): start over
		}
		if c.first != 0 && l.Index-c.first >= uint64(len(c.ring)) {
			c.evictFirstLocked() // frees l's slot
		}
		if c.first == 0 {
			c.first = l.Index
		}
		c.last = l.Index
		c.ring[l.Index%uint64(len(c.ring))] = *l // a copy: see the type's comment
		c.bytes += logSize(l)
		for c.first < c.last && c.bytes > c.maxBytes {
			c.evictFirstLocked()
		}
	}
	return nil
}

func (c *logCache) evictFirstLocked() {
	slot := &c.ring[c.first%uint64(len(c.ring))]
	c.bytes -= logSize(slot)
	*slot = raft.Log{}
	if c.first == c.last {
		c.first, c.last = 0, 0
		return
	}
	c.first++
}

func (c *logCache) resetLocked() {
	clear(c.ring)
	c.first, c.last, c.bytes = 0, 0, 0
}

func (c *logCache) FirstIndex() (uint64, error) { return c.store.FirstIndex() }
func (c *logCache) LastIndex() (uint64, error)  { return c.store.LastIndex() }

// DeleteRange drops [min, max] from the store and the cache. Raft deletes
// either a prefix (compaction behind a snapshot) or a suffix (a follower's
// conflicting entries); a prefix keeps the cached entries after it.
func (c *logCache) DeleteRange(min, max uint64) error {
	c.mu.Lock()
	switch {
	case c.first == 0 || max < c.first || min > c.last:
	case min <= c.first && max < c.last:
		for c.first != 0 && c.first <= max {
			c.evictFirstLocked()
		}
	default:
		c.resetLocked()
	}
	c.mu.Unlock()
	return c.store.DeleteRange(min, max)
}

// cached reports the cached range and its bytes (tests, metrics).
func (c *logCache) cached() (first, last uint64, bytes int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.first, c.last, c.bytes
}
