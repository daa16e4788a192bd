package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Log store write latency buckets (seconds) of LogStoreStats.
var logStoreBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// stallGuard is a raft.LogStore wrapper that times every write (StoreLogs,
// StoreLog) so a watchdog can tell when one has not returned for too long.
// hashicorp/raft's leader appends on its main goroutine (dispatchLogs)
// while separate goroutines keep heartbeating, so a log store that hangs
// without an error leaves a leader that followers never replace and that
// commits nothing (hashicorp/raft#503). Any raft.LogStore can be wrapped
// (bbolt, raft-wal): the guard knows nothing of the store.
type stallGuard struct {
	raft.LogStore

	started atomic.Int64 // UnixNano of the write in progress, 0 when none
	count   atomic.Uint64
	sumNs   atomic.Uint64
	maxNs   atomic.Int64 // longest write seen
	buckets [14]atomic.Uint64
}

var _ raft.LogStore = (*stallGuard)(nil)
var _ raft.MonotonicLogStore = (*stallGuard)(nil)

func newStallGuard(s raft.LogStore) *stallGuard { return &stallGuard{LogStore: s} }

// IsMonotonic passes the store's answer through.
func (g *stallGuard) IsMonotonic() bool {
	m, ok := g.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (g *stallGuard) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

func (g *stallGuard) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	g.started.Store(start.UnixNano())
	err := g.LogStore.StoreLogs(logs)
	g.started.Store(0)
	g.observe(time.Since(start))
	return err
}

func (g *stallGuard) observe(d time.Duration) {
	g.count.Add(1)
	g.sumNs.Add(uint64(d))
	for {
		m := g.maxNs.Load()
		if int64(d) <= m || g.maxNs.CompareAndSwap(m, int64(d)) {
			break
		}
	}
	s := d.Seconds()
	i := 0
	for i < len(logStoreBuckets) && s > logStoreBuckets[i] {
		i++
	}
	g.buckets[i].Add(1)
}

// inProgress returns how long the current write has been running, 0 when
// none is.
func (g *stallGuard) inProgress() time.Duration {
	s := g.started.Load()
	if s == 0 {
		return 0
	}
	return time.Since(time.Unix(0, s))
}

// LogStoreStats are the Raft log store's write figures.
type LogStoreStats struct {
	// Writes, WriteSeconds and Buckets form a histogram of write latency:
	// Buckets[i] counts writes of at most BucketBounds[i] seconds
	// (cumulative, as Prometheus wants it).
	Writes       uint64
	WriteSeconds float64
	BucketBounds []float64
	Buckets      []uint64
	// MaxWrite is the longest write since start.
	MaxWrite time.Duration
	// InProgress is how long the write in progress has been running.
	InProgress time.Duration
	// Stalled: a write has run longer than the stall timeout.
	Stalled bool
}

func (g *stallGuard) stats() LogStoreStats {
	st := LogStoreStats{
		Writes:       g.count.Load(),
		WriteSeconds: float64(g.sumNs.Load()) / 1e9,
		BucketBounds: logStoreBuckets,
		Buckets:      make([]uint64, len(logStoreBuckets)),
		MaxWrite:     time.Duration(g.maxNs.Load()),
		InProgress:   g.inProgress(),
	}
	var cum uint64
	for i := range logStoreBuckets {
		cum += g.buckets[i].Load()
		st.Buckets[i] = cum
	}
	return st
}

// errStalled fails outgoing replication while this node's log store is
// stalled.
var errStalled = errors.New("raft log store stalled on this node: not replicating, so the followers elect another leader")

// guardedTransport is the Raft transport with two bounds raft lacks:
//
//   - While the log store is stalled (stalled returns true) it fails every
//     outgoing AppendEntries, heartbeats included. Raft's heartbeats run
//     apart from its main loop, so a leader stuck in a log write would
//     otherwise hold its followers forever; without them the followers
//     time out and elect a leader whose disk works. When the write
//     returns, replication resumes and the old leader learns the new term.
//   - TimeoutNow (the last step of a leadership transfer) is bounded by
//     timeoutNow. Raft keeps refusing writes until that RPC returns, and
//     against a frozen (SIGSTOP) or black-holed target it waits for the
//     transport's whole I/O timeout (10 s) although the transfer itself
//     gave up after an election timeout.
//   - Incoming AppendEntries with entries pass through filter, which
//     refuses them while the disk has no room (appendFilter).
type guardedTransport struct {
	*raft.NetworkTransport
	stalled    func() bool
	timeoutNow func() time.Duration
	// observe, if set, is told the outcome of every AppendEntries
	// (heartbeats included): the leader's per-peer liveness (peers.go).
	observe func(raft.ServerID, *raft.AppendEntriesResponse, error)
	// sending, if set, is told of every AppendEntries before it is sent
	// (a frozen peer's call hangs: observe hears of it only at the
	// transport's timeout).
	sending func(raft.ServerID)
	filter  *appendFilter // nil: incoming RPCs go to raft unfiltered
}

