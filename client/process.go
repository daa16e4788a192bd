package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrLeaseLost means the lease taken for a message ended before its
// processing was committed: it expired unrenewed or a newer claim fenced
// it, so another consumer may process (or have processed) the message.
var ErrLeaseLost = errors.New("dedupnode: lease lost")

// Outcome says what Process did with a message.
type Outcome uint8

const (
	// OutcomeUnknown is the zero value.
	OutcomeUnknown Outcome = iota
	// OutcomeProcessed: fn ran, returned nil, and its commit is recorded;
	// every later Process of the ID answers OutcomeDuplicate. Ack the
	// message.
	OutcomeProcessed
	// OutcomeDuplicate: the ID was already processed (committed); fn did
	// not run. Ack the message.
	OutcomeDuplicate
	// OutcomeInProgress: another caller holds a live lease on the ID (it is
	// processing it now, or crashed and its lease has not expired yet); fn
	// did not run. Redeliver later, e.g. after Record.Expires.
	OutcomeInProgress
	// OutcomeConflict: the ID is recorded with another payload digest (a
	// producer reused the ID for different content); fn did not run.
	// Someone must look; do not simply ack.
	OutcomeConflict
	// OutcomeFailed: fn ran and returned an error (or panicked); the lease
	// was released so that a redelivery can process the message at once.
	OutcomeFailed
	// OutcomeLeaseLost: fn ran (or was cancelled) but the lease ended
	// before the commit; another caller may process the message too. The
	// error is ErrLeaseLost.
	OutcomeLeaseLost
	// OutcomeError: the cluster could not be asked (Claim failed, fn did
	// not run) or the Commit's outcome is unknown (fn ran): see the error.
	// Redeliver later; a redelivery gets OutcomeDuplicate if the commit was
	// recorded after all, else it can claim once the lease expires.
	OutcomeError
)

var outcomeNames = [...]string{"unknown", "processed", "duplicate", "in_progress", "conflict", "failed", "lease_lost", "error"}

// String returns the lower-case name, e.g. "in_progress".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// MarshalText encodes String().
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// ProcessResult says whether Process ran fn and, if not, why not.
type ProcessResult struct {
	Outcome Outcome
	// Ran is true when fn was called (OutcomeProcessed, OutcomeFailed,
	// OutcomeLeaseLost, and OutcomeError after fn).
	Ran bool
	// Lease is the lease taken (zero when the claim was not acquired).
	Lease Lease
	// Record is the ID's record as last returned by the cluster: the
	// committed record after OutcomeProcessed, the other holder's lease
	// after OutcomeInProgress (its expiry; not its fencing token nor
	// request token, which only its holder gets), the earlier record after
	// OutcomeDuplicate or OutcomeConflict. May be nil.
	Record *Record
}

// Processor runs a message's side effect at most once per ID. *Client and
// *Batcher implement it; integrations accept either.
type Processor interface {
	Process(ctx context.Context, namespace string, id []byte, fn func(ctx context.Context) error, opts ...ProcessOption) (ProcessResult, error)
}

var (
	_ Processor = (*Client)(nil)
	_ Processor = (*Batcher)(nil)
)

// ProcessOption configures one Process call.
type ProcessOption func(*processOptions)

type processOptions struct {
	lease      time.Duration
	renewEvery time.Duration
	ttl        time.Duration
	digest     []byte
	token      []byte
}

// WithLease sets the lease duration (0, the default: the namespace's
// default lease, 30 s unless configured). A consumer that crashes while
// processing blocks redeliveries of the message for up to this long.
func WithLease(d time.Duration) ProcessOption {
	return func(o *processOptions) { o.lease = max(d, 0) }
}

// WithRenewEvery sets how often the lease is renewed while fn runs
// (default: a third of the lease).
func WithRenewEvery(d time.Duration) ProcessOption {
	return func(o *processOptions) { o.renewEvery = max(d, 0) }
}

// WithCommitTTL sets how long the committed record lives, that is how long
// redeliveries and replays of the ID are recognised (0, the default: the
// namespace's default TTL, 24 h unless configured).
func WithCommitTTL(d time.Duration) ProcessOption {
	return func(o *processOptions) { o.ttl = max(d, 0) }
}

// WithDigest sends a payload digest (see Digest) with the claim, so that
// an ID reused for different content answers OutcomeConflict.
func WithDigest(digest []byte) ProcessOption {
	return func(o *processOptions) { o.digest = digest }
}

// WithClaimToken sets the claim's request token (1..64 bytes), for callers
// that keep one across their own restarts; default: a fresh random token.
func WithClaimToken(token []byte) ProcessOption {
	return func(o *processOptions) { o.token = token }
}

type leaseCtxKey struct{}

// LeaseFrom returns the lease under which the fn given to Process runs.
// Pass its FencingToken to a downstream store that can reject writes
// carrying an older token (the second, idempotency layer); keep its
// RequestToken to yourself: it proves the lease.
func LeaseFrom(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(Lease)
	return l, ok
}

