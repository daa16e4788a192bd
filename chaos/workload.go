package chaos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/client"
)

// conns holds one client per node, pinned to it (client.WithPinnedNode):
// chaos chooses the node of every attempt and retries itself.
type conns struct {
	ids  []string
	addr map[string]string
	cl   map[string]*client.Client
}

func dialAll(c Cluster) (*conns, error) {
	cs := &conns{ids: c.Nodes(), addr: map[string]string{}, cl: map[string]*client.Client{}}
	for _, id := range cs.ids {
		a := c.Addr(id)
		// One attempt per call, bounded by the caller's context alone.
		cl, err := client.New(context.Background(), []string{a}, client.WithPinnedNode(), client.WithRetry(1, 0, 0), client.WithTimeout(0))
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("dial %s at %s: %w", id, a, err)
		}
		cs.addr[id], cs.cl[id] = a, cl
	}
	return cs, nil
}

func (cs *conns) close() {
	for _, cl := range cs.cl {
		cl.Close()
	}
}

// WorkloadConfig shapes the clients' traffic. Zero values take defaults.
type WorkloadConfig struct {
	// Clients is the number of concurrent clients (default 8).
	Clients int
	// Namespace used for every request ("" = default).
	Namespace string
	// TTL of marks and commits (default 1 h: nothing committed expires
	// during a run, so every acknowledged write must survive).
	TTL time.Duration
	// Lease of claims (default 2 s: leases expire during runs, on purpose).
	Lease time.Duration
	// AttemptTimeout bounds one RPC (default 3 s); OpTimeout one logical
	// operation with its retries (default 10 s).
	AttemptTimeout time.Duration
	OpTimeout      time.Duration
	// ClaimShare is the share of messages processed with Claim/Commit
	// instead of Mark (default 0.4).
	ClaimShare float64
	// Think is the most a client waits between operations (default 20 ms).
	Think time.Duration
	// MaxStaleness, if set, turns a third of the linearizable checks into
	// bounded ones with this max staleness.
	MaxStaleness time.Duration
}

func (w *WorkloadConfig) withDefaults() WorkloadConfig {
	d := *w
	if d.Clients <= 0 {
		d.Clients = 8
	}
	if d.TTL <= 0 {
		d.TTL = time.Hour
	}
	if d.Lease <= 0 {
		d.Lease = 2 * time.Second
	}
	if d.AttemptTimeout <= 0 {
		d.AttemptTimeout = 3 * time.Second
	}
	if d.OpTimeout <= 0 {
		d.OpTimeout = 10 * time.Second
	}
	if d.ClaimShare <= 0 {
		d.ClaimShare = 0.4
	}
	if d.Think <= 0 {
		d.Think = 20 * time.Millisecond
	}
	return d
}

// delivery is one (re)delivery of a message to some consumer.
type delivery struct {
	key     string
	claim   bool
	attempt int
}

// workload runs the clients: consumers of an at-least-once stream, where
// every message may arrive several times at once (planned duplicates and
// concurrent claimants), plus readers checking recent IDs.
type workload struct {
	cfg   WorkloadConfig
	cs    *conns
	rec   *history.Recorder
	runID string
	rng   *mrand.Rand
	rngMu sync.Mutex

	queue  chan delivery
	msgSeq atomic.Int64

	keysMu sync.Mutex
	keys   map[string]bool
	recent []string

	stopping atomic.Bool
	pending  sync.WaitGroup // scheduled redeliveries
}

func newWorkload(cfg WorkloadConfig, cs *conns, rec *history.Recorder, seed int64) *workload {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return &workload{
		cfg:   cfg.withDefaults(),
		cs:    cs,
		rec:   rec,
		runID: fmt.Sprintf("%x", b),
		rng:   mrand.New(mrand.NewPCG(uint64(seed), uint64(seed)>>1|1)),
		queue: make(chan delivery, 4096),
		keys:  map[string]bool{},
	}
}

func (w *workload) float() float64 {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.Float64()
}

func (w *workload) intn(n int) int {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.IntN(n)
}

func (w *workload) dur(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(w.float() * float64(max))
}

// Keys returns every ID the workload touched.
func (w *workload) Keys() []string {
	w.keysMu.Lock()
	defer w.keysMu.Unlock()
	out := make([]string, 0, len(w.keys))
	for k := range w.keys {
		out = append(out, k)
	}
	return out
}

