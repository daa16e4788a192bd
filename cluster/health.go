package cluster

import (
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/internal/diskspace"
	"github.com/dedupnode/dedupnode/storage"
)

// ErrLowDiskSpace is matched (errors.Is) by the error of a write refused
// because this node's data directory is short of free space (a
// *diskspace.LowSpaceError naming the path, the free bytes and the
// minimum). Nothing was proposed; the write succeeds once space is freed.
var ErrLowDiskSpace = diskspace.ErrLowSpace

// ErrEntryTooLarge is matched by *EntryTooLargeError.
var ErrEntryTooLarge = fmt.Errorf("request too large for one raft entry")

// EntryTooLargeError: a request's ops encode to more than MaxEntryBytes.
// Nothing was proposed; split the request.
type EntryTooLargeError struct {
	Bytes, Max int
}

func (e *EntryTooLargeError) Error() string {
	return fmt.Sprintf("%s: the request encodes to about %d bytes, above the limit of %d bytes (--max-entry-bytes); split it into smaller requests",
		ErrEntryTooLarge, e.Bytes, e.Max)
}

// Unwrap makes errors.Is(err, ErrEntryTooLarge) true.
func (e *EntryTooLargeError) Unwrap() error { return ErrEntryTooLarge }

// autoMinFreeBase is the fixed part of the automatic MinFreeDisk.
const autoMinFreeBase = 64 << 20

// DiskReserve is the free space the state machine needs to go on applying
// with Pebble memtables of memtable bytes (0: Pebble's default here): one
// new WAL file (Pebble preallocates 110% of a memtable), one flushed
// memtable (sstables are not compressed) and 4 MiB for manifests, the
// Raft stable store and the saved Bloom filters. Below it, applying pauses.
func DiskReserve(memtable uint64) uint64 {
	if memtable == 0 {
		memtable = storage.DefaultMemTableBytes
	}
	return memtable + memtable*11/10 + 4<<20
}

// MinFreeDiskFloor is the lowest MinFreeDisk that keeps a node with
// memtables of memtable bytes and the log store ls clear of a full disk:
// the apply reserve, plus one segment of the default size for wal (add the
// difference when Config.WALSegmentBytes is larger). Below MinFreeDisk a leader
// refuses client writes, but it still appends what it took before its next
// measurement and its own entries; when the segment in use fills, raft-wal
// creates the next one preallocated whole, and that needs the room.
func MinFreeDiskFloor(memtable uint64, ls LogStore) uint64 {
	floor := DiskReserve(memtable)
	if ls != LogStoreBoltDB {
		floor += defaultWALSegmentBytes
	}
	return floor
}

// diskFloor is MinFreeDiskFloor for this configuration: with wal, its
// segment size when larger than the default.
func (c Config) diskFloor() uint64 {
	floor := MinFreeDiskFloor(c.FSM.Storage.MemTableBytes, c.LogStore)
	if c.LogStore != LogStoreBoltDB && c.WALSegmentBytes > defaultWALSegmentBytes {
		floor += uint64(c.WALSegmentBytes - defaultWALSegmentBytes)
	}
	return floor
}

// AutoMinFreeDiskEmpty is the automatic MinFreeDisk of a node whose ID
// store is empty (it grows by twice the store): 64 MiB, and never less than
// twice the apply reserve.
func AutoMinFreeDiskEmpty(memtable uint64) uint64 {
	return max(autoMinFreeBase, 2*DiskReserve(memtable))
}

// OwnFootprint is the least a running node with memtables of memtable
// bytes and the log store ls occupies on its volume whatever it holds: one
// preallocated Pebble WAL file (110% of a memtable), 4 MiB of manifests and
// stable store, and with wal one preallocated Raft log segment. A volume
// can never have more free, with the node on it, than its capacity less
// this.
func OwnFootprint(memtable uint64, ls LogStore) uint64 {
	if memtable == 0 {
		memtable = storage.DefaultMemTableBytes
	}
	fp := memtable*11/10 + 4<<20
	if ls != LogStoreBoltDB {
		fp += defaultWALSegmentBytes
	}
	return fp
}

