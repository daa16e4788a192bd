package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// Peer is one member of a statically configured cluster.
type Peer struct {
	ID       string // Raft server ID, unique across all time
	RaftAddr string // address other nodes dial for Raft traffic
	GRPCAddr string // address clients use for this node
}

// ProgressProbe asks the node id (reachable for clients at grpcAddr) for
// the index its state machine has applied. The leader uses it to decide
// when a non-voter has caught up and can be promoted.
type ProgressProbe func(ctx context.Context, id, grpcAddr string) (appliedIndex uint64, err error)

// Config configures a Node. Zero durations and counts take the defaults
// listed per field.
type Config struct {
	// NodeID is this node's Raft server ID; it must be unique across all
	// time (a replaced machine gets a new ID).
	NodeID string
	// DataDir holds the Raft log and stable store (raft/wal/ or
	// raft/raft.db, per LogStore), raft/snapshots and fsm/ (the state
	// machine's Pebble database).
	DataDir string
	// LogStore picks the Raft log and stable store (default
	// DefaultLogStore). A data dir holding the other store's files is
	// refused with a *LogStoreMismatchError.
	LogStore LogStore
	// WALSegmentBytes is the size of one raft-wal segment file (default
	// 16 MiB; raft-wal's own is 64 MiB). Truncation behind a snapshot
	// deletes whole segments, so the log directory holds the entries kept
	// plus at most about two segments (the head's older part and the
	// preallocated tail): smaller segments bound a lightly loaded log
	// tighter, at one more segment file per 16 MiB appended.
	WALSegmentBytes int
	// RaftAddr is the bind address for Raft traffic; port 0 picks a free
	// port (read it back with Node.RaftAddr). Ignored when RaftListener is
	// set.
	RaftAddr string
	// RaftAdvertise is the address other nodes dial; defaults to the bound
	// address, which must then not be an unspecified IP (0.0.0.0, ::).
	RaftAdvertise string
	// RefuseRaftAddrChange makes New refuse (*RaftAddrChangedError) a
	// node whose data dir's latest Raft configuration lists it at another
	// address than RaftAdvertise (or the bound address); without it New
	// logs the error as a warning and starts, since the address may be
	// recorded afterwards (Join through a member). For clusters that
	// never move a node, e.g. a dev cluster whose nodes all moved.
	RefuseRaftAddrChange bool
	// RaftListener, if set, is used instead of listening on RaftAddr (tests
	// bind every address before starting any node). Node takes ownership.
	RaftListener net.Listener
	// WrapRaftStream, if set, wraps the Raft stream layer (TCP over
	// RaftListener/RaftAddr) before the transport uses it: TLS with mutual
	// authentication (security.WrapStreamLayer) in production.
	WrapRaftStream func(raft.StreamLayer) raft.StreamLayer
	// GRPCAddr is the client address advertised for this node (recorded in
	// the replicated node table so followers can forward to the leader).
	GRPCAddr string
	// Bootstrap makes a node with no Raft state form a one-node cluster.
	Bootstrap bool
	// Peers, given identically to every node, bootstraps a static cluster:
	// each node with no state bootstraps with the whole list (which must
	// include itself). A node with existing state ignores it, except that
	// a leader records the peers' client addresses.
	Peers []Peer
	// Region names where this node runs (e.g. "eu-west"); "" for none.
	// The leader records it in the replicated node table (RegionProbe asks
	// the other nodes theirs), so every node knows every node's region.
	Region string
	// SeedSettings are cluster settings (e.g.
	// SettingPreferredLeaderRegions) the leader records when the cluster
	// has no value for them yet: a bootstrap seeds them; afterwards they
	// change through SetSetting only.
	SeedSettings map[string]string
	// PreferHold is how long a leader outside the preferred leader regions
	// waits, while a voter inside exists, before handing leadership over
	// (default 10 s); PreferMinInterval is the least time between two such
	// hand-overs by one node (default 30 s); a node elected again within
	// PreferFlapWindow (default 2 min) of handing leadership away doubles
	// its hold (up to 16×), so an unhealthy preferred region cannot make
	// leadership flap.
	PreferHold        time.Duration
	PreferMinInterval time.Duration
	PreferFlapWindow  time.Duration
	// RegionProbe, if set, lets the leader ask a node its region (the
	// server wires it to Admin.Status).
	RegionProbe RegionProbe
	// Logger receives everything, Raft's own logs at WARN and above.
	Logger *slog.Logger
	// FSM configures the state machine; Dir is always DataDir/fsm.
	FSM fsm.Config

	// Raft tuning (hashicorp/raft defaults when zero: heartbeat 1 s,
	// election 1 s, leader lease 500 ms, commit 50 ms, snapshot every
	// 120-240 s when 8192 entries were added, 10240 trailing logs).
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotInterval   time.Duration
	SnapshotThreshold  uint64
	TrailingLogs       uint64
	// MaxLogBytes bounds the Raft log in bytes of entries (default
	// DefaultMaxLogBytes), as TrailingLogs and SnapshotThreshold bound it
	// in entries: one entry holds from one ID to MaxGroupItems, so a
	// count alone keeps any amount of log. Every TickInterval the node
	// lowers raft's TrailingLogs to the newest entries that fit in
	// MaxLogBytes less a step (at least half of it), and takes a snapshot
	// once that lets raft truncate a step of log. A step is
	// MaxLogBytes/16, or a quarter of the latest snapshot when larger: a
	// snapshot writes the whole store, so snapshots write at most about
	// four bytes per byte of log truncated. The log then stays within
	// MaxLogBytes (or half of it and a quarter of a snapshot, for a store
	// over twice the bound), plus what is appended while a snapshot is
	// taken and, with wal, up to two segments (WALSegmentBytes). At least
	// twice MaxEntryBytes.
	MaxLogBytes uint64
	// SnapshotRetain is how many snapshots are kept on disk (default 2).
	SnapshotRetain int
	// LogCacheEntries and LogCacheBytes bound the in-memory cache of the
	// newest Raft log entries (defaults 512 entries, 32 MiB of entry data;
	// the newest entry is always cached). Replication and a follower's
	// apply read recent entries from it; older ones come from the store.
	LogCacheEntries int
	LogCacheBytes   int

	// MaxGroupItems caps the items (message IDs; an op without items
	// counts 1) grouped into one Raft entry (default 20 000). A single
	// larger request still goes alone.
	MaxGroupItems int
	// MaxGroupBytes caps the approximate encoded size of one entry
	// (default 8 MiB).
	MaxGroupBytes int
	// MaxInflight caps Raft entries proposed and not yet answered
	// (default 2). Without a cap no groups form: raft.Apply only enqueues.
	MaxInflight int
	// PipelineAfter is how long the oldest entry in flight must have
	// waited before a further one is proposed beside it (default 20 ms;
	// negative: at once, up to MaxInflight). On one machine or one LAN an
	// entry commits within a few milliseconds, and a second entry queued
	// behind it only delays it (hashicorp/raft's leader loop may write
	// the queued entry before it processes the first one's commit) and
	// splits the callers into smaller entries; across regions, where a
	// commit takes a round trip of tens of milliseconds, the second entry
	// keeps the log busy during it. See DESIGN.md, "Request path".
	PipelineAfter time.Duration

	// MaxEntryBytes caps the encoded size of one Raft entry (default
	// 16 MiB). A request whose ops alone exceed it is refused before
	// anything is proposed (*EntryTooLargeError); MaxGroupBytes is held
	// below it. One huge entry is written, fsynced and sent to every
	// follower in one piece and can starve heartbeats on a small machine.
	MaxEntryBytes int

	// MinFreeDisk is the free space on DataDir's filesystem below which
	// client writes are refused (*diskspace.LowSpaceError, matching
	// ErrLowDiskSpace). Zero: automatic, 64 MiB plus twice the state
	// machine's size on disk (room for a snapshot and a full compaction),
	// and never less than twice the apply reserve (see DiskReserve). A
	// fixed value below MinFreeDiskFloor lets the disk fill.
	MinFreeDisk uint64
	// DiskCheckInterval is how often free space is measured (default
	// 250 ms).
	DiskCheckInterval time.Duration
	// LogStallTimeout bounds one write of the Raft log store (default
	// 3 s). A write running longer marks the node stalled: it stops
	// replicating (followers then elect another leader), answers as a
	// non-leader and reports NOT_SERVING, until the write returns.
	LogStallTimeout time.Duration

	// TickInterval is how often the leader looks for expired buckets and
	// non-voters to promote, and every node measures its Raft log against
	// MaxLogBytes (default 1 s).
	TickInterval time.Duration
	// StampInterval is how often a leader with read replicas in its node
	// table proposes an OpTick when no other entry carried its clock for
	// that long (default 250 ms), so the last applied leader timestamp
	// keeps advancing on an idle log and replicas can answer bounded-
	// staleness reads locally (see DESIGN.md, Read replicas). Negative:
	// never.
	StampInterval time.Duration
	// PromoteAfter is how long a non-voter must have been in the
	// configuration before promotion is considered (default 2 s).
	PromoteAfter time.Duration
	// PromoteMaxLag is how many entries a non-voter's applied index may
	// trail the leader's commit index and still count as caught up
	// (default 256).
	PromoteMaxLag uint64
	// Progress, if set, lets the leader ask a non-voter its applied index
	// (the server wires it to Admin.Status). Without it a non-voter counts
	// as caught up when no heartbeat to it failed within PromoteAfter.
	Progress ProgressProbe
	// ClusterIDProbe, if set, lets the leader ask a joining node its
	// cluster ID (the server wires it to Admin.Status), so Join refuses a
	// node of another cluster with a *ClusterMismatchError.
	ClusterIDProbe ClusterIDProbe
	// RetiredProbe, if set, lets a node that knows no leader ask its peers
	// whether its own ID is retired (the server wires it to Admin.Status),
	// so a removed member restarted from its data dir reports a
	// *RemovedError instead of "no leader known" for ever.
	RetiredProbe RetiredProbe
}

