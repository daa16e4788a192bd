package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Check reports, for each ID, whether it is recorded and not yet expired:
// CodeSeen (with its Record) or CodeNotSeen. Read-only. Linearizable goes
// to the leader and never answers not_seen for an acknowledged Mark; Stale
// answers from one node alone; Bounded from one node alone when it can
// show it is at most the client's max staleness (WithMaxStaleness) behind,
// else through the leader's read index. With WithRegion, every check goes
// to a node of that region (which asks the leader for the read index).
//
// Errors: NotFound (unknown namespace), InvalidArgument (empty or too long
// ID, batch too large, Bounded without WithMaxStaleness), Unavailable once
// retries ran out.
func (c *Client) Check(ctx context.Context, namespace string, ids [][]byte, consistency Consistency) ([]Result, error) {
	var maxStaleness time.Duration
	if consistency == Bounded {
		if c.opts.maxStaleness == 0 {
			return nil, &Error{Op: "check", Kind: ErrInvalidArgument, Code: codes.InvalidArgument, Field: "max_staleness",
				Message: "consistency bounded needs a max staleness: create the client WithMaxStaleness(d), or call CheckBounded"}
		}
		if err := validStaleness(c.opts.maxStaleness); err != nil {
			return nil, err
		}
		maxStaleness = c.opts.maxStaleness
	}
	res, _, err := c.check(ctx, namespace, ids, consistency, maxStaleness)
	return res, err
}

func validStaleness(d time.Duration) error {
	if d <= 0 || d%time.Millisecond != 0 {
		return &Error{Op: "check", Kind: ErrInvalidArgument, Code: codes.InvalidArgument, Field: "max_staleness",
			Message: fmt.Sprintf("max staleness %v: want a positive whole number of milliseconds, e.g. 5s", d)}
	}
	return nil
}

// CheckBounded is Check with consistency Bounded and this maxStaleness
// (a positive whole number of milliseconds), and also says how the node
// answered: ReadLocal (its own state was fresh enough) or ReadIndex (it
// fell back to the leader's read index).
func (c *Client) CheckBounded(ctx context.Context, namespace string, ids [][]byte, maxStaleness time.Duration) ([]Result, ReadPath, error) {
	if err := validStaleness(maxStaleness); err != nil {
		return nil, ReadPathUnknown, err
	}
	return c.check(ctx, namespace, ids, Bounded, maxStaleness)
}

func (c *Client) check(ctx context.Context, namespace string, ids [][]byte, consistency Consistency, maxStaleness time.Duration) ([]Result, ReadPath, error) {
	req := &dedupv1.CheckRequest{Namespace: namespace, Ids: ids, Consistency: consistency.proto(), MaxStalenessMs: maxStaleness.Milliseconds()}
	t := c.readTarget(consistency != Linearizable)
	var resp *dedupv1.CheckResponse
	err := c.invoke(ctx, "check", t, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = c.dedup(ctx, cc).Check(ctx, req)
		return err
	})
	if err != nil {
		return nil, ReadPathUnknown, err
	}
	if err := sameLen("check", len(ids), len(resp.GetResults())); err != nil {
		return nil, ReadPathUnknown, err
	}
	out := make([]Result, len(ids))
	for i, r := range resp.GetResults() {
		out[i] = Result{ID: ids[i], Code: checkCode(r.GetCode()), Record: recordOf(r.GetRecord())}
	}
	return out, readPathOf(resp.GetReadPath()), nil
}

