package fsm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/storage"
)

// Config configures an FSM.
type Config struct {
	// Dir holds the FSM's Pebble database (Dir/db). Created if missing.
	Dir     string
	Bloom   bloom.Config
	Storage storage.Options
	Logger  *slog.Logger
	// Buffer bounds the write buffer (DESIGN.md, "Write buffer").
	Buffer BufferLimits
	// BloomCompactInterval is how often the background goroutine looks for
	// Bloom filter chains worth compacting (0: every 2 s). Negative turns
	// the polling off: tests that call compactFilters themselves need no
	// second compactor racing them.
	BloomCompactInterval time.Duration
	// ApplyGate, if set, is called before each batch is applied and may
	// block: the node uses it to pause applying while its disk is nearly
	// full, so Pebble never meets ENOSPC on its commit path (which
	// panics). Pausing changes no result, only when it is computed. A
	// false return (the node is shutting down) defers the batch and every
	// later one: nothing of them is written, their callers learn
	// ErrApplyDeferred (the entries are committed and apply after a
	// restart), and Snapshot refuses from then on, so no snapshot ever
	// claims an index the database does not hold.
	ApplyGate func() bool
	// RestoreRoom, if set, is called by Restore before it creates its
	// scratch database (need 0) and before each write to it (need: the
	// bytes of the batch plus those still in memtables, which a flush will
	// write), and Restore fails with its error, keeping the current state.
	// The node uses it to stop a restore before Pebble meets ENOSPC: a
	// failed flush is retried forever and a failed MANIFEST write panics.
	// Raft retries a failed restore later.
	RestoreRoom func(need uint64) error
	// windowShift overrides the window size (log2 records) of new buckets:
	// tests use a few records, so their handful of IDs spread over many
	// windows. Zero: windowShift.
	windowShift uint8
}

// BufferLimits bound the write buffer: it is committed to Pebble when
// Pebble would take it as a flushable batch (about half the memtable,
// storage.DB.LargeBatch) or when it reaches any of these. Zero fields take
// the defaults; tests set small ones to flush often.
type BufferLimits struct {
	// MaxRecords bounds the records (writes and removals of distinct IDs)
	// held in the overlay (default 1<<17).
	MaxRecords int
	// MaxEntries bounds the Raft entries applied since the last commit,
	// and so the replay after a crash (default 1<<14).
	MaxEntries int
	// MaxBytes, if > 0, commits once the pending batch holds this many
	// bytes, before Pebble's large-batch size.
	MaxBytes int
}

func (l BufferLimits) withDefaults() BufferLimits {
	if l.MaxRecords <= 0 {
		l.MaxRecords = 1 << 17
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = 1 << 14
	}
	return l
}

// FSM is dedupnode's replicated state machine: it applies Commands from the
// Raft log to a Pebble database and answers reads from it. It implements
// raft.FSM and raft.BatchingFSM. See doc.go for the apply contract.
//
// Apply, ApplyBatch, Snapshot and Restore are called by one goroutine (the
// Raft FSM loop); the read methods may be called from any goroutine.
type FSM struct {
	cfg Config
	// clusterID mirrors the state's ClusterIDSetting (set on open,
	// restore and apply), so ClusterID, which every RPC's response header
	// reads, never waits for mu behind an apply batch.
	clusterID atomic.Pointer[string]
	log       *slog.Logger
	filters   *bloom.Filters
	// checkScratch pools Check's *batchProbes.
	checkScratch sync.Pool
	// beforeScreen, if set (tests only), runs in Check between its read
	// of the namespace and the Bloom screen of its IDs, without mu.
	beforeScreen func()

	// mu guards everything below. Apply holds it exclusively for a whole
	// batch, so a reader never sees a half-applied batch; readers hold it
	// shared per ID.
	mu          sync.RWMutex
	db          *storage.DB
	st          state
	notify      chan struct{} // closed and replaced after every apply
	persistWG   sync.WaitGroup
	bg          *background
	closed      bool
	swapping    bool       // Restore is swapping the database: no new pinned snapshots
	lastDropped []keyRange // ranges to compact, handed to the compactor
	applier     *applier   // the write buffer and ApplyBatch's working state
	// flushing is the sealed write buffer being committed in the
	// background (flush.go), nil when none is; scratch is that flush's.
	flushing *flushJob
	scratch  flushScratch
	// flushWG counts background commit goroutines: Close waits for the
	// last one to exit (it retires its buffer under mu after committing).
	flushWG sync.WaitGroup
	// windowShift is the window size (log2 records) of buckets created
	// from now on (Config.windowShift).
	windowShift uint8
	// beforeFlush, if set (tests), runs in the background flush before it
	// writes: a test holds a buffer in flight with it.
	beforeFlush func()
	// beforeLogReplay, if set (tests), runs in a Bloom compaction from a
	// hash log just before the log is replayed.
	beforeLogReplay func()
	// persisted is the applied index stored in the database: st.applied
	// once the write buffer is committed, below it while it holds entries.
	persisted uint64
	deferred  bool // ApplyGate refused once: apply nothing more
}

