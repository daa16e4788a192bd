package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"

	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// Node is one member of a dedupnode Raft group: the Raft instance, its
// log/stable store (raft-wal or bbolt, Config.LogStore), snapshot store, TCP transport and the FSM it
// drives, plus the leader-side machinery (group-commit proposer, read
// index, leadership loop). A process may host several Nodes (no globals).
//
// All methods are safe for concurrent use.
type Node struct {
	cfg    Config
	log    *slog.Logger
	fsm    *fsm.FSM
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	stream *streamLayer
	store  raftStore      // log and stable store (logstore.go)
	logs   *logCache      // in front of sizes (logcache.go)
	sizes  *logSizes      // in front of guard: sizes of the log's entries (logbound.go)
	guard  *stallGuard    // times log store writes (guard.go)
	snaps  *snapshotStore // raft's file store without its leaked .tmp dirs (snapstore.go)
	disk   *diskspace.Monitor

	// stalled: a log store write has run past LogStallTimeout (watchdog).
	stalled atomic.Bool
	// removed is set once this node knows it was removed from the cluster
	// (runRetiredCheck); it never clears.
	removed atomic.Pointer[RemovedError]
	// reloadMu serializes changes to raft's reloadable configuration:
	// each reads it, changes some fields and writes it back.
	reloadMu sync.Mutex
	// trailingLogs is raft's TrailingLogs as configured; runLogBound
	// lowers raft's own to bound the log in bytes.
	trailingLogs uint64
	largestEntry entrySizeMax
	stopCtx      context.Context // cancelled when Shutdown starts
	stopCancel   context.CancelFunc
	healthMu     sync.Mutex
	applyMark    uint64    // applied index at applySince (Health)
	applySince   time.Time // when the applied index last moved while behind

	hadState bool

	notifyCh chan bool
	obsCh    chan raft.Observation
	observer *raft.Observer

	// readyTerm is the term whose barrier and term-start command have been
	// applied on this leader; 0 when not leader (or not yet ready).
	readyTerm atomic.Uint64

	chMu    sync.Mutex
	changed chan struct{} // closed and replaced on leader or readiness change

	hbMu   sync.Mutex
	hbFail map[raft.ServerID]time.Time // last failed heartbeat per peer (leader)
	// peers is the leader's per-peer liveness (peers.go), fed by the
	// transport, reset at each term this node leads.
	peers peerTracker

	prop  *proposer
	reads *readIndexer
	// place is the leader's placement state (regions.go).
	place placement

	stop     chan struct{}
	raftDown chan struct{} // closed once raft.Shutdown has returned
	// loneTimeouts holds raft's configured timeouts while hurryLoneElection
	// has shortened them; runLeadership puts them back once this node leads.
	loneTimeouts atomic.Pointer[raft.ReloadableConfig]
	stopping     atomic.Bool // set when Shutdown starts (quiets raft's connection noise)
	wg           sync.WaitGroup
	shutOnce     sync.Once
	shutErr      error
}