func (w *workload) touch(key string) {
	w.keysMu.Lock()
	defer w.keysMu.Unlock()
	if !w.keys[key] {
		w.keys[key] = true
		w.recent = append(w.recent, key)
		if len(w.recent) > 256 {
			w.recent = w.recent[len(w.recent)-256:]
		}
	}
}

func (w *workload) recentKey() (string, bool) {
	w.keysMu.Lock()
	defer w.keysMu.Unlock()
	if len(w.recent) == 0 {
		return "", false
	}
	return w.recent[len(w.recent)-1-w.intn(len(w.recent))], true
}

// run drives the clients until ctx ends, then lets the operations in
// flight finish (each is bounded by OpTimeout plus a lease of work).
func (w *workload) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.produce(ctx)
	}()
	for i := 0; i < w.cfg.Clients; i++ {
		wg.Add(1)
		go func(client int) {
			defer wg.Done()
			w.client(ctx, client)
		}(i)
	}
	<-ctx.Done()
	w.stopping.Store(true)
	wg.Wait()
	w.pending.Wait()
}

// produce publishes new messages, each delivered 1 to 4 times at once.
func (w *workload) produce(ctx context.Context) {
	for {
		if len(w.queue) < w.cfg.Clients*2 {
			n := w.msgSeq.Add(1)
			claim := w.float() < w.cfg.ClaimShare
			prefix := "m"
			if claim {
				prefix = "c"
			}
			key := fmt.Sprintf("%s-%s-%d", prefix, w.runID, n)
			copies := 1
			switch r := w.float(); {
			case r < 0.15:
				copies = 4
			case r < 0.35:
				copies = 3
			case r < 0.6:
				copies = 2
			}
			for i := 0; i < copies; i++ {
				select {
				case w.queue <- delivery{key: key, claim: claim}:
				case <-ctx.Done():
					return
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// redeliver schedules a delivery again after a delay, as a broker does
// after a negative acknowledgement or a consumer timeout.
func (w *workload) redeliver(d delivery, after time.Duration) {
	if w.stopping.Load() || d.attempt >= 6 {
		return
	}
	d.attempt++
	w.pending.Add(1)
	time.AfterFunc(after, func() {
		defer w.pending.Done()
		if w.stopping.Load() {
			return
		}
		select {
		case w.queue <- d:
		default:
		}
	})
}

func (w *workload) client(ctx context.Context, id int) {
	node := w.cs.ids[id%len(w.cs.ids)]
	for {
		var d delivery
		select {
		case <-ctx.Done():
			return
		case d = <-w.queue:
		}
		w.touch(d.key)
		if d.claim {
			w.processClaim(ctx, id, &node, d)
		} else {
			w.processMark(ctx, id, &node, d)
		}
		if r := w.float(); r < 0.3 {
			if k, ok := w.recentKey(); ok {
				cons := history.Linearizable
				switch {
				case r < 0.03:
					cons = history.Stale
				case r < 0.12 && w.cfg.MaxStaleness > 0:
					cons = history.Bounded
				}
				w.check(ctx, id, &node, k, cons)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.dur(w.cfg.Think)):
		}
	}
}

func newToken() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

func (w *workload) processMark(ctx context.Context, client int, node *string, d delivery) {
	tok := newToken()
	for try := 0; try < 3; try++ {
		op := w.mark(ctx, client, node, d.key, tok)
		if op.Outcome == history.OK {
			if w.float() < 0.2 {
				w.check(ctx, client, node, d.key, history.Linearizable)
			}
			return
		}
		if op.Outcome == history.Fail || w.float() < 0.4 || ctx.Err() != nil {
			return
		}
		// Outcome unknown: retry with the same token, as a consumer that
		// did not get an answer does; it must get the first answer.
	}
}

func (w *workload) processClaim(ctx context.Context, client int, node *string, d delivery) {
	tok := newToken()
	var op *history.Op
	for try := 0; try < 3; try++ {
		op = w.claim(ctx, client, node, d.key, tok)
		if op.Outcome != history.Info || w.float() < 0.4 || ctx.Err() != nil {
			break
		}
	}
	switch {
	case op.Outcome != history.OK:
		w.redeliver(d, w.cfg.Lease+w.dur(w.cfg.Lease))
		return
	case op.Result == history.InProgress:
		w.redeliver(d, w.cfg.Lease/2+w.dur(w.cfg.Lease))
		return
	case op.Result != history.Acquired:
		return // duplicate: already processed
	}
	fence := op.Record.Fence
	// Process: usually quickly, sometimes for longer than the lease (the
	// lease then expires and a redelivery may win it).
	work := w.dur(200 * time.Millisecond)
	if w.float() < 0.15 {
		work = w.cfg.Lease + w.dur(w.cfg.Lease/2)
	}
	select {
	case <-time.After(work):
	case <-ctx.Done():
	}
	if w.float() < 0.25 {
		// Processing failed: release so that a redelivery can claim at once.
		w.lease(context.WithoutCancel(ctx), client, node, history.Release, d.key, fence, tok)
		w.redeliver(d, w.dur(w.cfg.Lease/2))
		return
	}
	c := w.lease(context.WithoutCancel(ctx), client, node, history.Commit, d.key, fence, tok)
	if c.Outcome == history.OK && c.Result == history.LeaseLost {
		w.redeliver(d, w.dur(w.cfg.Lease/2))
	}
	if c.Outcome == history.OK && w.float() < 0.3 {
		w.check(ctx, client, node, d.key, history.Linearizable)
	}
}

// attemptErr classifies one failed attempt.
type attemptErr int

const (
	errIndeterminate attemptErr = iota // may have been applied
	errNotApplied                      // definitely not applied; retry elsewhere
	errFatal                           // definitely not applied; do not retry
)

func classify(err error) attemptErr {
	// The client decodes the node's error details; its kinds say whether
	// the node applied nothing.
	e := client.AsError(err)
	switch {
	case !client.Heals(err) || e.Code == codes.FailedPrecondition:
		return errFatal
	case e.Kind == client.ErrNotLeader, e.Reason == dedupv1.ReasonShuttingDown, e.Reason == dedupv1.ReasonBusy:
		return errNotApplied
	}
	return errIndeterminate
}

// invoke runs one logical operation: attempts on one node after another
// (same request, so the same token) until one answers or OpTimeout passes.
// The node that answered becomes the client's preferred node.
func (w *workload) invoke(ctx context.Context, node *string, op *history.Op, call func(ctx context.Context, id string) error) (history.Outcome, string) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
	defer cancel()
	ids := w.cs.ids
	start := 0
	for i, id := range ids {
		if id == *node {
			start = i
		}
	}
	indeterminate := false
	var last error
	for attempt := 0; ; attempt++ {
		id := ids[(start+attempt)%len(ids)]
		if attempt == 0 {
			op.Node = id
		}
		op.Attempts = attempt + 1
		actx, acancel := context.WithTimeout(octx, w.cfg.AttemptTimeout)
		err := call(actx, id)
		acancel()
		if err == nil {
			*node = id
			op.Uncertain = indeterminate
			return history.OK, ""
		}
		last = err
		switch classify(err) {
		case errFatal:
			if indeterminate {
				return history.Info, err.Error()
			}
			return history.Fail, err.Error()
		case errIndeterminate:
			indeterminate = true
		}
		backoff := time.Duration(min(attempt+1, 5)) * 50 * time.Millisecond
		select {
		case <-octx.Done():
			if indeterminate {
				return history.Info, last.Error()
			}
			return history.Fail, last.Error()
		case <-time.After(backoff):
		}
	}
}

func recordOf(r *client.Record) *history.Record {
	if r == nil {
		return nil
	}
	return &history.Record{State: r.State.String(), FirstSeenMs: unixMs(r.FirstSeen), ExpiresMs: unixMs(r.Expires),
		Token: history.Token(r.RequestToken), Fence: r.FencingToken}
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// one returns the only result of a one-item call.
func one(rs []client.Result, err error) (client.Result, error) {
	if err == nil && len(rs) != 1 {
		err = errShort
	}
	if err != nil {
		return client.Result{}, err
	}
	return rs[0], nil
}

var errShort = errors.New("short reply: no result for the item")

// checkOne checks one key with the history's consistency (bounded by
// maxStaleness) and returns the answer and how the node read it (known for
// bounded checks only).
func checkOne(ctx context.Context, c *client.Client, ns, key, consistency string, maxStaleness time.Duration) (client.Result, client.ReadPath, error) {
	ids := [][]byte{[]byte(key)}
	switch consistency {
	case history.Bounded:
		rs, path, err := c.CheckBounded(ctx, ns, ids, maxStaleness)
		r, err := one(rs, err)
		return r, path, err
	case history.Stale:
		r, err := one(c.Check(ctx, ns, ids, client.Stale))
		return r, client.ReadPathUnknown, err
	}
	r, err := one(c.Check(ctx, ns, ids, client.Linearizable))
	return r, client.ReadPathUnknown, err
}

func (w *workload) mark(ctx context.Context, cid int, node *string, key string, tok []byte) *history.Op {
	op := w.rec.Invoke(history.Op{Client: cid, Kind: history.Mark, Key: key, Token: history.Token(tok)})
	var res client.Result
	out, errText := w.invoke(ctx, node, op, func(ctx context.Context, id string) (err error) {
		res, err = one(w.cs.cl[id].Mark(ctx, w.cfg.Namespace, []client.Item{{ID: []byte(key), RequestToken: tok}}, w.cfg.TTL))
		return err
	})
	result := ""
	var rec *history.Record
	if out == history.OK {
		result, rec = res.Code.String(), recordOf(res.Record)
	}
	w.rec.Complete(op, out, result, rec, errText)
	return op
}

func (w *workload) claim(ctx context.Context, cid int, node *string, key string, tok []byte) *history.Op {
	op := w.rec.Invoke(history.Op{Client: cid, Kind: history.Claim, Key: key, Token: history.Token(tok)})
	var res client.Result
	out, errText := w.invoke(ctx, node, op, func(ctx context.Context, id string) (err error) {
		res, err = one(w.cs.cl[id].Claim(ctx, w.cfg.Namespace, []client.Item{{ID: []byte(key), RequestToken: tok}}, w.cfg.Lease))
		return err
	})
	result := ""
	var rec *history.Record
	if out == history.OK {
		result, rec = res.Code.String(), recordOf(res.Record)
		if result == history.Acquired && rec == nil {
			out, result, errText = history.Info, "", "acquired without a record (no fencing token)"
		}
	}
	w.rec.Complete(op, out, result, rec, errText)
	return op
}

// lease commits or releases the lease of key that the claim with request
// token tok took with fencing token fence.
func (w *workload) lease(ctx context.Context, cid int, node *string, kind history.Kind, key string, fence uint64, tok []byte) *history.Op {
	op := w.rec.Invoke(history.Op{Client: cid, Kind: kind, Key: key, Fence: fence})
	var res client.Result
	leases := []client.Lease{{ID: []byte(key), FencingToken: fence, RequestToken: tok}}
	out, errText := w.invoke(ctx, node, op, func(ctx context.Context, id string) (err error) {
		if kind == history.Commit {
			res, err = one(w.cs.cl[id].Commit(ctx, w.cfg.Namespace, leases, w.cfg.TTL))
		} else {
			res, err = one(w.cs.cl[id].Release(ctx, w.cfg.Namespace, leases))
		}
		return err
	})
	result := ""
	var rec *history.Record
	if out == history.OK {
		result, rec = res.Code.String(), recordOf(res.Record)
	}
	w.rec.Complete(op, out, result, rec, errText)
	return op
}

func (w *workload) check(ctx context.Context, cid int, node *string, key, consistency string) *history.Op {
	if ctx.Err() != nil {
		return nil
	}
	if w.float() < 0.5 {
		// Half the reads go to any node, not the one that served this
		// client last: a node that lags or is cut off must not answer.
		n := w.cs.ids[w.intn(len(w.cs.ids))]
		node = &n
	}
	op := history.Op{Client: cid, Kind: history.Check, Key: key, Consistency: consistency}
	if consistency == history.Bounded {
		op.MaxStalenessMs = w.cfg.MaxStaleness.Milliseconds()
	}
	o := w.rec.Invoke(op)
	var res client.Result
	out, errText := w.invoke(ctx, node, o, func(ctx context.Context, id string) (err error) {
		res, _, err = checkOne(ctx, w.cs.cl[id], w.cfg.Namespace, key, consistency, w.cfg.MaxStaleness)
		return err
	})
	result := ""
	var rec *history.Record
	if out == history.OK {
		result, rec = res.Code.String(), recordOf(res.Record)
	} else {
		out = history.Fail // a read that got no answer had no effect
	}
	w.rec.Complete(o, out, result, rec, errText)
	return o
}