func (t *guardedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.stalled() {
		return errStalled
	}
	if t.sending != nil {
		t.sending(id)
	}
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if t.observe != nil {
		t.observe(id, resp, err)
	}
	return err
}

func (t *guardedTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if t.stalled() {
		return nil, errStalled
	}
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return &guardedPipeline{AppendPipeline: p, stalled: t.stalled}, nil
}

// TimeoutNow gives up after timeoutNow; the abandoned call ends at the
// transport's own timeout and its connection is then discarded.
func (t *guardedTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	bound := t.timeoutNow()
	type result struct {
		resp raft.TimeoutNowResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = t.NetworkTransport.TimeoutNow(id, target, args, &r.resp)
		done <- r
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case r := <-done:
		*resp = r.resp
		return r.err
	case <-timer.C:
		return fmt.Errorf("TimeoutNow to %s at %s: no answer within %v (target frozen, partitioned or slow)", id, target, bound)
	}
}

type guardedPipeline struct {
	raft.AppendPipeline
	stalled func() bool
}

func (p *guardedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	if p.stalled() {
		return nil, errStalled
	}
	return p.AppendPipeline.AppendEntries(args, resp)
}

// entrySizeMax tracks the largest entry proposed (bytes).
type entrySizeMax struct{ v atomic.Int64 }

func (m *entrySizeMax) observe(n int) {
	for {
		cur := m.v.Load()
		if int64(n) <= cur || m.v.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

// appendFilter stands between the Raft transport and raft on a node: an
// incoming AppendEntries that carries entries is answered with an error,
// without reaching raft, when room says the disk cannot take them.
//
// Why not let the log store fail: hashicorp/raft answers a failed
// StoreLogs with Success=false, and the leader takes that as a log
// mismatch and steps nextIndex back by one. Below the follower's last
// snapshot every step fails again ("failed to get previous log": those
// entries are in the snapshot, not in the log), so the leader walked back
// one entry per round trip through its whole log (80,000 "appendEntries
// rejected, sending older logs" in 37 s on a joining node), then sent a
// snapshot the disk could not hold either. A transport error instead
// counts as a failed RPC: the leader keeps nextIndex and retries with its
// backoff (up to about 10 s apart) until the follower has room. Heartbeats
// (no entries) still pass, so the follower keeps its leader.
type appendFilter struct {
	in   <-chan raft.RPC
	out  chan raft.RPC
	room func(bytes uint64) error
}

// newAppendFilter filters in (the transport's consumer channel) until ctx
// ends; raft reads the result from consumer().
func newAppendFilter(ctx context.Context, in <-chan raft.RPC, room func(bytes uint64) error) *appendFilter {
	f := &appendFilter{in: in, out: make(chan raft.RPC), room: room}
	go f.run(ctx)
	return f
}

func (f *appendFilter) consumer() <-chan raft.RPC { return f.out }

func (f *appendFilter) run(ctx context.Context) {
	for {
		var rpc raft.RPC
		select {
		case rpc = <-f.in:
		case <-ctx.Done():
			return
		}
		if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && len(req.Entries) > 0 {
			if err := f.room(entriesBytes(req.Entries)); err != nil {
				rpc.Respond(nil, fmt.Errorf("not appending %d entries from %s: %w", len(req.Entries), req.RPCHeader.Addr, err))
				continue
			}
		}
		select {
		case f.out <- rpc:
		case <-ctx.Done():
			return
		}
	}
}

// entriesBytes approximates what storing entries takes on disk (their
// data, extensions and a per-entry header).
func entriesBytes(entries []*raft.Log) uint64 {
	var n uint64
	for _, e := range entries {
		n += uint64(len(e.Data)+len(e.Extensions)) + 64
	}
	return n
}

// Consumer is raft's RPC channel: the append filter's when there is one.
func (t *guardedTransport) Consumer() <-chan raft.RPC {
	if t.filter != nil {
		return t.filter.consumer()
	}
	return t.NetworkTransport.Consumer()
}