// New opens the stores in cfg.DataDir, starts Raft and, when the node has
// no Raft state yet, bootstraps it (Bootstrap: alone; Peers: with the whole
// list). A node started with neither waits to be added by a leader (Join).
func New(cfg Config) (_ *Node, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "cluster", "node", cfg.NodeID),
		notifyCh: make(chan bool, 16),
		obsCh:    make(chan raft.Observation, 64),
		changed:  make(chan struct{}),
		hbFail:   map[raft.ServerID]time.Time{},
		stop:     make(chan struct{}),
		raftDown: make(chan struct{}),
	}
	n.stopCtx, n.stopCancel = context.WithCancel(context.Background())
	hcl := newHCLogger(n.log.With("component", "raft"), hclog.Warn, &n.stopping)

	var closers []func() error
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				_ = closers[i]()
			}
		}
	}()

	// Before any file is created: a data dir recorded as another node's
	// is refused (identity.go).
	recordedID, legacyDir, err := checkNodeID(cfg.DataDir, cfg.NodeID)
	if err != nil {
		return nil, err
	}
	// Also before any file is written: a disk too full to start on is
	// refused (startRoom).
	if err := startRoom(cfg); err != nil {
		return nil, err
	}

	raftDir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(raftDir, 0o755); err != nil {
		return nil, fmt.Errorf("create raft dir: %w", err)
	}

	ln := cfg.RaftListener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.RaftAddr); err != nil {
			return nil, fmt.Errorf("listen for raft on %s: %w", cfg.RaftAddr, err)
		}
	}
	if n.stream, err = newStreamLayer(ln, cfg.RaftAdvertise); err != nil {
		ln.Close()
		return nil, err
	}
	closers = append(closers, n.stream.Close)

	if n.store, err = openLogStore(cfg.DataDir, cfg.LogStore, cfg.WALSegmentBytes, hcl); err != nil {
		return nil, err
	}
	closers = append(closers, n.store.Close)

	if n.snaps, err = openSnapshotStore(raftDir, cfg.SnapshotRetain, hcl, n.log); err != nil {
		return nil, err
	}

	fcfg := cfg.FSM
	fcfg.Dir = filepath.Join(cfg.DataDir, "fsm")
	if fcfg.Logger == nil {
		fcfg.Logger = cfg.Logger
	}
	n.disk = diskspace.New(diskspace.Config{
		Dir:      cfg.DataDir,
		MinFree:  cfg.MinFreeDisk,
		AutoBase: autoMinFreeBase,
		AutoDir:  fcfg.Dir,
		Reserve:  DiskReserve(fcfg.Storage.MemTableBytes),
		Interval: cfg.DiskCheckInterval,
		Logger:   n.log,
	})
	closers = append(closers, func() error { n.disk.Close(); return nil })
	// The disk gate comes after the caller's own (cfg.FSM.ApplyGate, if
	// any): applying waits for both.
	callerGate := fcfg.ApplyGate
	fcfg.ApplyGate = func() bool {
		if callerGate != nil && !callerGate() {
			return false
		}
		return n.disk.WaitRoom(n.stopCtx)
	}
	// A snapshot restore writes a second database beside the live one
	// (fsm/db.restore): it stops at the reserve like applying does, and
	// Raft retries it later (a joining node on a volume too small for the
	// snapshot used to crash in Pebble instead).
	fcfg.RestoreRoom = func(need uint64) error {
		return n.disk.Room("restoring a snapshot", "the restore is abandoned, the current state is kept and Raft retries it later; free space or grow the volume", need)
	}
	if n.fsm, err = fsm.New(fcfg); err != nil {
		return nil, fmt.Errorf("open fsm: %w", err)
	}
	closers = append(closers, n.fsm.Close)

	if n.hadState, err = raft.HasExistingState(n.store, n.store, n.snaps); err != nil {
		return nil, fmt.Errorf("inspect raft state: %w", err)
	}
	skipRestore, err := n.canSkipRestore()
	if err != nil {
		return nil, err
	}

	var stream raft.StreamLayer = n.stream
	if cfg.WrapRaftStream != nil {
		stream = cfg.WrapRaftStream(n.stream)
	}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  hcl,
	})
	closers = append(closers, n.trans.Close)

	n.guard = newStallGuard(n.store)
	if n.sizes, err = newLogSizes(n.guard); err != nil {
		return nil, err
	}
	if e := n.sizes.extent(); e.Bytes > cfg.MaxLogBytes {
		n.log.Warn("raft log holds more than MaxLogBytes; the next snapshot truncates it", "log_bytes", e.Bytes,
			"max_log_bytes", cfg.MaxLogBytes, "entries", e.Last-e.First+1)
	}
	n.logs = newLogCache(n.sizes, cfg.LogCacheEntries, cfg.LogCacheBytes)
	rc := n.raftConfig(hcl, skipRestore)
	n.trailingLogs = rc.TrailingLogs
	trans := &guardedTransport{
		NetworkTransport: n.trans,
		stalled:          n.withholdReplication,
		timeoutNow:       func() time.Duration { return n.raft.ReloadableConfig().ElectionTimeout },
		observe: func(id raft.ServerID, resp *raft.AppendEntriesResponse, err error) {
			n.peers.record(id, resp, err, time.Now())
		},
		sending: func(id raft.ServerID) { n.peers.sending(id, time.Now()) },
		filter:  newAppendFilter(n.stopCtx, n.trans.Consumer(), n.appendRoom),
	}
	closers = append(closers, func() error { n.stopCancel(); return nil })
	if n.raft, err = raft.NewRaft(rc, n.fsm, n.logs, n.store, n.snaps, trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	closers = append(closers, func() error { return n.raft.Shutdown().Error() })

	if !n.hadState {
		if err := n.bootstrap(); err != nil {
			return nil, err
		}
	}
	if err := n.checkIdentity(recordedID, legacyDir); err != nil {
		return nil, err
	}
	n.hurryLoneElection(rc)

	n.observer = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.observer)

	n.prop = newProposer(n)
	n.reads = &readIndexer{n: n}
	n.wg.Add(6)
	go n.runLogBound()
	go n.runRetiredCheck()
	go n.runWatchdog()
	go n.runObserver()
	go n.runLeadership()
	go n.prop.run()
	n.log.Info("raft node started", "raft_addr", n.RaftAddr(), "grpc_addr", cfg.GRPCAddr, "raft_log_store", cfg.LogStore,
		"existing_state", n.hadState, "restore_snapshot_on_start", !skipRestore)
	return n, nil
}