// startRoom refuses to start a node whose data dir has less free space
// than MinFreeDiskFloor (the apply reserve, plus one log segment with
// wal), returning a *diskspace.RoomError. Starting writes before the disk
// guard can pause anything: Pebble's open replays its WAL into a memtable,
// flushes it and writes a new MANIFEST, and a MANIFEST write that fails is
// fatal to Pebble (a panic, "MANIFEST flush failed"); raft-wal may create
// a segment, and hashicorp/raft panics when it cannot store a term or
// vote. Refusing before anything is opened leaves the data dir as it was:
// the committed entries it had not applied are still in its log and apply
// once the node starts with room.
func startRoom(cfg Config) error {
	reserve, need := DiskReserve(cfg.FSM.Storage.MemTableBytes), cfg.diskFloor()
	parts := "apply reserve " + diskspace.Bytes(reserve)
	if seg := need - reserve; seg > 0 {
		parts += " + one " + diskspace.Bytes(seg) + " Raft log segment"
	}
	free, _, _, err := diskspace.FreeNearest(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("measure free space of data dir %s: %w", cfg.DataDir, err)
	}
	if free < need {
		return &diskspace.RoomError{Path: cfg.DataDir, Op: "starting", Free: free, Need: need,
			Parts: parts, Fix: "free space or grow the volume, then start again; nothing was written"}
	}
	return nil
}

// appendRoom is the append filter's test (guard.go): entries of bytes
// are refused while the disk, as last measured, has less than the floor
// (MinFreeDiskFloor: the apply reserve and a log segment for wal) free
// beyond them. Below it the log store's append would fail or eat the room
// hashicorp/raft needs to store a term or vote (it panics when it cannot).
func (n *Node) appendRoom(bytes uint64) error {
	st := n.disk.State()
	floor := n.cfg.diskFloor()
	if st.Err == nil && st.Free >= floor+bytes {
		return nil
	}
	if st.Err != nil {
		return fmt.Errorf("%w: cannot measure free space of %s: %w", ErrLowDiskSpace, st.Dir, st.Err)
	}
	return &diskspace.RoomError{Path: st.Dir, Op: "appending to the raft log", Free: st.Free, Need: floor + bytes,
		Parts: "floor " + diskspace.Bytes(floor) + " + " + diskspace.Bytes(bytes) + " of entries",
		Fix:   "the leader retries; free space or grow the volume"}
}

// healthLag is how far the applied index may trail the commit index for
// Health: a few entries never reach the FSM (no-ops, barriers) and a busy
// follower is always a little behind.
const healthLag = 1024

// applyStuckAfter: a node whose applied index trails its commit index and
// has not moved for this long is unhealthy, however small the lag.
const applyStuckAfter = 5 * time.Second

// Healthy reports Health's verdict.
func (n *Node) Healthy() bool {
	ok, _ := n.Health()
	return ok
}

