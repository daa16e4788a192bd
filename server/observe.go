package server

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/dedupnode/dedupnode/adminhttp"
	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/diskspace"
	"github.com/dedupnode/dedupnode/metrics"
)

// Metrics returns the node's Prometheus metrics.
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// AdminAddr returns the admin HTTP listener's address, or "" when off.
func (s *Server) AdminAddr() string {
	if s.admin == nil {
		return ""
	}
	return s.admin.Addr()
}

// runMetrics samples request totals for the status page's rates.
func (s *Server) runMetrics() {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.stop
		cancel()
	}()
	s.metrics.Run(ctx)
}

// metricsSnapshot feeds the metrics collector at scrape time.
func (s *Server) metricsSnapshot() metrics.Snapshot {
	st, _ := s.node.Status() // on error (shutting down) the figures read so far still hold
	snap := metrics.Snapshot{
		Raft: metrics.RaftStats{
			State:             st.State,
			LeaderKnown:       st.LeaderID != "",
			Term:              st.Term,
			CommitIndex:       st.CommitIndex,
			AppliedIndex:      st.AppliedIndex,
			LastLogIndex:      st.LastLogIndex,
			LastSnapshotIndex: st.LastSnapshotIndex,
			LogEntries:        st.LogEntries,
			LogBytes:          st.LogBytes,
			LastContact:       s.lastContact(),
		},
		Bloom: metrics.BloomStats{
			Filters:          st.FSM.Bloom.Filters,
			MemoryBytes:      st.FSM.Bloom.MemoryBytes,
			HashLogBytes:     st.FSM.Bloom.HashLogBytes,
			IDs:              st.FSM.Bloom.IDs,
			BitsPerID:        st.FSM.Bloom.BitsPerID,
			ConfiguredFPRate: st.FSM.Bloom.FPRate,
			ObservedFPRate:   st.FSM.Bloom.ObservedFPRate,
			MaybeLookups:     st.FSM.Bloom.MaybeLookups,
			FalsePositives:   st.FSM.Bloom.FalsePositives,
			Ready:            st.FSM.Bloom.Ready,
		},
		Storage: metrics.StorageStats{
			IDsStored:  st.FSM.IDsStored,
			Buckets:    st.FSM.Buckets,
			Namespaces: len(s.node.FSM().Namespaces()),
			DiskBytes:  s.diskUsage(),
		},
		Pebble:            s.node.FSM().PebbleMetrics(),
		LargestEntryBytes: int64(s.node.LargestEntry()),
		MaxEntryBytes:     int64(s.node.MaxEntryBytes()),
	}
	d := s.node.Disk()
	snap.Disk = &metrics.DiskStats{FreeBytes: d.Free, TotalBytes: d.Total, MinFreeBytes: d.MinFree, ReserveBytes: d.Reserve,
		WritesRefused: d.Low, ApplyPaused: d.Critical}
	_, snap.Disk.UsedBytes = s.diskParts()
	ls := s.node.LogStoreStats()
	snap.LogStore = &metrics.LogStoreStats{Writes: ls.Writes, WriteSeconds: ls.WriteSeconds, BucketBounds: ls.BucketBounds,
		Buckets: ls.Buckets, InProgressSeconds: ls.InProgress.Seconds(), Stalled: ls.Stalled}
	for _, m := range st.Members {
		if m.Suffrage == "voter" {
			snap.Raft.Voters++
		} else {
			snap.Raft.NonVoters++
		}
	}
	return snap
}

// lastContact is the time since the leader was last heard from: 0 on the
// leader, negative when never.
func (s *Server) lastContact() time.Duration {
	if s.node.IsLeader() {
		return 0
	}
	t := s.node.Raft().LastContact()
	if t.IsZero() {
		return -1
	}
	return time.Since(t)
}

// diskUsageCache remembers what the data directory's parts occupy on
// disk for a while.
type diskUsageCache struct {
	mu    sync.Mutex
	at    time.Time
	parts map[string]int64 // "fsm", "raft" (log and stable store), "snapshots"
	total int64
}

// diskUsage is what the data directory's files occupy on disk (allocated
// blocks, so Pebble's preallocated WAL counts in full), recomputed at most
// every 10 s (a scrape must stay cheap); -1 when it cannot be read.
func (s *Server) diskUsage() int64 {
	total, _ := s.diskParts()
	return total
}

func (s *Server) diskParts() (int64, map[string]int64) {
	c := &s.disk
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < 10*time.Second {
		return c.total, c.parts
	}
	dir := s.cfg.Cluster.DataDir
	total, err := diskspace.Allocated(dir)
	if err != nil {
		total = -1
	}
	parts := map[string]int64{}
	for name, sub := range map[string]string{"fsm": "fsm", "snapshots": filepath.Join("raft", "snapshots")} {
		if n, err := diskspace.Allocated(filepath.Join(dir, sub)); err == nil {
			parts[name] = n
		}
	}
	if n, err := diskspace.Allocated(filepath.Join(dir, "raft")); err == nil {
		parts["raft"] = n - parts["snapshots"]
	}
	c.at, c.total, c.parts = time.Now(), total, parts
	return total, parts
}

