package metrics

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// Source supplies a node's figures. Snapshot is called on every scrape,
// possibly concurrently with everything else the node does: it must be
// cheap (no I/O beyond reading counters) and safe for concurrent use.
type Source interface {
	Snapshot() Snapshot
}

// SourceFunc adapts a function to Source.
type SourceFunc func() Snapshot

// Snapshot calls f.
func (f SourceFunc) Snapshot() Snapshot { return f() }

// Snapshot is a node's figures at one moment.
type Snapshot struct {
	Raft    RaftStats
	Bloom   BloomStats
	Storage StorageStats
	// Pebble is the state machine's Pebble metrics; nil leaves them out.
	Pebble *pebble.Metrics
	// Disk is the data directory's filesystem; nil leaves it out.
	Disk *DiskStats
	// LogStore is the Raft log store's write figures; nil leaves them out.
	LogStore *LogStoreStats
	// LargestEntryBytes is the largest Raft entry this node proposed;
	// MaxEntryBytes the configured limit.
	LargestEntryBytes, MaxEntryBytes int64
}

// DiskStats describe the data directory's filesystem.
type DiskStats struct {
	FreeBytes, TotalBytes uint64
	// MinFreeBytes: below it client writes are refused (WritesRefused);
	// ReserveBytes: below it applying pauses (ApplyPaused).
	MinFreeBytes, ReserveBytes uint64
	WritesRefused, ApplyPaused bool
	// UsedBytes are the bytes the node's files occupy on disk (allocated
	// blocks) by part: fsm, raft, snapshots.
	UsedBytes map[string]int64
}

// LogStoreStats are the Raft log store's write latency figures.
type LogStoreStats struct {
	// Writes and WriteSeconds are the count and sum of write durations;
	// Buckets[i] counts writes of at most BucketBounds[i] seconds
	// (cumulative).
	Writes       uint64
	WriteSeconds float64
	BucketBounds []float64
	Buckets      []uint64
	// InProgressSeconds is how long the write in progress has run (0:
	// none); Stalled that it has run past the stall limit.
	InProgressSeconds float64
	Stalled           bool
}

// RaftStats are Raft figures from this node's point of view.
type RaftStats struct {
	// State is leader, follower, candidate or shutdown.
	State string
	// LeaderKnown: this node knows a current leader.
	LeaderKnown bool
	Term        uint64
	// CommitIndex is the highest log index known committed; AppliedIndex
	// the highest whose effects are stored in the state machine.
	CommitIndex, AppliedIndex uint64
	LastLogIndex              uint64
	LastSnapshotIndex         uint64
	// LogEntries and LogBytes are what the Raft log holds.
	LogEntries, LogBytes uint64
	// LastContact is the time since the leader was last heard from (0 on
	// the leader); negative when never.
	LastContact time.Duration
	// Voters and NonVoters in the current configuration.
	Voters, NonVoters int
}

// BloomStats are the node's Bloom filter figures.
type BloomStats struct {
	Filters, MemoryBytes, IDs uint64
	// HashLogBytes is the memory of the hashes kept to compact growing
	// filters without reading storage.
	HashLogBytes     uint64
	BitsPerID        float64
	ConfiguredFPRate float64
	ObservedFPRate   float64
	// MaybeLookups and FalsePositives count since start.
	MaybeLookups, FalsePositives uint64
	Ready                        bool
}

// StorageStats are the state machine's figures.
type StorageStats struct {
	// IDsStored counts stored records, including expired ones whose bucket
	// is not yet dropped.
	IDsStored  uint64
	Buckets    uint64
	Namespaces int
	// DiskBytes is the size of the node's data directory (Raft log,
	// snapshots, Pebble); negative when unknown.
	DiskBytes int64
}

var raftStates = []string{"leader", "follower", "candidate", "shutdown"}

type desc struct {
	d     *prometheus.Desc
	kind  prometheus.ValueType
	value func(*Snapshot) (float64, bool)
}

func gauge(name, help string, v func(*Snapshot) float64) desc {
	return desc{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, func(s *Snapshot) (float64, bool) { return v(s), true }}
}

func counter(name, help string, v func(*Snapshot) float64) desc {
	return desc{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, func(s *Snapshot) (float64, bool) { return v(s), true }}
}

func pebbleGauge(name, help string, v func(*pebble.Metrics) float64) desc {
	return desc{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, func(s *Snapshot) (float64, bool) {
		if s.Pebble == nil {
			return 0, false
		}
		return v(s.Pebble), true
	}}
}

