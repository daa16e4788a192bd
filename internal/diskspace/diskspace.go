// Package diskspace measures a data directory's filesystem: free bytes
// (statfs) and bytes really allocated by files (st_blocks, not st_size, so a
// preallocated or sparse file counts for what it holds on disk). A Monitor
// polls the free space and tells a node when to refuse writes (below the
// configured minimum) and when its state machine must pause applying (below
// the reserve it needs to rotate Pebble's WAL and flush a memtable), so the
// node never meets ENOSPC on a path that panics (Pebble's commit path,
// hashicorp/raft's stable store).
package diskspace

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Free returns the bytes available to an unprivileged writer (f_bavail) and
// the filesystem's size for the filesystem holding path.
func Free(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// CapacityNearest returns the most the filesystem holding dir (its nearest
// existing ancestor, measured) can ever have free for an unprivileged
// writer: its size less the blocks reserved for root (what f_bavail reaches
// with every file deleted).
func CapacityNearest(dir string) (capacity uint64, measured string, err error) {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st syscall.Statfs_t
		err = syscall.Statfs(d, &st)
		if err == nil {
			return (st.Blocks - (st.Bfree - st.Bavail)) * uint64(st.Bsize), d, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return 0, d, fmt.Errorf("statfs %s: %w", d, err)
		}
	}
}

// Allocated returns the bytes the regular files under dir occupy on disk
// (st_blocks × 512): Pebble's preallocated WAL counts in full, a sparse
// file only for its written blocks. Files vanishing during the walk (a
// compaction) are skipped. A missing dir is 0.
func Allocated(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return nil // unreadable entries are skipped, not fatal
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += fi.Size()
		}
		return nil
	})
	return total, err
}

// FreeNearest is Free for the nearest existing ancestor of dir (dir
// itself when it exists): a data dir not created yet will take its space
// from there. It returns the path measured.
func FreeNearest(dir string) (free, total uint64, measured string, err error) {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		free, total, err = Free(d)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return free, total, d, err
		}
	}
}

// RoomError says an operation on a data dir needs more free space than its
// filesystem has. It matches ErrLowSpace. Callers that must not start the
// operation on a full disk (a node starting, a snapshot restore) return it
// before writing anything, so the disk never fills under Pebble or Raft,
// which panic on some failed writes.
type RoomError struct {
	Path string // the data directory (or the part of it written)
	Op   string // what needs the space: "starting", "restoring a snapshot"
	Free uint64 // bytes free when measured
	Need uint64 // bytes Op needs free
	// Parts says what Need is made of, for the operator
	// ("apply reserve 8.2 MiB + one 16.0 MiB Raft log segment").
	Parts string
	// Fix says what to do and what happened meanwhile.
	Fix string
}