// diskStatus is the Admin.Status view of the data directory.
func (s *Server) diskStatus() *dedupv1.DiskStatus {
	d := s.node.Disk()
	out := &dedupv1.DiskStatus{DataDir: d.Dir, FreeBytes: d.Free, TotalBytes: d.Total, MinFreeBytes: d.MinFree,
		ReserveBytes: d.Reserve, WritesRefused: d.Low, ApplyPaused: d.Critical}
	if u := s.diskUsage(); u > 0 {
		out.UsedBytes = uint64(u)
	}
	return out
}

// AdminStatus gathers the status page: this node's view, each member's
// applied index (asked over gRPC, bounded by ctx and 1 s per member), request
// rates and per-namespace duplicate figures.
func (s *Server) AdminStatus(ctx context.Context) (adminhttp.Status, error) {
	st, err := s.node.Status()
	out := adminhttp.Status{
		NodeID:                 st.NodeID,
		Version:                s.cfg.Version,
		Region:                 s.node.Region(),
		PreferredLeaderRegions: s.node.PreferredLeaderRegions(),
		State:                  st.State,
		LeaderID:               st.LeaderID,
		LeaderGRPCAddr:         st.LeaderGRPCAddr,
		GRPCAddr:               s.GRPCAddr(),
		RaftAddr:               s.RaftAddr(),
		Term:                   st.Term,
		CommitIndex:            st.CommitIndex,
		AppliedIndex:           st.AppliedIndex,
		LastLogIndex:           st.LastLogIndex,
		LastSnapshotIndex:      st.LastSnapshotIndex,
		LastContact:            s.lastContact(),
		Bloom: adminhttp.Bloom{
			Filters:          st.FSM.Bloom.Filters,
			MemoryBytes:      st.FSM.Bloom.MemoryBytes,
			IDs:              st.FSM.Bloom.IDs,
			BitsPerID:        st.FSM.Bloom.BitsPerID,
			ConfiguredFPRate: st.FSM.Bloom.FPRate,
			ObservedFPRate:   st.FSM.Bloom.ObservedFPRate,
			Ready:            st.FSM.Bloom.Ready,
		},
		Storage:     adminhttp.Storage{IDsStored: st.FSM.IDsStored, Buckets: st.FSM.Buckets},
		StartedAt:   s.started,
		GeneratedAt: time.Now(),
	}
	if d := s.diskUsage(); d > 0 {
		out.Storage.DiskBytes = uint64(d)
	}
	out.Healthy, out.HealthReason = s.node.Health()
	d := s.node.Disk()
	out.Disk = adminhttp.Disk{Dir: d.Dir, FreeBytes: d.Free, TotalBytes: d.Total, MinFreeBytes: d.MinFree, ReserveBytes: d.Reserve,
		WritesRefused: d.Low, ApplyPaused: d.Critical, LogStoreStalled: s.node.LogStoreStats().Stalled}
	_, out.Disk.UsedBytes = s.diskParts()

	// Members: their applied index, asked in parallel; lag against the
	// highest commit index this node knows.
	out.Members = make([]adminhttp.Member, len(st.Members))
	var wg sync.WaitGroup
	for i, m := range st.Members {
		am := adminhttp.Member{ID: m.ID, RaftAddr: m.RaftAddr, GRPCAddr: m.GRPCAddr, Suffrage: m.Suffrage, Lag: -1,
			Region: m.Region, Preferred: m.Region != "" && slices.Contains(out.PreferredLeaderRegions, m.Region)}
		switch {
		case m.Leader:
			am.Role = "leader"
		case m.ID == st.NodeID:
			am.Role = st.State
		case st.LeaderID != "":
			am.Role = "follower"
		}
		if m.ID == st.NodeID {
			am.AppliedIndex = st.AppliedIndex
			am.Lag = lag(st.CommitIndex, st.AppliedIndex)
			out.Members[i] = am
			continue
		}
		out.Members[i] = am
		if m.GRPCAddr == "" {
			out.Members[i].Error = "client address unknown"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			applied, err := s.probeProgress(pctx, m.ID, m.GRPCAddr)
			if err != nil {
				out.Members[i].Error = err.Error()
				return
			}
			out.Members[i].AppliedIndex = applied
			out.Members[i].Lag = lag(st.CommitIndex, applied)
		}()
	}
	wg.Wait()

	for _, r := range s.metrics.RequestRates() {
		out.Requests = append(out.Requests, adminhttp.RequestRate{Op: r.Op, PerSecond: r.PerSecond, ErrorsPerSecond: r.ErrorsPerSecond, Total: r.Total})
	}
	seen := map[string]metrics.NamespaceStats{}
	for _, n := range s.metrics.Namespaces() {
		seen[n.Name] = n
	}
	for _, ns := range s.node.FSM().Namespaces() {
		t := seen[ns.Name]
		out.Namespaces = append(out.Namespaces, adminhttp.Namespace{
			Name:           ns.Name,
			DefaultTTL:     time.Duration(ns.DefaultTTLMs) * time.Millisecond,
			MaxTTL:         time.Duration(ns.MaxTTLMs) * time.Millisecond,
			Mode:           ns.Mode.String(),
			New:            t.New,
			Duplicates:     t.Duplicate,
			Conflicts:      t.Conflict,
			DuplicateRatio: t.DuplicateRatio,
		})
	}
	return out, err
}

func lag(commit, applied uint64) int64 {
	if applied >= commit {
		return 0
	}
	return int64(commit - applied)
}