func pebbleCounter(name, help string, v func(*pebble.Metrics) float64) desc {
	d := pebbleGauge(name, help, v)
	d.kind = prometheus.CounterValue
	return d
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var nodeDescs = []desc{
	gauge("dedup_raft_leader_known", "1 if this node knows a current Raft leader.", func(s *Snapshot) float64 { return b2f(s.Raft.LeaderKnown) }),
	gauge("dedup_raft_term", "Current Raft term.", func(s *Snapshot) float64 { return float64(s.Raft.Term) }),
	gauge("dedup_raft_commit_index", "Highest Raft log index known to be committed.", func(s *Snapshot) float64 { return float64(s.Raft.CommitIndex) }),
	gauge("dedup_raft_applied_index", "Highest Raft log index whose effects the state machine has stored.", func(s *Snapshot) float64 { return float64(s.Raft.AppliedIndex) }),
	gauge("dedup_raft_last_log_index", "Last index in this node's Raft log.", func(s *Snapshot) float64 { return float64(s.Raft.LastLogIndex) }),
	gauge("dedup_raft_last_snapshot_index", "Raft index of the latest snapshot.", func(s *Snapshot) float64 { return float64(s.Raft.LastSnapshotIndex) }),
	gauge("dedup_raft_log_entries", "Entries in this node's Raft log.", func(s *Snapshot) float64 { return float64(s.Raft.LogEntries) }),
	gauge("dedup_raft_log_bytes", "Bytes of the entries in this node's Raft log (serve --raft-log-max-bytes bounds it).", func(s *Snapshot) float64 { return float64(s.Raft.LogBytes) }),
	{prometheus.NewDesc("dedup_raft_last_contact_seconds", "Seconds since this node last heard from the leader (0 on the leader); absent if never.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) { return s.Raft.LastContact.Seconds(), s.Raft.LastContact >= 0 }},
	gauge("dedup_raft_voters", "Voters in the current Raft configuration.", func(s *Snapshot) float64 { return float64(s.Raft.Voters) }),
	gauge("dedup_raft_nonvoters", "Non-voters in the current Raft configuration.", func(s *Snapshot) float64 { return float64(s.Raft.NonVoters) }),

	gauge("dedup_bloom_filters", "Bloom filter segments held.", func(s *Snapshot) float64 { return float64(s.Bloom.Filters) }),
	gauge("dedup_bloom_memory_bytes", "Memory held by Bloom filters, in bytes.", func(s *Snapshot) float64 { return float64(s.Bloom.MemoryBytes) }),
	gauge("dedup_bloom_hash_log_bytes", "Memory held by the hashes of IDs kept to compact growing Bloom filters without a storage scan, in bytes.", func(s *Snapshot) float64 { return float64(s.Bloom.HashLogBytes) }),
	gauge("dedup_bloom_ids", "IDs added to the live Bloom filters.", func(s *Snapshot) float64 { return float64(s.Bloom.IDs) }),
	gauge("dedup_bloom_bits_per_id", "Bloom filter bits per stored ID.", func(s *Snapshot) float64 { return s.Bloom.BitsPerID }),
	gauge("dedup_bloom_configured_fp_rate", "Configured Bloom filter false-positive rate (0..1).", func(s *Snapshot) float64 { return s.Bloom.ConfiguredFPRate }),
	gauge("dedup_bloom_observed_fp_rate", "Observed Bloom filter false-positive rate (0..1): lookups of absent IDs the filters answered \"maybe\".", func(s *Snapshot) float64 { return s.Bloom.ObservedFPRate }),
	counter("dedup_bloom_maybe_lookups_total", "Bloom lookups answered \"maybe\" (went to Pebble).", func(s *Snapshot) float64 { return float64(s.Bloom.MaybeLookups) }),
	counter("dedup_bloom_false_positives_total", "Bloom \"maybe\" answers for IDs Pebble did not hold.", func(s *Snapshot) float64 { return float64(s.Bloom.FalsePositives) }),
	gauge("dedup_bloom_ready", "1 when the Bloom filters are built; 0 while rebuilding (reads then go to Pebble).", func(s *Snapshot) float64 { return b2f(s.Bloom.Ready) }),

	gauge("dedup_storage_ids", "Records stored, including expired ones whose bucket is not yet dropped.", func(s *Snapshot) float64 { return float64(s.Storage.IDsStored) }),
	gauge("dedup_storage_buckets", "Expiry buckets stored.", func(s *Snapshot) float64 { return float64(s.Storage.Buckets) }),
	{prometheus.NewDesc("dedup_storage_disk_bytes", "Bytes the node's data directory (Raft log, snapshots and Pebble) occupies on disk: allocated blocks, so preallocated WAL files count in full.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) { return float64(s.Storage.DiskBytes), s.Storage.DiskBytes >= 0 }},
	gauge("dedup_namespaces", "Namespaces defined.", func(s *Snapshot) float64 { return float64(s.Storage.Namespaces) }),

	pebbleGauge("dedup_pebble_disk_usage_bytes", "Disk space Pebble accounts for (sstables, WAL, manifests), in bytes: logical sizes, without the WAL's preallocated tail; dedup_disk_used_bytes{part=\"fsm\"} is what it occupies on disk.", func(m *pebble.Metrics) float64 { return float64(m.DiskSpaceUsage()) }),
	pebbleGauge("dedup_pebble_read_amplification", "Pebble read amplification (sublevels in L0 plus non-empty lower levels).", func(m *pebble.Metrics) float64 { return float64(m.ReadAmp()) }),
	pebbleGauge("dedup_pebble_l0_files", "Pebble sstables in L0.", func(m *pebble.Metrics) float64 { return float64(m.Levels[0].TablesCount) }),
	pebbleGauge("dedup_pebble_l0_sublevels", "Pebble L0 sublevels.", func(m *pebble.Metrics) float64 { return float64(m.Levels[0].Sublevels) }),
	pebbleGauge("dedup_pebble_compaction_debt_bytes", "Estimated bytes Pebble must compact to reach a stable shape.", func(m *pebble.Metrics) float64 { return float64(m.Compact.EstimatedDebt) }),
	pebbleGauge("dedup_pebble_compactions_in_progress", "Pebble compactions running.", func(m *pebble.Metrics) float64 { return float64(m.Compact.NumInProgress) }),
	pebbleCounter("dedup_pebble_compactions_total", "Pebble compactions completed.", func(m *pebble.Metrics) float64 { return float64(m.Compact.Count) }),
	pebbleCounter("dedup_pebble_flushes_total", "Pebble memtable flushes completed.", func(m *pebble.Metrics) float64 { return float64(m.Flush.Count) }),
	pebbleCounter("dedup_pebble_flush_written_bytes_total", "Bytes Pebble wrote to sstables by memtable flushes.", func(m *pebble.Metrics) float64 {
		return float64(m.Levels[0].TableBytesFlushed + m.Levels[0].BlobBytesFlushed)
	}),
	pebbleCounter("dedup_pebble_compaction_read_bytes_total", "Bytes Pebble read from sstables for compactions, all levels.", func(m *pebble.Metrics) float64 {
		var n uint64
		for i := range m.Levels {
			n += m.Levels[i].TableBytesRead
		}
		return float64(n)
	}),
	pebbleCounter("dedup_pebble_compaction_written_bytes_total", "Bytes Pebble wrote to sstables by compactions, all levels (with the flush bytes and the WAL bytes: Pebble's write amplification).", func(m *pebble.Metrics) float64 {
		var n uint64
		for i := range m.Levels {
			n += m.Levels[i].TableBytesCompacted + m.Levels[i].BlobBytesCompacted
		}
		return float64(n)
	}),
	pebbleCounter("dedup_pebble_wal_written_bytes_total", "Bytes Pebble wrote to its write-ahead log (the FSM's buffer commits).", func(m *pebble.Metrics) float64 { return float64(m.WAL.BytesWritten) }),
	pebbleGauge("dedup_pebble_memtable_bytes", "Bytes in Pebble memtables.", func(m *pebble.Metrics) float64 { return float64(m.MemTable.Size) }),
	pebbleGauge("dedup_pebble_live_sstable_bytes", "Bytes of live Pebble sstables.", func(m *pebble.Metrics) float64 { return float64(m.Table.Local.LiveSize) }),
	pebbleGauge("dedup_pebble_range_deletion_garbage_bytes", "Estimated bytes covered by range deletions (expired buckets) not yet compacted away.", func(m *pebble.Metrics) float64 {
		return float64(m.Table.Garbage.RangeDeletionsBytesEstimate)
	}),
	pebbleGauge("dedup_pebble_wal_bytes", "Bytes in Pebble's write-ahead log.", func(m *pebble.Metrics) float64 { return float64(m.WAL.PhysicalSize) }),
	pebbleGauge("dedup_pebble_block_cache_bytes", "Bytes in Pebble's block cache.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Size) }),
	pebbleCounter("dedup_pebble_block_cache_hits_total", "Pebble block cache hits.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Hits) }),
	pebbleCounter("dedup_pebble_block_cache_misses_total", "Pebble block cache misses.", func(m *pebble.Metrics) float64 { return float64(m.BlockCache.Misses) }),
}

func diskGauge(name, help string, v func(*DiskStats) float64) desc {
	return desc{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, func(s *Snapshot) (float64, bool) {
		if s.Disk == nil {
			return 0, false
		}
		return v(s.Disk), true
	}}
}

var diskDescs = []desc{
	diskGauge("dedup_disk_free_bytes", "Free bytes on the data directory's filesystem (available to the node).", func(d *DiskStats) float64 { return float64(d.FreeBytes) }),
	diskGauge("dedup_disk_total_bytes", "Size of the data directory's filesystem, in bytes.", func(d *DiskStats) float64 { return float64(d.TotalBytes) }),
	diskGauge("dedup_disk_min_free_bytes", "Free space below which the node refuses client writes (--min-free-disk, or the automatic threshold).", func(d *DiskStats) float64 { return float64(d.MinFreeBytes) }),
	diskGauge("dedup_disk_reserve_bytes", "Free space below which the node pauses applying the Raft log (what Pebble needs to rotate its WAL and flush).", func(d *DiskStats) float64 { return float64(d.ReserveBytes) }),
	diskGauge("dedup_disk_writes_refused", "1 while the node refuses client writes for want of free disk space.", func(d *DiskStats) float64 { return b2f(d.WritesRefused) }),
	diskGauge("dedup_disk_apply_paused", "1 while the node pauses applying the Raft log for want of free disk space.", func(d *DiskStats) float64 { return b2f(d.ApplyPaused) }),
	{prometheus.NewDesc("dedup_raft_log_store_stalled", "1 while a Raft log store write has run past the stall limit (--raft-log-stall-timeout): the node does not lead or replicate.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) {
			return b2f(s.LogStore != nil && s.LogStore.Stalled), s.LogStore != nil
		}},
	{prometheus.NewDesc("dedup_raft_log_store_write_in_progress_seconds", "How long the Raft log store write in progress has run (0 when none): a stalled disk shows here before the stall limit.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) {
			if s.LogStore == nil {
				return 0, false
			}
			return s.LogStore.InProgressSeconds, true
		}},
	{prometheus.NewDesc("dedup_raft_entry_max_bytes", "Largest Raft entry this node proposed since start, in bytes.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) { return float64(s.LargestEntryBytes), s.MaxEntryBytes > 0 }},
	{prometheus.NewDesc("dedup_raft_entry_limit_bytes", "Largest Raft entry allowed (--max-entry-bytes); larger requests are refused with RESOURCE_EXHAUSTED.", nil, nil), prometheus.GaugeValue,
		func(s *Snapshot) (float64, bool) { return float64(s.MaxEntryBytes), s.MaxEntryBytes > 0 }},
}

var (
	diskUsedDesc = prometheus.NewDesc("dedup_disk_used_bytes", "Bytes the node's files occupy on disk (allocated blocks, so Pebble's preallocated WAL counts in full), by part: fsm (Pebble), raft (log and stable store), snapshots.", []string{"part"}, nil)
	logWriteDesc = prometheus.NewDesc("dedup_raft_log_store_write_seconds", "Duration of Raft log store writes (StoreLogs), in seconds.", nil, nil)
)

var raftStateDesc = prometheus.NewDesc("dedup_raft_state", "1 for this node's current Raft state, 0 for the others.", []string{"state"}, nil)

type nodeCollector struct{ src Source }

func newNodeCollector(src Source) *nodeCollector { return &nodeCollector{src: src} }

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- raftStateDesc
	ch <- diskUsedDesc
	ch <- logWriteDesc
	for _, d := range nodeDescs {
		ch <- d.d
	}
	for _, d := range diskDescs {
		ch <- d.d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	for _, st := range raftStates {
		ch <- prometheus.MustNewConstMetric(raftStateDesc, prometheus.GaugeValue, b2f(s.Raft.State == st), st)
	}
	for _, d := range nodeDescs {
		if v, ok := d.value(&s); ok {
			ch <- prometheus.MustNewConstMetric(d.d, d.kind, v)
		}
	}
	for _, d := range diskDescs {
		if v, ok := d.value(&s); ok {
			ch <- prometheus.MustNewConstMetric(d.d, d.kind, v)
		}
	}
	if s.Disk != nil {
		for part, n := range s.Disk.UsedBytes {
			ch <- prometheus.MustNewConstMetric(diskUsedDesc, prometheus.GaugeValue, float64(n), part)
		}
	}
	if ls := s.LogStore; ls != nil && len(ls.BucketBounds) == len(ls.Buckets) {
		b := make(map[float64]uint64, len(ls.Buckets))
		for i, ub := range ls.BucketBounds {
			b[ub] = ls.Buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(logWriteDesc, ls.Writes, ls.WriteSeconds, b)
	}
}

// CertExpiry returns a gauge dedup_tls_cert_expiry_timestamp_seconds with
// label cert=name: the Unix time at which the certificate notAfter returns
// expires (read at scrape time, so a reloaded certificate shows at once).
// Register it in the node's registry. Alert when it comes near.
func CertExpiry(name string, notAfter func() time.Time) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "dedup_tls_cert_expiry_timestamp_seconds",
		Help:        "Unix time at which the node's TLS certificate expires.",
		ConstLabels: prometheus.Labels{"cert": name},
	}, func() float64 { return float64(notAfter().Unix()) })
}