// Health reports whether the node can serve, and why not: it was not
// removed from the cluster (RemovedError), its log store is
// not stalled, its disk has room (below MinFreeDisk a leader refuses
// writes; below the apply reserve every node pauses applying), a leader is
// known, a leader has finished its term barrier, and a follower's state
// machine keeps up with the commit index it knows (within healthLag
// entries, and moving whenever it is behind).
func (n *Node) Health() (ok bool, reason string) {
	if err := n.Removed(); err != nil {
		return false, err.Error()
	}
	if d := n.guard.inProgress(); n.stalled.Load() {
		return false, fmt.Sprintf("raft log store write stalled for %v (limit %v): the disk is not answering", d.Round(time.Millisecond), n.cfg.LogStallTimeout)
	}
	ds := n.disk.State()
	switch {
	case ds.Critical:
		return false, fmt.Sprintf("disk nearly full: applying paused, %s free in %s, below the reserve of %s", diskspace.Bytes(ds.Free), ds.Dir, diskspace.Bytes(ds.Reserve))
	case ds.Low && ds.Err != nil:
		return false, fmt.Sprintf("cannot measure free disk space of %s (%v): writes refused", ds.Dir, ds.Err)
	case ds.Low:
		return false, fmt.Sprintf("disk space low: %s free in %s: writes refused until %s are free (--min-free-disk %s, plus 1/16), reads served", diskspace.Bytes(ds.Free), ds.Dir, diskspace.Bytes(diskspace.ResumeAt(ds.MinFree)), diskspace.Bytes(ds.MinFree))
	}
	switch n.raft.State() {
	case raft.Leader:
		if t := n.readyTerm.Load(); t == 0 || t != n.raft.CurrentTerm() {
			return false, "new leader not ready yet"
		}
	case raft.Follower:
		if _, lid := n.raft.LeaderWithID(); lid == "" {
			return false, "no leader known (election in progress, or no quorum)"
		}
	default:
		return false, "no leader known (election in progress, or no quorum)"
	}
	applied, commit := n.fsm.AppliedIndex(), n.raft.CommitIndex()
	if applied+healthLag < commit {
		return false, fmt.Sprintf("catching up with the leader: %d entries behind", commit-applied)
	}
	n.healthMu.Lock()
	defer n.healthMu.Unlock()
	now := time.Now()
	if applied != n.applyMark || applied >= commit || n.applySince.IsZero() {
		n.applyMark, n.applySince = applied, now
		return true, ""
	}
	// A few entries never reach the FSM (no-ops, barriers, configuration
	// changes), so a small lag that does not move is normal when idle:
	// only a lag that stays put while entries wait counts.
	if commit-applied > 8 && now.Sub(n.applySince) > applyStuckAfter {
		return false, fmt.Sprintf("state machine not applying: %d entries behind, applied index stuck at %d for %v", commit-applied, applied, now.Sub(n.applySince).Round(time.Second))
	}
	return true, ""
}

// Disk returns the latest measurement of the data directory's free space.
func (n *Node) Disk() diskspace.State { return n.disk.State() }

// LogStoreStats returns the Raft log store's write latency figures.
func (n *Node) LogStoreStats() LogStoreStats {
	st := n.guard.stats()
	st.Stalled = n.stalled.Load()
	return st
}

// LargestEntry is the largest Raft entry this node proposed, in bytes.
func (n *Node) LargestEntry() int { return int(n.largestEntry.v.Load()) }

// MaxEntryBytes is the configured maximum Raft entry size.
func (n *Node) MaxEntryBytes() int { return n.cfg.MaxEntryBytes }

// withholdReplication tells the transport to send no AppendEntries (nor
// heartbeats): this node's log store is stalled, or its state machine is
// paused for want of disk space, so as leader it could commit nothing.
// Followers stop hearing from it and elect another leader.
func (n *Node) withholdReplication() bool {
	return n.stalled.Load() || n.disk.State().Critical
}

// runWatchdog marks the node stalled while a log store write has run past
// LogStallTimeout, and clears it once the write returns.
func (n *Node) runWatchdog() {
	defer n.wg.Done()
	tick := min(n.cfg.LogStallTimeout/10, 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.stop:
			return
		}
		d := n.guard.inProgress()
		stalled := d > n.cfg.LogStallTimeout
		if stalled == n.stalled.Load() {
			continue
		}
		n.stalled.Store(stalled)
		if stalled {
			n.log.Error("raft log store write has not returned: the disk is stalled; this node stops replicating and serving as leader until it returns",
				"waited", d.Round(time.Millisecond), "limit", n.cfg.LogStallTimeout, "was_leader", n.raft.State() == raft.Leader)
		} else {
			n.log.Warn("raft log store write returned: the disk answers again", "longest_write", n.guard.stats().MaxWrite.Round(time.Millisecond))
		}
		n.broadcast()
	}
}