func (e *RoomError) Error() string {
	msg := fmt.Sprintf("%s: data dir %s has %s free, %s needs at least %s", ErrLowSpace, e.Path, Bytes(e.Free), e.Op, Bytes(e.Need))
	if e.Parts != "" {
		msg += " (" + e.Parts + ")"
	}
	if e.Fix != "" {
		msg += ": " + e.Fix
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrLowSpace) true.
func (e *RoomError) Unwrap() error { return ErrLowSpace }

// ErrLowSpace is matched (errors.Is) by every *LowSpaceError.
var ErrLowSpace = errors.New("not enough free disk space")

// LowSpaceError says which directory is short of space and by how much.
type LowSpaceError struct {
	Path    string // the data directory
	Free    uint64 // bytes free when last measured
	MinFree uint64 // the threshold below which writes are refused
	// ResumeFree is the free space above which writes resume: MinFree
	// plus a margin (ResumeAt), so a node at the edge does not flap. Free
	// may be above MinFree and still below it.
	ResumeFree uint64
}

func (e *LowSpaceError) Error() string {
	return fmt.Sprintf("%s: data dir %s has %s free; writes are refused until %s are free (--min-free-disk %s, plus 1/16 once refused), reads are still served",
		ErrLowSpace, e.Path, Bytes(e.Free), Bytes(e.ResumeFree), Bytes(e.MinFree))
}

// Unwrap makes errors.Is(err, ErrLowSpace) true.
func (e *LowSpaceError) Unwrap() error { return ErrLowSpace }

// Bytes formats n in binary units (12.3 MiB).
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// Config configures a Monitor.
type Config struct {
	// Dir is the data directory measured.
	Dir string
	// MinFree is the free space below which writes are refused. Zero means
	// automatic: AutoBase plus twice what the state machine's directory
	// (AutoDir) occupies, room for one snapshot and one full compaction.
	MinFree uint64
	// AutoBase and AutoDir are the automatic threshold's parts.
	AutoBase uint64
	AutoDir  string
	// Reserve is the free space below which the state machine pauses
	// applying (its own writes need it). It must be less than MinFree.
	Reserve uint64
	// Interval is how often free space is measured (default 250 ms);
	// directory sizes are walked every 20 intervals.
	Interval time.Duration
	// Logger receives state changes.
	Logger *slog.Logger
	// free replaces Free in tests of the monitor's logic.
	free func(string) (uint64, uint64, error)
}

// nearBandMin and nearRecheck: within max(MinFree/4, nearBandMin) above
// the threshold, WriteErr measures free space itself when the last
// measurement is nearRecheck old (WriteErr).
const (
	nearBandMin = 32 << 20
	nearRecheck = 5 * time.Millisecond
)

// ResumeAt is the free space above which a node refusing writes for
// minFree accepts them again: minFree plus a margin of 1/16 of it.
func ResumeAt(minFree uint64) uint64 { return minFree + minFree/16 }

// State is one measurement.
type State struct {
	Dir         string
	Free, Total uint64
	MinFree     uint64 // the threshold in force (automatic or configured)
	Reserve     uint64
	// Low: free < MinFree (or the last measurement failed): client writes
	// are refused. It clears once free space is back above MinFree plus a
	// margin (1/16 of MinFree), so a node at the edge does not flap.
	Low bool
	// Critical: free < Reserve: the state machine pauses applying.
	Critical bool
	// Err is the last measurement error, if any.
	Err error
	At  time.Time
}

// Monitor polls one data directory's free space. Safe for concurrent use.
type Monitor struct {
	cfg   Config
	log   *slog.Logger
	state atomic.Pointer[State]

	measureMu sync.Mutex // one measurement at a time: transitions log once
	mu        sync.Mutex
	changed   chan struct{} // closed and replaced when Critical clears
	autoDir   uint64        // bytes of AutoDir at the last walk

	stop chan struct{}
	done chan struct{}
}

// New measures once and starts polling.
func New(cfg Config) *Monitor {
	if cfg.Interval <= 0 {
		cfg.Interval = 250 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.free == nil {
		cfg.free = Free
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger.With("component", "diskspace", "dir", cfg.Dir),
		changed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	m.walk()
	m.measure()
	go m.run()
	return m
}

// Close stops polling and releases every WaitRoom caller (they return
// false).
func (m *Monitor) Close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

func (m *Monitor) run() {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-t.C:
		case <-m.stop:
			return
		}
		if i%20 == 0 {
			m.walk()
		}
		m.measure()
	}
}

func (m *Monitor) walk() {
	if m.cfg.MinFree != 0 || m.cfg.AutoDir == "" {
		return
	}
	n, _ := Allocated(m.cfg.AutoDir)
	m.mu.Lock()
	m.autoDir = uint64(max(n, 0))
	m.mu.Unlock()
}

// minFree is the threshold in force.
func (m *Monitor) minFree() uint64 {
	if m.cfg.MinFree != 0 {
		return m.cfg.MinFree
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.cfg.AutoBase+2*m.autoDir, m.cfg.Reserve*2)
}

// Measure measures now (the poller does it every Interval) and returns the
// new state.
func (m *Monitor) Measure() State { return m.measure() }

func (m *Monitor) measure() State {
	m.measureMu.Lock()
	defer m.measureMu.Unlock()
	free, total, err := m.cfg.free(m.cfg.Dir)
	prev := m.state.Load()
	st := State{Dir: m.cfg.Dir, Free: free, Total: total, MinFree: m.minFree(), Reserve: m.cfg.Reserve, Err: err, At: time.Now()}
	switch {
	case err != nil:
		st.Low = true // cannot tell: refuse writes rather than risk ENOSPC
		if prev != nil {
			st.Critical = prev.Critical
		}
	case prev != nil && prev.Low:
		st.Low = free < ResumeAt(st.MinFree)
	default:
		st.Low = free < st.MinFree
	}
	if err == nil {
		st.Critical = free < st.Reserve
	}
	m.state.Store(&st)
	if prev == nil || prev.Low != st.Low || prev.Critical != st.Critical {
		switch {
		case st.Critical:
			m.log.Error("disk nearly full: the state machine pauses applying until space is freed",
				"free", Bytes(st.Free), "reserve", Bytes(st.Reserve), "min_free", Bytes(st.MinFree), "err", st.Err)
		case st.Low:
			m.log.Error("disk space low: refusing client writes until space is freed (reads are still served)",
				"free", Bytes(st.Free), "min_free", Bytes(st.MinFree), "err", st.Err)
		case prev != nil:
			m.log.Info("disk space back above the minimum: accepting writes again", "free", Bytes(st.Free), "min_free", Bytes(st.MinFree))
		}
	}
	if prev != nil && prev.Critical && !st.Critical {
		m.mu.Lock()
		close(m.changed)
		m.changed = make(chan struct{})
		m.mu.Unlock()
	}
	return st
}

// State returns the latest measurement.
func (m *Monitor) State() State { return *m.state.Load() }

// WriteErr returns a *LowSpaceError while client writes must be refused,
// else nil.
//
// Near the threshold the poller's last measurement is not enough: a fast
// writer fills the margin between two polls (at 100 MB/s a 250 ms poll
// is 25 MB late) and the Raft log runs into ENOSPC before writes are
// refused. Within nearBand of the threshold a write measures again
// itself, at most every nearRecheck, so the overshoot is what the node
// writes in that time.
func (m *Monitor) WriteErr() error {
	st := m.state.Load()
	if !st.Low && st.Err == nil && st.Free < st.MinFree+max(st.MinFree/4, nearBandMin) && time.Since(st.At) >= nearRecheck {
		m.measure()
		st = m.state.Load()
	}
	if !st.Low {
		return nil
	}
	if st.Err != nil {
		return fmt.Errorf("%w: cannot measure free space of %s: %w", ErrLowSpace, st.Dir, st.Err)
	}
	return &LowSpaceError{Path: st.Dir, Free: st.Free, MinFree: st.MinFree, ResumeFree: ResumeAt(st.MinFree)}
}

// Room measures free space now and returns a *RoomError when it is less
// than the reserve plus need, the bytes op is about to write; fix goes
// into the error (RoomError.Fix). A failed measurement is an error too:
// the caller must not write when it cannot tell.
func (m *Monitor) Room(op, fix string, need uint64) error {
	st := m.measure()
	if st.Err != nil {
		return fmt.Errorf("%w: cannot measure free space of %s before %s: %w", ErrLowSpace, st.Dir, op, st.Err)
	}
	if st.Free >= st.Reserve+need {
		return nil
	}
	return &RoomError{Path: st.Dir, Op: op, Free: st.Free, Need: st.Reserve + need,
		Parts: "apply reserve " + Bytes(st.Reserve) + " + " + Bytes(need) + " to write", Fix: fix}
}

// WaitRoom blocks while free space is below the reserve, re-measuring at
// every poll. It returns true once there is room, false when ctx ends or
// the monitor is closed first.
func (m *Monitor) WaitRoom(ctx context.Context) bool {
	if !m.state.Load().Critical {
		return true
	}
	if !m.measure().Critical {
		return true
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.mu.Lock()
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			return false
		case <-m.stop:
			return false
		}
		if !m.state.Load().Critical {
			return true
		}
	}
}