// checkIdentity runs once Raft has read its latest configuration: it
// records the node ID in a data dir that has none (adopting it in a data
// dir of an earlier version, unless the configuration shows the dir is
// another node's), and compares the address the configuration lists for
// this node with the advertised one (a warning, or an error with
// RefuseRaftAddrChange).
func (n *Node) checkIdentity(recordedID string, legacyDir bool) error {
	var conf raft.Configuration
	if n.hadState {
		fut := n.raft.GetConfiguration()
		if err := fut.Error(); err != nil {
			return fmt.Errorf("read raft configuration: %w", err)
		}
		conf = fut.Configuration()
	}
	switch {
	case recordedID != "":
	case legacyDir:
		if err := n.adoptNodeID(conf); err != nil {
			return err
		}
	default:
		if err := recordNodeID(n.cfg.DataDir, n.cfg.NodeID); err != nil {
			return err
		}
	}
	if moved := n.checkRaftAddr(conf); moved != nil {
		if n.cfg.RefuseRaftAddrChange {
			return moved
		}
		n.log.Warn(moved.Error(), "recorded_raft_addr", moved.Recorded, "raft_addr", moved.Advertised)
	}
	return nil
}

// boltOptions are the raft log's bbolt options. Every commit is still
// fsynced (raft-boltdb's NoSync stays off); only the freelist is not
// written. Raft truncates its log behind every snapshot, so raft.db keeps
// thousands of free pages, and bbolt otherwise writes their whole list with
// every commit (about 22 KiB per append in a simulated raft log with 10 240
// trailing entries of 6 KB: 6.5 → 5.5 write calls per commit). Without it,
// bbolt rebuilds the freelist by scanning raft.db when it opens, which stays
// small (trailing logs only). The hashmap freelist allocates pages in O(1)
// in such a fragmented file. A file written this way opens fine with bbolt's
// defaults too (TestBoltOptions_LogSurvivesReopenWithoutSyncedFreelist).
func boltOptions() *bbolt.Options {
	return &bbolt.Options{
		Timeout:        2 * time.Second,
		NoFreelistSync: true,
		FreelistType:   bbolt.FreelistMapType,
	}
}