// state is the in-memory mirror of the small, hot part of the database:
// loaded at open and restore, mutated only by apply.
type state struct {
	applied     uint64
	appliedTerm uint64
	lastTs      int64
	nsSeq       uint32
	namespaces  map[string]*NamespaceConfig
	nsByID      map[uint32]*NamespaceConfig
	// buckets lists each namespace's buckets in ascending order.
	buckets map[uint32][]uint64
	// registry holds every live bucket's entry (window.go): its record
	// count and write windows.
	registry map[bloom.Key]bucketEntry
	nodes    map[string]string
	// roles holds each node whose role is not RoleMember (read replicas).
	roles map[string]NodeRole
	// regions maps node ID → region, for the nodes that have one.
	regions map[string]string
	// settings holds the replicated cluster settings (Settings).
	settings map[string]string
	// retired holds the node IDs removed from the cluster (Retired).
	retired map[string]bool
	// fenceEpoch is the high part of every fencing token granted now
	// (MakeFence); persisted under metaFenceEpoch, so snapshots carry it.
	fenceEpoch uint64
}

type keyRange struct{ start, end []byte }

const (
	metaApplied = "applied"
	metaTs      = "ts"
	metaNsSeq   = "nsseq"
	// metaFenceEpoch is absent until the epoch first leaves 0.
	metaFenceEpoch = "fepoch"
	dbDirName      = "db"
)

// New opens (or creates) the FSM's database in cfg.Dir and starts rebuilding
// the Bloom filters in the background; until that finishes, reads go to
// storage. Startup cost is O(namespaces + buckets), not O(IDs).
func New(cfg Config) (*FSM, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Buffer = cfg.Buffer.withDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create fsm dir: %w", err)
	}
	f := &FSM{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "fsm"),
		filters: bloom.New(cfg.Bloom),
		notify:  make(chan struct{}),
		applier: &applier{sc: lookupScratch{reader: new(storage.RecordReader)}},

		windowShift: cmp.Or(cfg.windowShift, windowShift),
	}
	f.checkScratch.New = func() any { return new(batchProbes) }
	f.applier.f = f
	f.applier.discard()
	if err := f.open(); err != nil {
		return nil, err
	}
	return f, nil
}

// open opens Dir/db, loads state and starts background work. Caller holds
// mu or has exclusive access.
func (f *FSM) open() error {
	db, err := storage.Open(filepath.Join(f.cfg.Dir, dbDirName), f.storageOptions())
	if err != nil {
		return err
	}
	st, err := loadState(db, f.windowShift)
	if err != nil {
		db.Close()
		return err
	}
	f.db = db
	f.st = st
	f.setClusterID(st.settings[ClusterIDSetting])
	f.persisted = st.applied
	f.loadFilters()
	f.bg = startBackground(f)
	return nil
}

const filtersFile = "bloom.dat"

// loadFilters loads the Bloom filters saved at the last clean shutdown if
// they cover exactly the persisted applied index; otherwise (missing file,
// bad checksum, other parameters, stale index) they are discarded and
// rebuilt in the background.
func (f *FSM) loadFilters() {
	f.filters.Reset()
	path := filepath.Join(f.cfg.Dir, filtersFile)
	file, err := os.Open(path)
	if err != nil {
		return
	}
	defer file.Close()
	idx, err := f.filters.Load(file)
	switch {
	case err != nil:
		f.log.Warn("discarding saved bloom filters; rebuilding", "err", err)
	case idx != f.st.applied:
		f.log.Info("saved bloom filters are stale; rebuilding", "filters_index", idx, "applied_index", f.st.applied)
		f.filters.Reset()
	}
}

// saveFilters writes the filters for the next start (tmp file, fsync,
// rename). REQUIRES: f.mu held; filters ready.
func (f *FSM) saveFilters() error {
	path := filepath.Join(f.cfg.Dir, filtersFile)
	tmp := path + ".tmp"
	file, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = f.filters.Save(file, f.st.applied)
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save bloom filters: %w", err)
	}
	return nil
}

func (f *FSM) storageOptions() storage.Options {
	o := f.cfg.Storage
	if o.Logger == nil {
		o.Logger = f.cfg.Logger
	}
	return o
}

