package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults used by NewBatcher.
const (
	// DefaultBatchLinger is how long a call waits for others to join its
	// batch before the batch is sent. 0: a call is sent at once when fewer
	// than MaxInflight batches of its group are in flight; otherwise it
	// waits for one of them to return, and every call that arrived
	// meanwhile goes out together ("natural" batching: no added latency at
	// low load, large batches at high load).
	DefaultBatchLinger = 0
	// DefaultMaxBatch is the most items one batched RPC carries. It must
	// not exceed the server's --max-batch (10 000 by default).
	DefaultMaxBatch = 1000
	// DefaultBatchInflight is how many batched RPCs of one group (same
	// operation, namespace, TTL or lease, consistency) may be in flight at
	// once.
	DefaultBatchInflight = 4
)

// BatcherOption configures a Batcher.
type BatcherOption func(*batcherOptions)

type batcherOptions struct {
	linger      time.Duration
	maxBatch    int
	maxInflight int
	transport   Transport
}

// WithLinger makes each call wait up to d for others to join its batch
// (the batch leaves earlier when it reaches the maximum size). Larger
// values give larger batches at the cost of up to d of latency per call.
// Default DefaultBatchLinger (0).
func WithLinger(d time.Duration) BatcherOption {
	return func(o *batcherOptions) { o.linger = max(d, 0) }
}

// WithMaxBatch caps the items of one batched RPC (values < 1 mean 1).
// Default DefaultMaxBatch (1000).
func WithMaxBatch(n int) BatcherOption {
	return func(o *batcherOptions) { o.maxBatch = max(n, 1) }
}

// WithMaxInflight caps the batched RPCs of one group in flight at once
// (values < 1 mean 1). Default DefaultBatchInflight (4).
func WithMaxInflight(n int) BatcherOption {
	return func(o *batcherOptions) { o.maxInflight = max(n, 1) }
}

// WithBatchTransport sets how the Batcher sends its batches:
// TransportStream (the default: every batch is a message on the node's
// Dedup.Stream, shared with the Client's other streamed calls) or
// TransportUnary (one RPC per batch). A node that does not serve
// Dedup.Stream gets unary RPCs either way.
func WithBatchTransport(t Transport) BatcherOption {
	return func(o *batcherOptions) { o.transport = t }
}

// Batcher coalesces single-ID calls made concurrently by many goroutines
// into batched RPCs, so that a consumer handling one message per goroutine
// pays for one RPC per batch instead of one per message. It is safe for
// concurrent use; create one per Client (or a few, with different
// settings) and Close it before closing the Client.
//
// Calls are grouped by operation, namespace, TTL or lease duration, and
// consistency: only calls that would form one request together share a
// batch. Results are those of the unbatched methods, one per call: calls
// of one ID that share a batch are answered as if sent one after another
// in the batch's order (one CodeNew or CodeAcquired, then CodeDuplicate or
// CodeInProgress).
//
// Retries stay safe: each Mark or Claim call carries its own request token
// (Item.RequestToken when set, else a fresh random one), kept by that item
// across every retry of the batch it travels in. So a retried batch
// returns each caller its first answer, whatever else shared the batch.
//
// A batch rejected as a whole for bad input (InvalidArgument, e.g. one
// caller's ID too long for the namespace, or ResourceExhausted when the
// server's --max-batch is smaller than WithMaxBatch) applied nothing; the
// Batcher then splits it and sends the halves again, so that only the
// caller whose input is bad gets the error. A call the client refuses by
// itself (an empty ID) never joins a batch: it fails at once, with the
// error of the unbatched call for that one ID, and nothing is sent.
//
// A call returns when its batch was answered or its own context ended,
// whichever comes first. A batch in flight is cancelled once every caller
// in it has given up. A write whose caller gave up may still be applied:
// like an unbatched call whose context ended, its outcome is unknown (set
// Item.RequestToken to retry it later with the same answer).
type Batcher struct {
	c    *Client
	opts batcherOptions

	mu     sync.Mutex
	groups map[groupKey]*group
	closed bool
	wg     sync.WaitGroup // batches in flight

	calls, rpcs, items atomic.Uint64
}

