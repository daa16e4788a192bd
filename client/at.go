package client

import (
	"context"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Single-attempt calls on one node: MarkAt, CheckAt, ClaimAt and CommitAt
// are Mark, Check, Claim and Commit sent, like StatusOf and DigestOf, as
// one attempt to the node at addr: no retry, no leader discovery, no
// redirection (whatever WithRetry says), and the client's view of the
// leader is left alone. They are for load generators and probes that
// measure single calls (dedupnode bench) and choose the node of each call
// themselves; applications want the routed, retried calls.
//
// The attempt is bounded by the attempt timeout (WithAttemptTimeout) and ctx, and
// goes over the client's transport: a unary RPC, or a message on the
// node's Pipeline with WithTransport(TransportStream). A node that is not
// the leader forwards writes and linearizable reads to it itself. Writes
// carry the caller's request token (nil: none), so that a caller that
// tries again by itself with the same token gets the first answer.
//
// Errors are *Error as for the other calls, with Attempts 1: a write
// whose attempt may have been applied fails with ErrOutcomeUnknown, and
// the status code of the attempt is kept (status.Code(err)).

// MarkAt is Mark as one attempt on the node at addr, with request token
// token. See "Single-attempt calls" above.
func (c *Client) MarkAt(ctx context.Context, addr, namespace string, items []Item, ttl time.Duration, token []byte) ([]Result, error) {
	return c.mark(ctx, addr, namespace, items, ttl, token)
}

// CheckAt is Check as one attempt on the node at addr. Bounded uses the
// client's max staleness (WithMaxStaleness). See "Single-attempt calls"
// above.
func (c *Client) CheckAt(ctx context.Context, addr, namespace string, ids [][]byte, consistency Consistency) ([]Result, error) {
	maxStaleness, err := c.staleness(consistency)
	if err != nil {
		return nil, err
	}
	res, _, err := c.check(ctx, addr, namespace, ids, consistency, maxStaleness)
	return res, err
}

// ClaimAt is Claim as one attempt on the node at addr, with request token
// token. See "Single-attempt calls" above.
func (c *Client) ClaimAt(ctx context.Context, addr, namespace string, items []Item, lease time.Duration, token []byte) ([]Result, error) {
	return c.claim(ctx, addr, namespace, items, lease, token)
}

// CommitAt is Commit as one attempt on the node at addr. See
// "Single-attempt calls" above.
func (c *Client) CommitAt(ctx context.Context, addr, namespace string, leases []Lease, ttl time.Duration) ([]Result, error) {
	return c.commit(ctx, addr, namespace, leases, ttl)
}

// once runs fn as one attempt on the node at addr, over the client's
// transport, and turns its failure into an *Error.
func (c *Client) once(ctx context.Context, op, addr string, fn func(ctx context.Context, d dedupv1.DedupClient) error) error {
	c.mu.Lock()
	cc, err := c.connLocked(addr)
	l := c.linkLocked(addr)
	var d dedupv1.DedupClient
	if err == nil {
		d = c.dedupLocked(ctx, cc)
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	before := l.state()
	actx, cancel := c.attemptCtx(ctx, op)
	err = c.vet(actx, addr, cc, l)
	if err == nil {
		err = fn(actx, d)
	}
	cancel()
	if err == nil {
		return nil
	}
	e, maybeApplied := c.classify(op, addr, l, before, err)
	if ctx.Err() != nil {
		e.ctxErr = ctx.Err()
	}
	return c.finish(e, 1, maybeApplied && !readOps[op])
}

// batchRecords holds the records of a batch's results, allocated at
// once on the first one (a batch of not_seen answers carries none).
type batchRecords struct {
	n   int
	all []Record
}

func records(n int) *batchRecords { return &batchRecords{n: n} }

// of returns item i's record from r, nil when r carries none.
func (b *batchRecords) of(i int, r *dedupv1.Record) *Record {
	rec, ok := recordValue(r)
	if !ok {
		return nil
	}
	return b.set(i, rec)
}

// set stores rec as item i's record and returns it.
func (b *batchRecords) set(i int, rec Record) *Record {
	if b.all == nil {
		b.all = make([]Record, b.n)
	}
	b.all[i] = rec
	return &b.all[i]
}