// DefaultMaxEntryBytes is Config.MaxEntryBytes's default.
const DefaultMaxEntryBytes = 16 << 20

// DefaultPipelineAfter is Config.PipelineAfter's default: longer than a
// commit takes on one machine or LAN under load, shorter than a round
// trip between regions.
const DefaultPipelineAfter = 20 * time.Millisecond

func (c *Config) withDefaults() Config {
	d := *c
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.LogStore == "" {
		d.LogStore = DefaultLogStore
	}
	if d.WALSegmentBytes <= 0 {
		d.WALSegmentBytes = defaultWALSegmentBytes
	}
	if d.MaxLogBytes == 0 {
		d.MaxLogBytes = DefaultMaxLogBytes
	}
	if d.SnapshotRetain <= 0 {
		d.SnapshotRetain = 2
	}
	if d.LogCacheEntries <= 0 {
		d.LogCacheEntries = defaultLogCacheEntries
	}
	if d.LogCacheBytes <= 0 {
		d.LogCacheBytes = defaultLogCacheBytes
	}
	if d.MaxGroupItems <= 0 {
		d.MaxGroupItems = 20_000
	}
	if d.MaxGroupBytes <= 0 {
		d.MaxGroupBytes = 8 << 20
	}
	if d.MaxEntryBytes <= 0 {
		d.MaxEntryBytes = DefaultMaxEntryBytes
	}
	d.MaxGroupBytes = min(d.MaxGroupBytes, d.MaxEntryBytes)
	if d.LogStallTimeout <= 0 {
		d.LogStallTimeout = 3 * time.Second
	}
	if d.MaxInflight <= 0 {
		d.MaxInflight = 2
	}
	if d.PipelineAfter == 0 {
		d.PipelineAfter = DefaultPipelineAfter
	}
	if d.TickInterval <= 0 {
		d.TickInterval = time.Second
	}
	if d.StampInterval == 0 {
		d.StampInterval = 250 * time.Millisecond
	}
	if d.PromoteAfter <= 0 {
		d.PromoteAfter = 2 * time.Second
	}
	if d.PromoteMaxLag == 0 {
		d.PromoteMaxLag = 256
	}
	if d.PreferHold <= 0 {
		d.PreferHold = 10 * time.Second
	}
	if d.PreferMinInterval <= 0 {
		d.PreferMinInterval = 30 * time.Second
	}
	if d.PreferFlapWindow <= 0 {
		d.PreferFlapWindow = 2 * time.Minute
	}
	return d
}