// BatcherStats counts what a Batcher did since it was created.
type BatcherStats struct {
	// Calls is the number of single-ID calls accepted.
	Calls uint64
	// RPCs is the number of batched RPCs sent (each with its own retries,
	// which are not counted again).
	RPCs uint64
	// Items is the number of items sent in those RPCs (a call whose
	// batch was split after an InvalidArgument is counted once per send).
	Items uint64
}

// NewBatcher returns a Batcher sending through c.
func (c *Client) NewBatcher(opts ...BatcherOption) *Batcher {
	o := batcherOptions{linger: DefaultBatchLinger, maxBatch: DefaultMaxBatch, maxInflight: DefaultBatchInflight, transport: TransportStream}
	for _, opt := range opts {
		opt(&o)
	}
	return &Batcher{c: c, opts: o, groups: map[groupKey]*group{}}
}

// Client returns the Client the Batcher sends through.
func (b *Batcher) Client() *Client { return b.c }

// Stats returns the Batcher's counters.
func (b *Batcher) Stats() BatcherStats {
	return BatcherStats{Calls: b.calls.Load(), RPCs: b.rpcs.Load(), Items: b.items.Load()}
}

// Close sends every waiting call at once (without lingering), waits until
// all batches in flight returned, and makes later calls fail with
// ErrClosed. It does not close the Client.
func (b *Batcher) Close() error {
	b.mu.Lock()
	b.closed = true
	for _, g := range b.groups {
		g.ready = true
		if g.timer != nil {
			g.timer.Stop()
			g.timer = nil
		}
		for len(g.pending) > 0 {
			b.flushLocked(g)
		}
	}
	b.mu.Unlock()
	b.wg.Wait()
	return nil
}

// Check is Client.Check for one ID, batched.
func (b *Batcher) Check(ctx context.Context, namespace string, id []byte, consistency Consistency) (Result, error) {
	return b.do(ctx, groupKey{op: opCheck, ns: namespace, cons: consistency}, &call{id: id})
}

// Mark is Client.Mark for one item, batched. The item keeps its
// RequestToken (or a fresh one) across every retry.
func (b *Batcher) Mark(ctx context.Context, namespace string, item Item, ttl time.Duration) (Result, error) {
	if item.RequestToken == nil {
		item.RequestToken = NewRequestToken()
	}
	return b.do(ctx, groupKey{op: opMark, ns: namespace, dur: ttl}, &call{id: item.ID, item: item})
}

// Claim is Client.Claim for one item, batched. The item keeps its
// RequestToken (or a fresh one) across every retry.
func (b *Batcher) Claim(ctx context.Context, namespace string, item Item, lease time.Duration) (Result, error) {
	if item.RequestToken == nil {
		item.RequestToken = NewRequestToken()
	}
	return b.do(ctx, groupKey{op: opClaim, ns: namespace, dur: lease}, &call{id: item.ID, item: item})
}

// Commit is Client.Commit for one lease, batched.
func (b *Batcher) Commit(ctx context.Context, namespace string, lease Lease, ttl time.Duration) (Result, error) {
	return b.do(ctx, groupKey{op: opCommit, ns: namespace, dur: ttl}, &call{id: lease.ID, lease: lease})
}

// Renew is Client.Renew for one lease, batched.
func (b *Batcher) Renew(ctx context.Context, namespace string, lease Lease, d time.Duration) (Result, error) {
	return b.do(ctx, groupKey{op: opRenew, ns: namespace, dur: d}, &call{id: lease.ID, lease: lease})
}

// Release is Client.Release for one lease, batched.
func (b *Batcher) Release(ctx context.Context, namespace string, lease Lease) (Result, error) {
	return b.do(ctx, groupKey{op: opRelease, ns: namespace}, &call{id: lease.ID, lease: lease})
}

// Forget is Client.Forget for one ID, batched.
func (b *Batcher) Forget(ctx context.Context, namespace string, id []byte) (Result, error) {
	return b.do(ctx, groupKey{op: opForget, ns: namespace}, &call{id: id})
}