func (n *Node) raftConfig(hcl hclog.Logger, skipRestore bool) *raft.Config {
	c := n.cfg
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.Logger = hcl
	rc.NotifyCh = n.notifyCh
	rc.NoSnapshotRestoreOnStart = skipRestore
	if c.HeartbeatTimeout > 0 {
		rc.HeartbeatTimeout = c.HeartbeatTimeout
	}
	if c.ElectionTimeout > 0 {
		rc.ElectionTimeout = c.ElectionTimeout
	}
	if c.LeaderLeaseTimeout > 0 {
		rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	}
	if c.CommitTimeout > 0 {
		rc.CommitTimeout = c.CommitTimeout
	}
	if c.SnapshotInterval > 0 {
		rc.SnapshotInterval = c.SnapshotInterval
	}
	if c.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = c.SnapshotThreshold
	}
	if c.TrailingLogs > 0 {
		rc.TrailingLogs = c.TrailingLogs
	}
	// Keep raft.ValidateConfig's orderings when only some knobs are set.
	rc.LeaderLeaseTimeout = min(rc.LeaderLeaseTimeout, rc.HeartbeatTimeout)
	rc.ElectionTimeout = max(rc.ElectionTimeout, rc.HeartbeatTimeout)
	return rc
}

// canSkipRestore decides raft's NoSnapshotRestoreOnStart. The FSM persists
// its applied index atomically with its data, so on restart it normally
// holds everything up to the latest snapshot and re-ingesting that snapshot
// would only cost time. It must restore when it does not: its applied index
// is below the snapshot's and an entry it never applied lies in between
// (raft's snapshot index may also point past trailing no-op and barrier
// entries, which the FSM never sees; those do not count). When the entries
// in between are no longer in the log, restore.
func (n *Node) canSkipRestore() (bool, error) {
	metas, err := n.snaps.List()
	if err != nil {
		return false, fmt.Errorf("list snapshots: %w", err)
	}
	if len(metas) == 0 {
		return true, nil
	}
	snapIdx, applied := metas[0].Index, n.fsm.AppliedIndex()
	if applied >= snapIdx {
		return true, nil
	}
	const maxScan = 1024
	if snapIdx-applied > maxScan {
		n.log.Warn("fsm behind latest snapshot; restoring it", "fsm_applied", applied, "snapshot_index", snapIdx)
		return false, nil
	}
	for i := applied + 1; i <= snapIdx; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil || l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			n.log.Warn("fsm behind latest snapshot; restoring it", "fsm_applied", applied, "snapshot_index", snapIdx)
			return false, nil
		}
	}
	return true, nil
}

func (n *Node) bootstrap() error {
	var servers []raft.Server
	switch {
	case len(n.cfg.Peers) > 0:
		for _, p := range n.cfg.Peers {
			addr := p.RaftAddr
			if p.ID == n.cfg.NodeID && addr != n.RaftAddr() {
				n.log.Warn("this node's raft address in Peers differs from its advertised address",
					"peers_addr", addr, "advertised", n.RaftAddr())
			}
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(addr)})
		}
	case n.cfg.Bootstrap:
		servers = []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(n.cfg.NodeID), Address: n.trans.LocalAddr()}}
	default:
		return nil
	}
	err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("bootstrap cluster: %w", err)
	}
	return nil
}

// ID returns this node's Raft server ID.
func (n *Node) ID() string { return n.cfg.NodeID }

// RaftAddr returns the advertised Raft address (with the real port when
// the bind address had port 0).
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// GRPCAddr returns the client address advertised for this node.
func (n *Node) GRPCAddr() string { return n.cfg.GRPCAddr }

// FSM returns the node's state machine (for local reads).
func (n *Node) FSM() *fsm.FSM { return n.fsm }