func (c *Config) validate() error {
	var errs []error
	if err := fsm.ValidateNodeID(c.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("NodeID: %s", err.(*fsm.InvalidError).Reason))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("DataDir is required"))
	}
	if c.RaftAddr == "" && c.RaftListener == nil {
		errs = append(errs, errors.New("RaftAddr is required"))
	}
	switch c.LogStore {
	case "", LogStoreWAL, LogStoreBoltDB:
	default:
		errs = append(errs, fmt.Errorf("LogStore %q: want %q or %q", c.LogStore, LogStoreWAL, LogStoreBoltDB))
	}
	if c.WALSegmentBytes < 0 {
		errs = append(errs, fmt.Errorf("WALSegmentBytes %d: want 0 (default) or more", c.WALSegmentBytes))
	}
	if c.GRPCAddr == "" {
		errs = append(errs, errors.New("GRPCAddr is required"))
	}
	entry := uint64(DefaultMaxEntryBytes)
	if c.MaxEntryBytes > 0 {
		entry = uint64(c.MaxEntryBytes)
	}
	if c.MaxLogBytes != 0 && c.MaxLogBytes < 2*entry {
		errs = append(errs, fmt.Errorf("MaxLogBytes %d: want 0 (default) or at least %d, twice MaxEntryBytes: a smaller bound would take a snapshot for nearly every entry", c.MaxLogBytes, 2*entry))
	}
	if err := CheckRegion(c.Region); err != nil {
		errs = append(errs, fmt.Errorf("Region: %w", err))
	}
	if len(c.Peers) > 0 {
		self := false
		seen := map[string]bool{}
		for i, p := range c.Peers {
			if p.ID == "" || p.RaftAddr == "" {
				errs = append(errs, fmt.Errorf("Peers[%d]: ID and RaftAddr are required", i))
			} else if err := fsm.ValidateNodeID(p.ID); err != nil {
				errs = append(errs, fmt.Errorf("Peers[%d]: ID: %s", i, err.(*fsm.InvalidError).Reason))
			}
			if seen[p.ID] {
				errs = append(errs, fmt.Errorf("Peers[%d]: duplicate ID %q", i, p.ID))
			}
			seen[p.ID] = true
			if p.ID == c.NodeID {
				self = true
			}
		}
		if !self {
			errs = append(errs, fmt.Errorf("Peers must include this node (%q)", c.NodeID))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster config: %w", err)
	}
	return nil
}