type opKind uint8

const (
	opCheck opKind = iota
	opMark
	opClaim
	opCommit
	opRenew
	opRelease
	opForget
)

var opNames = [...]string{"check", "mark", "claim", "commit", "renew", "release", "forget"}

func (o opKind) String() string { return opNames[o] }

// leaseOp: the op names leases (Commit, Renew, Release).
func (o opKind) leaseOp() bool { return o == opCommit || o == opRenew || o == opRelease }

// groupKey names the calls that may share one request.
type groupKey struct {
	op   opKind
	ns   string
	dur  time.Duration // ttl (mark, commit) or lease (claim, renew)
	cons Consistency   // check
}

// call is one waiting single-ID call.
type call struct {
	ctx   context.Context
	id    []byte
	item  Item  // mark, claim
	lease Lease // commit, renew, release
	done  chan callResult
}

type callResult struct {
	res Result
	err error
}

// group holds the waiting calls of one groupKey.
type group struct {
	key      groupKey
	pending  []*call
	inflight int
	// ready is true once the pending calls may leave: the linger elapsed
	// (or is 0) or a full batch is waiting.
	ready bool
	timer *time.Timer
}

func (b *Batcher) do(ctx context.Context, key groupKey, cl *call) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{ID: cl.id}, fmt.Errorf("dedupnode %s: %w", key.op, err)
	}
	if len(cl.id) == 0 || key.op.leaseOp() && len(cl.lease.RequestToken) == 0 {
		// Refused before sending, as the unbatched call for it alone is
		// (with its checks in their order), so that it cannot fail the
		// batch of others.
		_, err := b.rpc(ctx, key, []*call{cl})
		return Result{ID: cl.id}, err
	}
	cl.ctx = ctx
	cl.done = make(chan callResult, 1)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return Result{ID: cl.id}, ErrClosed
	}
	b.calls.Add(1)
	g := b.groups[key]
	if g == nil {
		g = &group{key: key}
		b.groups[key] = g
	}
	g.pending = append(g.pending, cl)
	switch {
	case len(g.pending) >= b.opts.maxBatch || b.opts.linger <= 0:
		g.ready = true
	case g.timer == nil && !g.ready:
		g.timer = time.AfterFunc(b.opts.linger, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			g.timer = nil
			g.ready = true
			b.kickLocked(g)
		})
	}
	b.kickLocked(g)
	b.mu.Unlock()

	select {
	case r := <-cl.done:
		return r.res, r.err
	case <-ctx.Done():
		b.drop(key, cl)
		return Result{ID: cl.id}, fmt.Errorf("dedupnode %s (batched): %w", key.op, ctx.Err())
	}
}

// drop removes a call whose caller gave up from its group's waiting calls
// (if it is still waiting; a batch in flight leaves it out or is cancelled
// with its last caller).
func (b *Batcher) drop(key groupKey, cl *call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.groups[key]
	if g == nil {
		return
	}
	if i := slices.Index(g.pending, cl); i >= 0 {
		g.pending = slices.Delete(g.pending, i, i+1)
	}
	if len(g.pending) == 0 && g.inflight == 0 {
		if g.timer != nil {
			g.timer.Stop()
			g.timer = nil
		}
		delete(b.groups, key)
	}
}

// kickLocked sends pending batches while the group is ready and below its
// in-flight cap.
func (b *Batcher) kickLocked(g *group) {
	for g.ready && len(g.pending) > 0 && g.inflight < b.opts.maxInflight {
		b.flushLocked(g)
	}
}

