package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// enqueueTimeout bounds only raft.Apply's hand-off to the leader loop; the
// caller's context bounds the wait for the commit.
const enqueueTimeout = 5 * time.Second

// proposal is one caller's ops waiting to be grouped into an entry.
type proposal struct {
	ctx   context.Context
	ops   []fsm.Op
	items int
	bytes int
	done  chan proposalResult // buffered: the group never blocks on a caller
}

type proposalResult struct {
	ops []fsm.OpResult
	err error
}

// proposer is the group commit: callers queue proposals; one loop drains
// whatever is waiting (up to MaxGroupItems / MaxGroupBytes), stamps one
// fsm.Command with the leader's timestamp, hands it to raft.Apply and waits
// for it in a goroutine. One entry is outstanding, or up to MaxInflight
// once the oldest has waited PipelineAfter, so while the log fsyncs, new
// requests pile up and form the next group.
type proposer struct {
	n        *Node
	slots    chan struct{} // one token per entry in flight
	wake     chan struct{} // cap 1: "the queue is not empty"
	released chan struct{} // cap 1: "an entry in flight was answered"

	mu     sync.Mutex
	queue  []*proposal
	closed bool

	// since holds when each entry in flight was proposed, oldest first.
	sinceMu sync.Mutex
	since   []time.Time

	lastTs int64 // last stamped timestamp; touched by run only
}

func newProposer(n *Node) *proposer {
	return &proposer{
		n:        n,
		slots:    make(chan struct{}, n.cfg.MaxInflight),
		wake:     make(chan struct{}, 1),
		released: make(chan struct{}, 1),
	}
}

// Propose replicates ops through the Raft log as part of a group and
// returns one fsm.OpResult per op, in order. An op rejected at apply time
// has OpResult.Err set (nothing of that op applied); other ops of the same
// call are unaffected.
//
// Errors: *NotLeaderError (matches ErrNotLeader; nothing proposed, retry on
// the leader), ErrNotReady (leader still finishing its term barrier within
// ctx), ErrOutcomeUnknown (leadership lost or shutdown after proposing: the
// entry may still commit; retry with the same request tokens), ErrShutdown,
// or ctx's error (the entry may still commit). An entry the FSM could not
// decode yields an error wrapping *fsm.ApplyErr.
//
// REQUIRES: ops were validated (fsm.Validate and friends).
func (n *Node) Propose(ctx context.Context, ops []fsm.Op) ([]fsm.OpResult, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if err := n.WaitReady(ctx); err != nil {
		if errors.Is(err, ErrNotReady) && ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotReady, ctx.Err())
		}
		return nil, err
	}
	if err := n.disk.WriteErr(); err != nil && carriesItems(ops) {
		return nil, fmt.Errorf("node %s: %w", n.cfg.NodeID, err)
	}
	return n.prop.submit(ctx, ops)
}

// carriesItems reports whether ops write client data (message IDs): those
// are refused while the disk is low; namespace and node table changes and
// the leader's own ticks (which drop expired buckets and free space) go on.
func carriesItems(ops []fsm.Op) bool {
	for i := range ops {
		if len(ops[i].Items) > 0 {
			return true
		}
	}
	return false
}

// proposeInternal skips the readiness gate: the leadership loop uses it for
// the term-start command that makes the node ready.
func (n *Node) proposeInternal(ctx context.Context, ops []fsm.Op) ([]fsm.OpResult, error) {
	return n.prop.submit(ctx, ops)
}