// Raft returns the underlying Raft instance, for diagnostics and tests.
func (n *Node) Raft() *raft.Raft { return n.raft }

// HadExistingState reports whether Raft state was found on disk at start
// (a restart rather than a first start).
func (n *Node) HadExistingState() bool { return n.hadState }

// IsLeader reports whether this node is currently the Raft leader.
// A leader whose log store is stalled is not counted: it can commit
// nothing and is being replaced.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader && !n.stalled.Load() }

// Leader returns the current leader's ID and addresses as this node knows
// them; all empty when no leader is known. grpcAddr may be empty while the
// leader's address is not yet replicated.
func (n *Node) Leader() (id, raftAddr, grpcAddr string) {
	addr, lid := n.raft.LeaderWithID()
	if lid == "" || (string(lid) == n.cfg.NodeID && n.stalled.Load()) {
		return "", "", ""
	}
	return string(lid), string(addr), n.grpcAddrOf(string(lid))
}

// grpcAddrOf looks a node's client address up in the replicated node table,
// then in the static peers.
func (n *Node) grpcAddrOf(id string) string {
	if id == n.cfg.NodeID {
		return n.cfg.GRPCAddr
	}
	if a := n.fsm.Nodes()[id]; a != "" {
		return a
	}
	for _, p := range n.cfg.Peers {
		if p.ID == id {
			return p.GRPCAddr
		}
	}
	return ""
}

func (n *Node) notLeaderError() error {
	if err := n.Removed(); err != nil {
		return err
	}
	id, raftAddr, grpcAddr := n.Leader()
	if id == n.cfg.NodeID {
		// Raft still names us while stepping down.
		return &NotLeaderError{}
	}
	return &NotLeaderError{LeaderID: id, LeaderRaftAddr: raftAddr, LeaderGRPCAddr: grpcAddr}
}

// Changed returns a channel closed at the next leader change or readiness
// change (observations may be coalesced: re-read state after it fires).
func (n *Node) Changed() <-chan struct{} {
	n.chMu.Lock()
	defer n.chMu.Unlock()
	return n.changed
}

func (n *Node) broadcast() {
	n.chMu.Lock()
	close(n.changed)
	n.changed = make(chan struct{})
	n.chMu.Unlock()
}

// WaitLeader blocks until a leader with a known client address is known,
// or ctx ends (then it returns a *NotLeaderError with no leader). A node
// removed from the cluster gets its *RemovedError at once.
func (n *Node) WaitLeader(ctx context.Context) (id, grpcAddr string, err error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ch := n.Changed()
		if err := n.Removed(); err != nil {
			return "", "", err
		}
		if id, _, grpcAddr := n.Leader(); id != "" && grpcAddr != "" {
			return id, grpcAddr, nil
		}
		select {
		case <-ch:
		case <-t.C:
		case <-n.stop:
			return "", "", ErrShutdown
		case <-ctx.Done():
			return "", "", &NotLeaderError{}
		}
	}
}

// Ready reports without waiting whether WaitReady would return nil now:
// this node leads and its term barrier and term-start command applied.
func (n *Node) Ready() bool {
	if !n.IsLeader() {
		return false
	}
	t := n.readyTerm.Load()
	return t != 0 && t == n.raft.CurrentTerm()
}

// WaitReady blocks until this node is a leader that has finished the
// barrier of its term (nil), is known not to be leader (*NotLeaderError,
// or *RemovedError once it knows it was removed), or ctx ends
// (ErrNotReady).
func (n *Node) WaitReady(ctx context.Context) error {
	for {
		ch := n.Changed()
		select {
		case <-n.stop:
			return ErrShutdown
		default:
		}
		if !n.IsLeader() {
			return n.notLeaderError()
		}
		if t := n.readyTerm.Load(); t != 0 && t == n.raft.CurrentTerm() {
			return nil
		}
		select {
		case <-ch:
		case <-n.stop:
			return ErrShutdown
		case <-ctx.Done():
			return ErrNotReady
		}
	}
}