// flushLocked sends up to maxBatch pending calls of g in one batch.
func (b *Batcher) flushLocked(g *group) {
	n := min(len(g.pending), b.opts.maxBatch)
	batch := g.pending[:n:n]
	g.pending = append([]*call(nil), g.pending[n:]...)
	if len(g.pending) == 0 {
		// The next call starts a new linger period.
		g.ready = b.opts.linger <= 0 || b.closed
	}
	g.inflight++
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.send(g.key, batch)
		b.mu.Lock()
		defer b.mu.Unlock()
		g.inflight--
		if len(g.pending) >= b.opts.maxBatch || b.closed {
			g.ready = true
		}
		b.kickLocked(g)
		if len(g.pending) == 0 && g.inflight == 0 && g.timer == nil && b.groups[g.key] == g {
			delete(b.groups, g.key)
		}
	}()
}

// send runs one batch and hands every caller its result. Callers that
// already gave up are left out before sending.
func (b *Batcher) send(key groupKey, batch []*call) {
	live := batch[:0:0]
	for _, cl := range batch {
		if cl.ctx.Err() == nil {
			live = append(live, cl)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cleanup := batchContext(live)
	defer cleanup()
	b.sendSplitting(withTransport(ctx, b.opts.transport), key, live)
}

// sendSplitting sends calls as one RPC; when the server rejects the whole
// request for its input (nothing applied), it sends each half again so
// that only the offending calls fail.
func (b *Batcher) sendSplitting(ctx context.Context, key groupKey, calls []*call) {
	b.rpcs.Add(1)
	b.items.Add(uint64(len(calls)))
	res, err := b.rpc(ctx, key, calls)
	if err != nil && len(calls) > 1 && ctx.Err() == nil && !refusedByClient(err) {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange:
			half := len(calls) / 2
			b.sendSplitting(ctx, key, calls[:half])
			b.sendSplitting(ctx, key, calls[half:])
			return
		}
	}
	for i, cl := range calls {
		if err != nil {
			cl.done <- callResult{res: Result{ID: cl.id}, err: err}
			continue
		}
		cl.done <- callResult{res: res[i]}
	}
}

// refusedByClient: the client refused the request itself, for what the
// whole batch shares (its TTL, lease or max staleness; an empty ID never
// joins a batch): every half would be refused alike.
func refusedByClient(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.err == nil && e.Kind == ErrInvalidArgument
}

func (b *Batcher) rpc(ctx context.Context, key groupKey, calls []*call) ([]Result, error) {
	switch key.op {
	case opCheck, opForget:
		ids := make([][]byte, len(calls))
		for i, cl := range calls {
			ids[i] = cl.id
		}
		if key.op == opCheck {
			return b.c.Check(ctx, key.ns, ids, key.cons)
		}
		return b.c.Forget(ctx, key.ns, ids)
	case opMark, opClaim:
		items := make([]Item, len(calls))
		for i, cl := range calls {
			items[i] = cl.item
		}
		if key.op == opMark {
			return b.c.Mark(ctx, key.ns, items, key.dur)
		}
		return b.c.Claim(ctx, key.ns, items, key.dur)
	}
	leases := make([]Lease, len(calls))
	for i, cl := range calls {
		leases[i] = cl.lease
	}
	switch key.op {
	case opCommit:
		return b.c.Commit(ctx, key.ns, leases, key.dur)
	case opRenew:
		return b.c.Renew(ctx, key.ns, leases, key.dur)
	case opRelease:
		return b.c.Release(ctx, key.ns, leases)
	}
	return nil, errors.New("dedupnode batcher: unknown operation")
}

// batchContext returns a context for a batch shared by calls: its
// deadline is the latest of the callers' when each has one (so that the
// client sizes the batch's attempts as it would a caller's own call's:
// WithAttemptTimeout), none otherwise, and it is cancelled once every
// caller's context has ended.
func batchContext(calls []*call) (context.Context, func()) {
	var latest time.Time
	for _, cl := range calls {
		dl, ok := cl.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if !latest.IsZero() {
		var cancelDl context.CancelFunc
		ctx, cancelDl = context.WithDeadline(ctx, latest)
		stop := cancel
		cancel = func() { cancelDl(); stop() }
	}
	left := atomic.Int64{}
	left.Store(int64(len(calls)))
	stops := make([]func() bool, len(calls))
	for i, cl := range calls {
		stops[i] = context.AfterFunc(cl.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