// leaseOps are the single-item calls Process needs.
type leaseOps interface {
	claim1(ctx context.Context, ns string, item Item, lease time.Duration) (Result, error)
	commit1(ctx context.Context, ns string, l Lease, ttl time.Duration) (Result, error)
	renew1(ctx context.Context, ns string, l Lease, lease time.Duration) (Result, error)
	release1(ctx context.Context, ns string, l Lease) (Result, error)
}

func one(res []Result, err error) (Result, error) {
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

func (c *Client) claim1(ctx context.Context, ns string, it Item, d time.Duration) (Result, error) {
	return one(c.Claim(ctx, ns, []Item{it}, d))
}
func (c *Client) commit1(ctx context.Context, ns string, l Lease, d time.Duration) (Result, error) {
	return one(c.Commit(ctx, ns, []Lease{l}, d))
}
func (c *Client) renew1(ctx context.Context, ns string, l Lease, d time.Duration) (Result, error) {
	return one(c.Renew(ctx, ns, []Lease{l}, d))
}
func (c *Client) release1(ctx context.Context, ns string, l Lease) (Result, error) {
	return one(c.Release(ctx, ns, []Lease{l}))
}

func (b *Batcher) claim1(ctx context.Context, ns string, it Item, d time.Duration) (Result, error) {
	return b.Claim(ctx, ns, it, d)
}
func (b *Batcher) commit1(ctx context.Context, ns string, l Lease, d time.Duration) (Result, error) {
	return b.Commit(ctx, ns, l, d)
}
func (b *Batcher) renew1(ctx context.Context, ns string, l Lease, d time.Duration) (Result, error) {
	return b.Renew(ctx, ns, l, d)
}
func (b *Batcher) release1(ctx context.Context, ns string, l Lease) (Result, error) {
	return b.Release(ctx, ns, l)
}

// Process runs fn at most once per ID across every caller of the cluster,
// and again only when an earlier run failed: Claim the ID → run fn → Commit
// when fn returns nil, Release when it returns an error (so a redelivery
// can run it at once).
//
// While fn runs, the lease is renewed every WithRenewEvery (a third of the
// lease by default). fn's context is cancelled, with cause ErrLeaseLost,
// when a renewal answers lease_lost or when the lease could not be renewed
// before it would expire (measured on the local clock from the send time of
// the last successful claim or renewal, less a margin); fn should check it
// before making its effect visible. The lease is available to fn through
// LeaseFrom.
//
// Once fn returned nil its effect has happened, so the Commit is sent even
// if ctx has ended meanwhile (bounded by the lease duration, at least 5 s).
// The Release after a failure likewise.
//
// The result says whether fn ran and, if it did not, why: OutcomeDuplicate
// (already processed), OutcomeInProgress (someone else holds the lease),
// OutcomeConflict (same ID, other digest). Those three return a nil error.
// OutcomeFailed returns fn's error (joined with the Release's, if that
// failed); OutcomeLeaseLost returns an error matching ErrLeaseLost;
// OutcomeError returns the claim's or commit's error. A panic in fn
// releases the lease and is re-raised.
//
// Process is safe for concurrent use. Through a Batcher, the claims,
// renewals and commits of many concurrent Process calls share RPCs.
func (c *Client) Process(ctx context.Context, namespace string, id []byte, fn func(ctx context.Context) error, opts ...ProcessOption) (ProcessResult, error) {
	return process(ctx, c, namespace, id, fn, opts)
}

// Process is Client.Process with its claims, renewals, commits and releases
// batched with other concurrent calls.
func (b *Batcher) Process(ctx context.Context, namespace string, id []byte, fn func(ctx context.Context) error, opts ...ProcessOption) (ProcessResult, error) {
	return process(ctx, b, namespace, id, fn, opts)
}

func process(ctx context.Context, ops leaseOps, ns string, id []byte, fn func(ctx context.Context) error, opts []ProcessOption) (_ ProcessResult, err error) {
	var o processOptions
	for _, opt := range opts {
		opt(&o)
	}
	item := Item{ID: id, Digest: o.digest, RequestToken: o.token}
	if item.RequestToken == nil {
		item.RequestToken = NewRequestToken()
	}
	sent := time.Now()
	cr, err := ops.claim1(ctx, ns, item, o.lease)
	if err != nil {
		return ProcessResult{Outcome: OutcomeError}, fmt.Errorf("claim: %w", err)
	}
	switch cr.Code {
	case CodeDuplicate:
		return ProcessResult{Outcome: OutcomeDuplicate, Record: cr.Record}, nil
	case CodeInProgress:
		return ProcessResult{Outcome: OutcomeInProgress, Record: cr.Record}, nil
	case CodeConflict:
		return ProcessResult{Outcome: OutcomeConflict, Record: cr.Record}, nil
	case CodeAcquired:
	default:
		return ProcessResult{Outcome: OutcomeError, Record: cr.Record}, fmt.Errorf("claim: unexpected result %v", cr.Code)
	}
	lease, ok := cr.Lease()
	if !ok {
		return ProcessResult{Outcome: OutcomeError, Record: cr.Record}, errors.New("claim: acquired without the lease's fencing token and request token")
	}
	res := ProcessResult{Outcome: OutcomeUnknown, Lease: lease, Record: cr.Record}

	leaseDur := o.lease
	if leaseDur == 0 {
		leaseDur = cr.Record.Expires.Sub(cr.Record.FirstSeen)
	}
	if leaseDur <= 0 {
		leaseDur = 30 * time.Second
	}
	renewEvery := o.renewEvery
	if renewEvery <= 0 {
		renewEvery = leaseDur / 3
	}
	margin := min(leaseDur/10, time.Second)

	fnCtx, cancelFn := context.WithCancelCause(context.WithValue(ctx, leaseCtxKey{}, lease))
	defer cancelFn(nil)
	rn := &renewer{ops: ops, ns: ns, lease: lease, d: o.lease, dur: leaseDur, margin: margin, every: renewEvery, cancelFn: cancelFn}
	rn.start(fnCtx, sent)

	// After fn, the lease is committed or released even when ctx ended:
	// fn's effect (or its failure) must be recorded.
	after := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), max(leaseDur, 5*time.Second))
	}

	res.Ran = true
	var fnErr error
	func() {
		defer func() {
			if p := recover(); p != nil {
				rn.stop()
				actx, cancel := after()
				_, _ = ops.release1(actx, ns, lease)
				cancel()
				panic(p)
			}
		}()
		fnErr = fn(fnCtx)
	}()
	rn.stop()
	lostCause := context.Cause(fnCtx)
	if !errors.Is(lostCause, ErrLeaseLost) {
		lostCause = nil
	}

	actx, cancel := after()
	defer cancel()
	if fnErr != nil {
		rr, rerr := ops.release1(actx, ns, lease)
		switch {
		case lostCause != nil:
			res.Outcome = OutcomeLeaseLost
			return res, fmt.Errorf("%w (%w): %w", ErrLeaseLost, lostCause, fnErr)
		case rerr != nil:
			res.Outcome = OutcomeFailed
			return res, errors.Join(fnErr, fmt.Errorf("release: %w", rerr))
		case rr.Code == CodeLeaseLost:
			res.Outcome = OutcomeFailed
			return res, errors.Join(fnErr, fmt.Errorf("release: %w", ErrLeaseLost))
		}
		res.Outcome = OutcomeFailed
		return res, fnErr
	}
	cm, err := ops.commit1(actx, ns, lease, o.ttl)
	if err != nil {
		res.Outcome = OutcomeError
		return res, fmt.Errorf("commit (outcome unknown; fn ran): %w", err)
	}
	if cm.Record != nil {
		res.Record = cm.Record
	}
	switch cm.Code {
	case CodeOK:
		res.Outcome = OutcomeProcessed
		return res, nil
	case CodeLeaseLost:
		res.Outcome = OutcomeLeaseLost
		return res, fmt.Errorf("commit: %w", ErrLeaseLost)
	}
	res.Outcome = OutcomeError
	return res, fmt.Errorf("commit: unexpected result %v", cm.Code)
}