func (p *proposer) submit(ctx context.Context, ops []fsm.Op) ([]fsm.OpResult, error) {
	pr := &proposal{ctx: ctx, ops: ops, done: make(chan proposalResult, 1)}
	for i := range ops {
		pr.items += max(1, len(ops[i].Items))
		pr.bytes += fsm.EncodedOpSize(&ops[i])
	}
	if pr.bytes > p.n.cfg.MaxEntryBytes {
		return nil, &EntryTooLargeError{Bytes: pr.bytes, Max: p.n.cfg.MaxEntryBytes}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrShutdown
	}
	p.queue = append(p.queue, pr)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	select {
	case r := <-pr.done:
		return r.ops, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// encodedOpBound is at least the bytes fsm.AppendCommand writes for op
// (varint lengths at their widest for the limits fsm enforces).
func encodedOpBound(op *fsm.Op) int {
	n := 1 + 3 + len(op.Namespace) + 10 + 10 + 96 + len(op.Node.ID) + len(op.Node.GRPCAddr)
	for j := range op.Items {
		it := &op.Items[j]
		n += 3 + len(it.ID) + 2 + len(it.Digest) + 2 + len(it.Token) + 10
	}
	return n
}

func (p *proposer) run() {
	defer p.n.wg.Done()
	defer p.close()
	for {
		// Take an in-flight slot first: while none may be taken, requests
		// accumulate in the queue and form the next group.
		if !p.acquire() {
			return
		}
		var batch []*proposal
		for batch == nil {
			select {
			case <-p.wake:
			case <-p.n.stop:
				return
			}
			batch = p.take()
		}
		p.propose(batch)
	}
}

// acquire takes an in-flight slot: at once when no entry is in flight,
// otherwise only when fewer than MaxInflight are and the oldest has waited
// PipelineAfter. It reports false when the node stops.
func (p *proposer) acquire() bool {
	for {
		select {
		case p.slots <- struct{}{}:
		case <-p.n.stop:
			return false
		}
		wait := p.pipelineWait()
		if wait <= 0 {
			return true
		}
		<-p.slots // not yet: give the slot back until an answer or the delay
		t := time.NewTimer(wait)
		select {
		case <-p.released:
		case <-t.C:
		case <-p.n.stop:
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// pipelineWait is how long a further entry must still wait beside the
// ones in flight (≤ 0: none is in flight, or the oldest has waited
// PipelineAfter).
func (p *proposer) pipelineWait() time.Duration {
	p.sinceMu.Lock()
	defer p.sinceMu.Unlock()
	if len(p.since) == 0 || p.n.cfg.PipelineAfter < 0 {
		return 0
	}
	return p.n.cfg.PipelineAfter - time.Since(p.since[0])
}

// inflight records an entry proposed at start; the returned function
// forgets it and frees its slot once it is answered.
func (p *proposer) inflight(start time.Time) (release func()) {
	p.sinceMu.Lock()
	p.since = append(p.since, start)
	p.sinceMu.Unlock()
	return func() {
		p.sinceMu.Lock()
		if i := slices.Index(p.since, start); i >= 0 {
			p.since = slices.Delete(p.since, i, i+1)
		}
		p.sinceMu.Unlock()
		<-p.slots
		select {
		case p.released <- struct{}{}:
		default:
		}
	}
}

// take removes up to one group's worth of live proposals from the queue.
func (p *proposer) take() []*proposal {
	cfg := &p.n.cfg
	p.mu.Lock()
	defer p.mu.Unlock()
	var batch []*proposal
	items, size, i := 0, 0, 0
	for ; i < len(p.queue); i++ {
		pr := p.queue[i]
		if pr.ctx.Err() != nil {
			continue // caller gone before proposing: drop it, nothing written
		}
		if len(batch) > 0 && (items+pr.items > cfg.MaxGroupItems || size+pr.bytes > cfg.MaxGroupBytes) {
			break
		}
		batch = append(batch, pr)
		items += pr.items
		size += pr.bytes
	}
	rest := copy(p.queue, p.queue[i:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	if rest > 0 {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return batch
}

// stamp returns the leader timestamp of the next entry: never below the
// last applied command's (a previous leader's clock may run ahead of ours)
// nor below the previous stamp.
func (p *proposer) stamp() int64 {
	ts := max(time.Now().UnixMilli(), p.n.fsm.LastTimestamp(), p.lastTs)
	p.lastTs = ts
	return ts
}

func (p *proposer) propose(batch []*proposal) {
	release := p.inflight(time.Now())
	if p.n.raft.State() != raft.Leader {
		err := p.n.notLeaderError()
		for _, pr := range batch {
			pr.done <- proposalResult{err: err}
		}
		release()
		return
	}
	nops, size := 0, 32 // version, timestamp and op count
	for _, pr := range batch {
		nops += len(pr.ops)
		size += pr.bytes
	}
	cmd := fsm.Command{TimestampMs: p.stamp(), Ops: make([]fsm.Op, 0, nops)}
	for _, pr := range batch {
		cmd.Ops = append(cmd.Ops, pr.ops...)
	}
	// A fresh buffer per entry: raft keeps Log.Data until it is applied.
	// Sized from the ops' bounds, so appending never copies it.
	data := fsm.AppendCommand(make([]byte, 0, size), &cmd)
	p.n.largestEntry.observe(len(data))
	f := p.n.raft.Apply(data, enqueueTimeout)
	p.n.wg.Add(1)
	go func() {
		defer p.n.wg.Done()
		defer release()
		p.finish(f, batch, nops)
	}()
}

// finish waits for one entry and fans its results back to the callers.
func (p *proposer) finish(f raft.ApplyFuture, batch []*proposal, nops int) {
	fail := func(err error) {
		for _, pr := range batch {
			pr.done <- proposalResult{err: err}
		}
	}
	if err := p.n.awaitFuture(f); err != nil {
		fail(p.n.mapApplyError(err))
		return
	}
	switch res := f.Response().(type) {
	case *fsm.ApplyResult:
		if len(res.Ops) != nops {
			fail(fmt.Errorf("fsm returned %d op results for %d ops at index %d", len(res.Ops), nops, f.Index()))
			return
		}
		off := 0
		for _, pr := range batch {
			pr.done <- proposalResult{ops: res.Ops[off : off+len(pr.ops) : off+len(pr.ops)]}
			off += len(pr.ops)
		}
	case *fsm.ApplyErr:
		fail(fmt.Errorf("entry %d rejected by the state machine: %w", f.Index(), res))
	case error:
		if errors.Is(res, fsm.ErrApplyDeferred) {
			fail(fmt.Errorf("%w: entry %d: %w", ErrOutcomeUnknown, f.Index(), res))
			return
		}
		fail(fmt.Errorf("entry %d: %w", f.Index(), res))
	default:
		fail(fmt.Errorf("entry %d: unexpected state machine response %T", f.Index(), res))
	}
}

// awaitFuture waits for a Raft future, or until Raft has shut down.
// Raft does not answer every future it drops at shutdown (Apply futures
// already handed to its FSM goroutine, VerifyLeader futures queued for the
// leader loop: neither carries a shutdown channel), so waiting on f.Error
// alone can block Shutdown forever. The goroutine left waiting on such a
// future ends only if Raft answers it: at most one per entry in flight plus
// one read-index round are left behind per shutdown.
func (n *Node) awaitFuture(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.raftDown:
		select {
		case err := <-done: // answered while shutting down
			return err
		default:
			return raft.ErrRaftShutdown
		}
	}
}

// mapApplyError turns raft's future errors into ours: errors raised before
// the entry was appended become *NotLeaderError (nothing written); errors
// after become ErrOutcomeUnknown (it may still commit).
func (n *Node) mapApplyError(err error) error {
	switch {
	case errors.Is(err, raft.ErrEnqueueTimeout) && n.raft.State() == raft.Leader:
		return fmt.Errorf("%w (waited %v)", ErrBusy, enqueueTimeout)
	case errors.Is(err, raft.ErrNotLeader),
		errors.Is(err, raft.ErrLeadershipTransferInProgress),
		errors.Is(err, raft.ErrEnqueueTimeout):
		return n.notLeaderError()
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, ErrShutdown)
	default: // ErrLeadershipLost, ErrAbortedByRestore, log store failures
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
}

// close fails every queued proposal (none was proposed) and refuses new
// ones.
func (p *proposer) close() {
	p.mu.Lock()
	p.closed = true
	q := p.queue
	p.queue = nil
	p.mu.Unlock()
	for _, pr := range q {
		pr.done <- proposalResult{err: ErrShutdown}
	}
}