// Member is one server of the Raft configuration.
type Member struct {
	ID       string
	RaftAddr string
	GRPCAddr string
	Suffrage string // "voter", "nonvoter" (catching up, then promoted) or "replica" (read replica)
	Leader   bool
	Region   string // as the node table records it; "" if unknown
	// PeerLiveness: as this node sees it when it leads (itself: Reachable);
	// ReachUnknown on any other node.
	PeerLiveness
}

// Status is this node's view of the cluster.
type Status struct {
	NodeID         string
	State          string // leader, follower, candidate, shutdown
	LeaderID       string
	LeaderRaftAddr string
	LeaderGRPCAddr string
	Term           uint64
	CommitIndex    uint64
	// AppliedIndex is the FSM's applied index (its effects are stored).
	AppliedIndex      uint64
	FirstLogIndex     uint64
	LastLogIndex      uint64
	LastSnapshotIndex uint64
	// LogEntries and LogBytes are what the Raft log holds (MaxLogBytes
	// bounds the bytes).
	LogEntries, LogBytes uint64
	Members              []Member
	FSM                  fsm.Stats
	// ClusterID is the cluster's ID as this node applied it ("" until
	// then).
	ClusterID string
}

// Status returns current figures. Members come from the latest Raft
// configuration, client addresses from the replicated node table.
func (n *Node) Status() (Status, error) {
	lid, laddr, lgrpc := n.Leader()
	s := Status{
		NodeID:         n.cfg.NodeID,
		ClusterID:      n.fsm.ClusterID(),
		State:          strings.ToLower(n.raft.State().String()),
		LeaderID:       lid,
		LeaderRaftAddr: laddr,
		LeaderGRPCAddr: lgrpc,
		Term:           n.raft.CurrentTerm(),
		CommitIndex:    n.raft.CommitIndex(),
		LastLogIndex:   n.raft.LastIndex(),
		FSM:            n.fsm.Stats(),
	}
	s.AppliedIndex = s.FSM.AppliedIndex
	if fi, err := n.store.FirstIndex(); err == nil {
		s.FirstLogIndex = fi
	}
	if e := n.sizes.extent(); e.Last != 0 {
		s.LogEntries, s.LogBytes = e.Last-e.First+1, e.Bytes
	}
	if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
		s.LastSnapshotIndex = metas[0].Index
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return s, fmt.Errorf("read raft configuration: %w", err)
	}
	replicas := n.fsm.Replicas()
	regions := n.fsm.NodeRegions()
	now, threshold := time.Now(), n.raft.ReloadableConfig().HeartbeatTimeout
	for _, srv := range cf.Configuration().Servers {
		suffrage := "voter"
		switch srv.Suffrage {
		case raft.Nonvoter:
			suffrage = "nonvoter"
			if replicas[string(srv.ID)] {
				suffrage = "replica"
			}
		case raft.Staging:
			suffrage = "staging"
		}
		s.Members = append(s.Members, Member{
			ID:       string(srv.ID),
			RaftAddr: string(srv.Address),
			GRPCAddr: n.grpcAddrOf(string(srv.ID)),
			Suffrage: suffrage,
			Leader:   string(srv.ID) == lid,
			Region:   regions[string(srv.ID)],
		})
		m := &s.Members[len(s.Members)-1]
		if lv, ok := n.peers.liveness(srv.ID, now, threshold, s.LastLogIndex); ok {
			m.PeerLiveness = lv
			if m.ID == n.cfg.NodeID {
				m.PeerLiveness = PeerLiveness{Reachability: Reachable}
			}
		}
	}
	return s, nil
}