// loadState reads the in-memory state, initialising a fresh database with
// the default namespace (identically on every replica). A bucket
// registered by a version without windows gets windows of 1<<shift
// records for its new ones.
func loadState(db *storage.DB, shift uint8) (state, error) {
	st := state{
		namespaces: map[string]*NamespaceConfig{},
		nsByID:     map[uint32]*NamespaceConfig{},
		buckets:    map[uint32][]uint64{},
		registry:   map[bloom.Key]bucketEntry{},
		nodes:      map[string]string{},
		roles:      map[string]NodeRole{},
		regions:    map[string]string{},
		settings:   map[string]string{},
		retired:    map[string]bool{},
	}
	v, found, err := storage.GetCopy(db, storage.MetaKey(metaNsSeq))
	if err != nil {
		return st, fmt.Errorf("load state: %w", err)
	}
	if !found {
		b := db.NewBatch()
		def := DefaultNamespaceConfig(DefaultNamespace)
		def.ID = 1
		_ = b.Set(storage.NamespaceKey(def.Name), encodeNamespace(&def), nil)
		_ = b.Set(storage.MetaKey(metaNsSeq), encodeUvarint(2), nil)
		if err := b.Commit(pebble.Sync); err != nil {
			return st, fmt.Errorf("initialise state: %w", err)
		}
		b.Close()
		v = encodeUvarint(2)
	}
	seq, err := decodeUvarint(v)
	if err != nil {
		return st, fmt.Errorf("load nsseq: %w", err)
	}
	st.nsSeq = uint32(seq)
	if v, found, err := storage.GetCopy(db, storage.MetaKey(metaApplied)); err != nil {
		return st, err
	} else if found {
		if st.applied, st.appliedTerm, err = decodeApplied(v); err != nil {
			return st, err
		}
	}
	if v, found, err := storage.GetCopy(db, storage.MetaKey(metaTs)); err != nil {
		return st, err
	} else if found {
		ts, err := decodeVarint(v)
		if err != nil {
			return st, fmt.Errorf("load ts: %w", err)
		}
		st.lastTs = ts
	}
	if v, found, err := storage.GetCopy(db, storage.MetaKey(metaFenceEpoch)); err != nil {
		return st, err
	} else if found {
		e, err := decodeUvarint(v)
		if err != nil || e > MaxFenceEpoch {
			return st, fmt.Errorf("load fence epoch %d: %w", e, errors.Join(err, ErrFenceRange))
		}
		st.fenceEpoch = e
	}
	err = scanPrefix(db, []byte{storage.PrefixNamespace}, func(k, v []byte) error {
		ns, err := decodeNamespace(v)
		if err != nil {
			return err
		}
		st.namespaces[ns.Name] = &ns
		st.nsByID[ns.ID] = &ns
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load namespaces: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixBucket}, func(k, v []byte) error {
		nsID, b, ok := storage.ParseBucketKey(k)
		if !ok {
			return fmt.Errorf("bad bucket key %x", k)
		}
		e, err := decodeBucketEntry(v, shift)
		if err != nil {
			return err
		}
		st.buckets[nsID] = append(st.buckets[nsID], b) // keys are sorted
		st.registry[bloom.Key{Namespace: nsID, Bucket: b}] = e
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load buckets: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixNode}, func(k, v []byte) error {
		st.nodes[string(k[1:])] = string(v)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load nodes: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixNodeRole}, func(k, v []byte) error {
		if len(v) != 1 || NodeRole(v[0]) > RoleReplica {
			return fmt.Errorf("bad node role %x for %q", v, k[1:])
		}
		st.roles[string(k[1:])] = NodeRole(v[0])
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load node roles: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixNodeRegion}, func(k, v []byte) error {
		st.regions[string(k[1:])] = string(v)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load node regions: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixSetting}, func(k, v []byte) error {
		st.settings[string(k[1:])] = string(v)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load settings: %w", err)
	}
	err = scanPrefix(db, []byte{storage.PrefixRetiredNode}, func(k, _ []byte) error {
		st.retired[string(k[1:])] = true
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("load retired nodes: %w", err)
	}
	return st, nil
}

func scanPrefix(r pebble.Reader, prefix []byte, fn func(k, v []byte) error) error {
	return scanRange(r, prefix, storage.PrefixEnd(prefix), fn)
}

// scanRecords calls fn with every record, legacy keys first.
func scanRecords(r pebble.Reader, fn func(k, v []byte) error) error {
	for _, kr := range storage.RecordRanges() {
		if err := scanRange(r, kr.Start, kr.End, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanRange(r pebble.Reader, lower, upper []byte, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			it.Close()
			return err
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// Close stops background work and closes the database. The FSM must not be
// used afterwards.
func (f *FSM) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	bg := f.bg
	f.mu.Unlock()
	bg.stop()
	f.persistWG.Wait()
	f.mu.Lock()
	// Commit the write buffer: the saved filters cover st.applied, and
	// load only if the database's applied index is the same.
	f.flushLocked()
	if f.filters.Ready() {
		if err := f.saveFilters(); err != nil {
			f.log.Warn("bloom filters not saved; the next start rebuilds them", "err", err)
		}
	}
	err := f.db.Close()
	f.mu.Unlock()
	// The last background commit is done (flushLocked waited for it), but
	// its goroutine may still be waiting for mu to retire it: let it exit.
	f.flushWG.Wait()
	return err
}

// AppliedIndex returns the index of the last Raft entry applied: its
// effects are visible to reads, in the database or still in the write
// buffer. At open it is the index persisted with the database's data.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.applied
}

// PersistedIndex returns the applied index stored in the database with the
// data it covers (AppliedIndex less the entries in the write buffer): after
// a crash the FSM reopens at this index and Raft replays what follows.
func (f *FSM) PersistedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.persisted
}

// LastTimestamp returns the largest command timestamp applied (Unix ms).
// A new leader stamps commands with max(its clock, this) so time never goes
// backwards.
func (f *FSM) LastTimestamp() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.lastTs
}

// WaitApplied blocks until the applied index reaches index or ctx ends.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error {
	for {
		f.mu.RLock()
		applied, ch := f.st.applied, f.notify
		f.mu.RUnlock()
		if applied >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for applied index %d (at %d): %w", index, applied, ctx.Err())
		}
	}
}