// Mark records each ID that is absent (an atomic, replicated test-and-set
// with TTL, like Redis SET NX EX): CodeNew when recorded now, CodeDuplicate
// when already recorded, CodeConflict when recorded with another digest.
// ttl is the record's lifetime (0: the namespace default; at most its max
// TTL); fixed-expiry namespaces never extend it, sliding ones extend it on
// each duplicate.
//
// One random request token is sent with every retry of this call, so a
// retried Mark returns its first answer (new stays new).
//
// Errors: NotFound (unknown namespace), InvalidArgument (bad ID, digest over
// 64 bytes, TTL out of range, batch too large; nothing is applied),
// Unavailable once retries ran out (outcome unknown).
func (c *Client) Mark(ctx context.Context, namespace string, items []Item, ttl time.Duration) ([]Result, error) {
	ttlMs, err := durationMs("mark", "ttl", ttl)
	if err != nil {
		return nil, err
	}
	req := &dedupv1.MarkRequest{
		Namespace:    namespace,
		Items:        make([]*dedupv1.MarkItem, len(items)),
		TtlMs:        ttlMs,
		RequestToken: NewRequestToken(),
	}
	for i, it := range items {
		req.Items[i] = &dedupv1.MarkItem{Id: it.ID, Digest: it.Digest, RequestToken: it.RequestToken}
	}
	var resp *dedupv1.MarkResponse
	err = c.invoke(ctx, "mark", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = c.dedup(ctx, cc).Mark(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := sameLen("mark", len(items), len(resp.GetResults())); err != nil {
		return nil, err
	}
	out := make([]Result, len(items))
	for i, r := range resp.GetResults() {
		out[i] = Result{ID: items[i].ID, Code: markCode(r.GetCode()), Record: recordOf(r.GetRecord())}
	}
	return out, nil
}

// Claim takes a lease on each ID before processing it: CodeAcquired (the
// lease is yours until Record.Expires; keep Record.FencingToken for Commit,
// Renew and Release), CodeDuplicate (already committed: skip),
// CodeInProgress (another caller holds a live lease: retry later),
// CodeConflict (recorded with another digest). lease is the lease duration
// (0: the namespace default lease).
//
// Like Mark, one request token is kept across the retries of this call.
func (c *Client) Claim(ctx context.Context, namespace string, items []Item, lease time.Duration) ([]Result, error) {
	leaseMs, err := durationMs("claim", "lease", lease)
	if err != nil {
		return nil, err
	}
	req := &dedupv1.ClaimRequest{
		Namespace:    namespace,
		Items:        make([]*dedupv1.ClaimItem, len(items)),
		LeaseMs:      leaseMs,
		RequestToken: NewRequestToken(),
	}
	for i, it := range items {
		req.Items[i] = &dedupv1.ClaimItem{Id: it.ID, Digest: it.Digest, RequestToken: it.RequestToken}
	}
	var resp *dedupv1.ClaimResponse
	err = c.invoke(ctx, "claim", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = c.dedup(ctx, cc).Claim(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := sameLen("claim", len(items), len(resp.GetResults())); err != nil {
		return nil, err
	}
	out := make([]Result, len(items))
	for i, r := range resp.GetResults() {
		out[i] = Result{ID: items[i].ID, Code: claimCode(r.GetCode()), Record: recordOf(r.GetRecord())}
	}
	return out, nil
}

// Commit turns held leases into committed records living ttl (0: the
// namespace default): CodeOK, or CodeLeaseLost when the lease expired or a
// newer claim fenced it (someone else may be processing the message).
func (c *Client) Commit(ctx context.Context, namespace string, leases []Lease, ttl time.Duration) ([]Result, error) {
	ttlMs, err := durationMs("commit", "ttl", ttl)
	if err != nil {
		return nil, err
	}
	req := &dedupv1.CommitRequest{Namespace: namespace, Items: leaseItems(leases), TtlMs: ttlMs}
	return c.leaseCall(ctx, "commit", leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
		return cl.Commit(ctx, req)
	})
}

// Renew extends held leases to lease from now (0: the namespace default
// lease): CodeOK with the new expiry, or CodeLeaseLost.
func (c *Client) Renew(ctx context.Context, namespace string, leases []Lease, lease time.Duration) ([]Result, error) {
	leaseMs, err := durationMs("renew", "lease", lease)
	if err != nil {
		return nil, err
	}
	req := &dedupv1.RenewRequest{Namespace: namespace, Items: leaseItems(leases), LeaseMs: leaseMs}
	return c.leaseCall(ctx, "renew", leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
		return cl.Renew(ctx, req)
	})
}

// Release drops held leases after failed processing so that a redelivery
// can claim at once: CodeOK, or CodeLeaseLost.
func (c *Client) Release(ctx context.Context, namespace string, leases []Lease) ([]Result, error) {
	req := &dedupv1.ReleaseRequest{Namespace: namespace, Items: leaseItems(leases)}
	return c.leaseCall(ctx, "release", leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
		return cl.Release(ctx, req)
	})
}

// Forget removes IDs (operator use) so that they can be processed again:
// CodeOK for each, recorded or not.
func (c *Client) Forget(ctx context.Context, namespace string, ids [][]byte) ([]Result, error) {
	req := &dedupv1.ForgetRequest{Namespace: namespace, Ids: ids}
	var resp *dedupv1.ForgetResponse
	err := c.invoke(ctx, "forget", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = c.dedup(ctx, cc).Forget(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := sameLen("forget", len(ids), len(resp.GetResults())); err != nil {
		return nil, err
	}
	out := make([]Result, len(ids))
	for i, r := range resp.GetResults() {
		code := CodeUnknown
		if r.GetCode() == dedupv1.ForgetResult_OK {
			code = CodeOK
		}
		out[i] = Result{ID: ids[i], Code: code}
	}
	return out, nil
}

func (c *Client) leaseCall(ctx context.Context, op string, leases []Lease, call func(context.Context, dedupv1.DedupClient) (*dedupv1.LeaseResponse, error)) ([]Result, error) {
	var resp *dedupv1.LeaseResponse
	err := c.invoke(ctx, op, toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = call(ctx, c.dedup(ctx, cc))
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := sameLen(op, len(leases), len(resp.GetResults())); err != nil {
		return nil, err
	}
	out := make([]Result, len(leases))
	for i, r := range resp.GetResults() {
		out[i] = Result{ID: leases[i].ID, Code: leaseCode(r.GetCode()), Record: recordOf(r.GetRecord())}
	}
	return out, nil
}

func leaseItems(leases []Lease) []*dedupv1.LeaseItem {
	out := make([]*dedupv1.LeaseItem, len(leases))
	for i, l := range leases {
		out[i] = &dedupv1.LeaseItem{Id: l.ID, FencingToken: l.FencingToken}
	}
	return out
}

func sameLen(op string, want, got int) error {
	if want != got {
		return fmt.Errorf("dedupnode %s: server returned %d results for %d items", op, got, want)
	}
	return nil
}