// Shutdown stops the node: it hands leadership to another voter first when
// it leads and has one (bounded by ctx and 5 s), stops the leader loops,
// fails queued proposals with ErrShutdown, shuts Raft down, closes the
// transport and every accepted connection, then the FSM and the log store.
// In-flight proposals end with ErrOutcomeUnknown. Safe to call twice; the
// second call returns the first result.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutOnce.Do(func() {
		n.stopping.Store(true)
		if n.raft.State() == raft.Leader && n.otherVoters() > 0 {
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := waitFuture(tctx, n.raft.LeadershipTransfer()); err != nil {
				if connGone(err) {
					// The target went away meanwhile: typically every node
					// is being stopped at once. The survivors, if any, elect.
					n.log.Info("leadership transfer before shutdown skipped: the target node is going away too", "err", err)
				} else {
					n.log.Warn("leadership transfer before shutdown failed", "err", err)
				}
			}
			cancel()
		}
		close(n.stop)
		n.stopCancel() // releases an apply paused for disk space
		n.readyTerm.Store(0)
		var errs []error
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		close(n.raftDown)
		n.disk.Close()
		n.raft.DeregisterObserver(n.observer)
		n.wg.Wait()
		n.trans.CloseStreams()
		if err := n.trans.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close transport: %w", err))
		}
		if err := n.stream.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft listener: %w", err))
		}
		if err := n.fsm.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close fsm: %w", err))
		}
		if err := n.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close raft log: %w", err))
		}
		n.shutErr = errors.Join(errs...)
		n.log.Info("raft node stopped", "err", n.shutErr)
	})
	return n.shutErr
}

func (n *Node) otherVoters() int {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID {
			c++
		}
	}
	return c
}

// waitFuture waits for f or ctx. A future abandoned on ctx still resolves
// later (raft answers every future by shutdown at the latest).
func waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hurryLoneElection shortens raft's follower timeout while this node is the
// only voter of its configuration (a one-node cluster, restarted or just
// bootstrapped): nobody else can lead, yet raft would wait a whole
// randomised heartbeat timeout (1–2 s by default) before electing it, the
// largest part of a one-node restart. etcd fast-forwards its election ticks
// on start for the same reason. The timeout goes down to rc's
// LeaderLeaseTimeout, the least raft.ValidateConfig accepts, and back to rc's
// once this node leads (runLeadership); nothing else changes.
func (n *Node) hurryLoneElection(rc *raft.Config) {
	fut := n.raft.GetConfiguration()
	if fut.Error() != nil {
		return
	}
	voters, self := 0, false
	for _, s := range fut.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == rc.LocalID
		}
	}
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	normal := n.raft.ReloadableConfig()
	short := rc.LeaderLeaseTimeout
	if voters != 1 || !self || short >= normal.HeartbeatTimeout {
		return
	}
	hurried := normal
	hurried.HeartbeatTimeout, hurried.ElectionTimeout = short, short
	n.loneTimeouts.Store(&normal)
	if err := n.raft.ReloadConfig(hurried); err != nil {
		n.loneTimeouts.Store(nil)
		n.log.Warn("could not shorten the lone voter's election timeout", "err", err)
		return
	}
	if n.raft.State() == raft.Leader { // elected before the change: undo it
		n.restoreTimeoutsLocked()
	}
}

// restoreTimeouts undoes hurryLoneElection once this node leads.
func (n *Node) restoreTimeouts() {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	n.restoreTimeoutsLocked()
}

// restoreTimeoutsLocked puts back the timeouts only: runLogBound may have
// changed TrailingLogs meanwhile.
func (n *Node) restoreTimeoutsLocked() {
	if normal := n.loneTimeouts.Swap(nil); normal != nil {
		rc := n.raft.ReloadableConfig()
		rc.HeartbeatTimeout, rc.ElectionTimeout = normal.HeartbeatTimeout, normal.ElectionTimeout
		if err := n.raft.ReloadConfig(rc); err != nil {
			n.log.Warn("could not restore raft's timeouts", "err", err)
		}
	}
}