// Namespace returns the config of the named namespace ("" means default).
func (f *FSM) Namespace(name string) (NamespaceConfig, bool) {
	if name == "" {
		name = DefaultNamespace
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	ns := f.st.namespaces[name]
	if ns == nil {
		return NamespaceConfig{}, false
	}
	return *ns, true
}

// Namespaces returns every namespace sorted by name.
func (f *FSM) Namespaces() []NamespaceConfig {
	f.mu.RLock()
	out := make([]NamespaceConfig, 0, len(f.st.namespaces))
	for _, ns := range f.st.namespaces {
		out = append(out, *ns)
	}
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b NamespaceConfig) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Nodes returns the known node ID → client address map.
func (f *FSM) Nodes() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.st.nodes))
	for k, v := range f.st.nodes {
		out[k] = v
	}
	return out
}

// Retired reports whether node id was removed from the cluster
// (OpRemoveNode). A retired ID is never admitted again: its old data dir
// holds a log and votes the cluster has forgotten, and the cluster could
// not tell it from the new node that took the ID.
func (f *FSM) Retired(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.retired[id]
}

// RetiredIDs returns every retired node ID (Retired), sorted.
func (f *FSM) RetiredIDs() []string {
	f.mu.RLock()
	out := make([]string, 0, len(f.st.retired))
	for id := range f.st.retired {
		out = append(out, id)
	}
	f.mu.RUnlock()
	slices.Sort(out)
	return out
}

// NodeRole returns the recorded role of node id (RoleMember unless an
// OpSetNodeRole said otherwise).
func (f *FSM) NodeRole(id string) NodeRole {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.roles[id]
}

// Replicas returns the IDs of the nodes recorded as read replicas.
func (f *FSM) Replicas() map[string]bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]bool, len(f.st.roles))
	for id, r := range f.st.roles {
		if r == RoleReplica {
			out[id] = true
		}
	}
	return out
}

// NodeRegions returns the node ID → region map of the nodes whose region
// is recorded (OpSetNodeRegion).
func (f *FSM) NodeRegions() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.st.regions))
	for k, v := range f.st.regions {
		out[k] = v
	}
	return out
}

// Settings returns the replicated cluster settings (OpSetSetting): name →
// value. A name absent from the map was never set (or was unset).
func (f *FSM) Settings() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.st.settings))
	for k, v := range f.st.settings {
		out[k] = v
	}
	return out
}

// PebbleMetrics returns the state machine database's metrics (a point-in-
// time copy), or nil once the FSM is closed.
func (f *FSM) PebbleMetrics() *pebble.Metrics {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil
	}
	return f.db.Metrics()
}

// Stats are figures for Status.
type Stats struct {
	AppliedIndex uint64
	LastTsMs     int64
	// IDsStored counts stored records, including expired ones whose bucket
	// is not yet dropped.
	IDsStored uint64
	Buckets   uint64
	Bloom     bloom.Stats
}

// Stats returns current figures.
func (f *FSM) Stats() Stats {
	f.mu.RLock()
	s := Stats{AppliedIndex: f.st.applied, LastTsMs: f.st.lastTs, Buckets: uint64(len(f.st.registry))}
	for _, e := range f.st.registry {
		s.IDsStored += e.count
	}
	f.mu.RUnlock()
	s.Bloom = f.filters.Stats()
	// Per stored ID (the filters count IDs added, including ones moved or
	// deleted since): the figure of the "≤ 10 bits per live ID" target.
	if s.IDsStored > 0 {
		s.Bloom.BitsPerID = float64(s.Bloom.MemoryBytes*8) / float64(s.IDsStored)
	}
	return s
}