// renewer keeps a lease alive while fn runs, and cancels fn's context
// once the lease is lost or can no longer be known to be live.
type renewer struct {
	ops      leaseOps
	ns       string
	lease    Lease
	d        time.Duration // lease duration sent (0: namespace default)
	dur      time.Duration // lease duration in effect
	margin   time.Duration
	every    time.Duration
	cancelFn context.CancelCauseFunc

	done chan struct{}
	quit chan struct{}
	once sync.Once
}

func (r *renewer) start(ctx context.Context, sent time.Time) {
	r.done = make(chan struct{})
	r.quit = make(chan struct{})
	go r.run(ctx, sent)
}

func (r *renewer) stop() {
	r.once.Do(func() { close(r.quit) })
	<-r.done
}

func (r *renewer) run(ctx context.Context, sent time.Time) {
	defer close(r.done)
	deadline := sent.Add(r.dur - r.margin)
	expire := time.NewTimer(time.Until(deadline))
	defer expire.Stop()
	tick := time.NewTicker(r.every)
	defer tick.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-ctx.Done():
			return
		case <-expire.C:
			r.cancelFn(fmt.Errorf("%w: not renewed within %v", ErrLeaseLost, r.dur-r.margin))
			return
		case <-tick.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		go func() { // stop the renewal as soon as fn returned
			select {
			case <-r.quit:
				cancel()
			case <-rctx.Done():
			}
		}()
		res, err := r.ops.renew1(rctx, r.ns, r.lease, r.d)
		cancel()
		switch {
		case err != nil:
			// Retried by the client until the deadline; the expire timer
			// decides when the lease must be taken as lost.
		case res.Code == CodeOK:
			deadline = sent.Add(r.dur - r.margin)
			expire.Reset(time.Until(deadline))
		case res.Code == CodeLeaseLost:
			r.cancelFn(fmt.Errorf("%w: renewal answered lease_lost", ErrLeaseLost))
			return
		}
	}
}
