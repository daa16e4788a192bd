package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

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
// Errors: NotFound (unknown namespace, also where writes create one: a
// check creates none), InvalidArgument (empty or too long ID, batch too
// large, Bounded without WithMaxStaleness), Unavailable once retries ran
// out.
func (c *Client) Check(ctx context.Context, namespace string, ids [][]byte, consistency Consistency) ([]Result, error) {
	maxStaleness, err := c.staleness(consistency)
	if err != nil {
		return nil, err
	}
	res, _, err := c.check(ctx, "", namespace, ids, consistency, maxStaleness)
	return res, err
}

// staleness is the max staleness a Check with consistency sends: the
// client's (WithMaxStaleness) for Bounded, none otherwise.
func (c *Client) staleness(consistency Consistency) (time.Duration, error) {
	if consistency != Bounded {
		return 0, nil
	}
	if c.opts.maxStaleness == 0 {
		return 0, invalidArgument("check", "max_staleness", 0,
			"required by consistency bounded: create the client WithMaxStaleness(d), or call CheckBounded")
	}
	if err := validStaleness(c.opts.maxStaleness); err != nil {
		return 0, err
	}
	return c.opts.maxStaleness, nil
}

func validStaleness(d time.Duration) error {
	const want = "a positive whole number of milliseconds, e.g. 5s"
	v := durationViolation(d, want)
	if v == "" && d == 0 {
		v = "0s is not above 0; want " + want
	}
	if v != "" {
		return invalidArgument("check", "max_staleness", 0, v)
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
	return c.check(ctx, "", namespace, ids, Bounded, maxStaleness)
}

// check sends a Check routed by consistency (addr ""), or as one attempt
// on the node at addr.
func (c *Client) check(ctx context.Context, addr, namespace string, ids [][]byte, consistency Consistency, maxStaleness time.Duration) ([]Result, ReadPath, error) {
	if err := validIDs("check", ids); err != nil {
		return nil, ReadPathUnknown, err
	}
	req := &dedupv1.CheckRequest{Namespace: namespace, Ids: ids, Consistency: consistency.proto(), MaxStalenessMs: maxStaleness.Milliseconds(), Compact: true}
	var resp *dedupv1.CheckResponse
	err := c.send(ctx, "check", addr, c.readTarget(consistency != Linearizable), func(ctx context.Context, d dedupv1.DedupClient) (err error) {
		resp, err = d.Check(ctx, req)
		return err
	})
	if err != nil {
		return nil, ReadPathUnknown, err
	}
	out, err := checkAnswer(resp, ids)
	return out, readPathOf(resp.GetReadPath()), err
}

// send runs one Dedup call: routed to target with the client's retries
// (addr ""), or as one attempt on the node at addr (the *At calls).
func (c *Client) send(ctx context.Context, op, addr string, target target, fn func(context.Context, dedupv1.DedupClient) error) error {
	if addr != "" {
		return c.once(ctx, op, addr, fn)
	}
	return c.invoke(ctx, op, target, func(ctx context.Context, cc *grpc.ClientConn) error {
		return fn(ctx, c.dedup(ctx, cc))
	})
}

// results turns a response's per-item results into Results, the records
// of the batch allocated at once. id(i) is the ID of request item i.
func results[R interface{ GetRecord() *dedupv1.Record }](op string, rs []R, id func(int) []byte, n int, code func(R) Code) ([]Result, error) {
	if err := sameLen(op, n, len(rs)); err != nil {
		return nil, err
	}
	out, recs := make([]Result, len(rs)), records(len(rs))
	for i, r := range rs {
		out[i] = Result{ID: id(i), Code: code(r), Record: recs.of(i, r.GetRecord())}
	}
	return out, nil
}

// Mark records each ID that is absent (an atomic, replicated test-and-set
// with TTL, like Redis SET NX EX): CodeNew when recorded now, CodeDuplicate
// when already recorded, CodeConflict when recorded with another digest.
// ttl is the record's lifetime (0: the namespace default; at most its max
// TTL); fixed-expiry namespaces never extend it, sliding ones extend it on
// each duplicate.
//
// One random request token is sent with every retry of this call, so a
// retried Mark returns its first answer (new stays new). An ID given twice
// in items is decided by its first occurrence; a later one answers as a
// second call would (CodeDuplicate, or CodeConflict with another digest),
// and so does it in every retry.
//
// Errors: NotFound (unknown namespace), InvalidArgument (bad ID, digest over
// 64 bytes, TTL out of range, batch too large; nothing is applied),
// Unavailable once retries ran out (outcome unknown).
func (c *Client) Mark(ctx context.Context, namespace string, items []Item, ttl time.Duration) ([]Result, error) {
	return c.mark(ctx, "", namespace, items, ttl, NewRequestToken())
}

// mark sends a Mark to the leader with retries (addr ""), or as one
// attempt on the node at addr.
func (c *Client) mark(ctx context.Context, addr, namespace string, items []Item, ttl time.Duration, token []byte) ([]Result, error) {
	ttlMs, err := durationMs("mark", "ttl", ttl)
	if err != nil {
		return nil, err
	}
	if err := validItemIDs("mark", items); err != nil {
		return nil, err
	}
	req := &dedupv1.MarkRequest{Namespace: namespace, Items: make([]*dedupv1.MarkItem, len(items)), TtlMs: ttlMs, RequestToken: token, Compact: true}
	pb := make([]dedupv1.MarkItem, len(items)) // one allocation for the batch
	for i, it := range items {
		pb[i].Id, pb[i].Digest, pb[i].RequestToken = it.ID, it.Digest, it.RequestToken
		req.Items[i] = &pb[i]
	}
	var resp *dedupv1.MarkResponse
	err = c.send(ctx, "mark", addr, toLeader, func(ctx context.Context, d dedupv1.DedupClient) (err error) {
		resp, err = d.Mark(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return markAnswer(resp, req, items)
}

// Claim takes a lease on each ID before processing it: CodeAcquired (the
// lease is yours until Record.Expires; Result.Lease names it for Commit,
// Renew and Release), CodeDuplicate (already committed: skip),
// CodeInProgress (another caller holds a live lease: retry later, after
// Record.Expires), CodeConflict (recorded with another digest). lease is
// the lease duration (0: the namespace default lease).
//
// Like Mark, one request token is kept across the retries of this call,
// and an ID given twice is decided by its first occurrence (a later one
// answers CodeInProgress while the lease is live). The token is the
// leases' secret: a claim repeated with it answers CodeAcquired again, and
// Commit, Renew and Release must present it. An Item.RequestToken of your
// own must be as hard to guess.
func (c *Client) Claim(ctx context.Context, namespace string, items []Item, lease time.Duration) ([]Result, error) {
	return c.claim(ctx, "", namespace, items, lease, NewRequestToken())
}

// claim sends a Claim to the leader with retries (addr ""), or as one
// attempt on the node at addr.
func (c *Client) claim(ctx context.Context, addr, namespace string, items []Item, lease time.Duration, token []byte) ([]Result, error) {
	leaseMs, err := durationMs("claim", "lease", lease)
	if err != nil {
		return nil, err
	}
	if err := validItemIDs("claim", items); err != nil {
		return nil, err
	}
	req := &dedupv1.ClaimRequest{Namespace: namespace, Items: make([]*dedupv1.ClaimItem, len(items)), LeaseMs: leaseMs, RequestToken: token}
	pb := make([]dedupv1.ClaimItem, len(items))
	for i, it := range items {
		pb[i].Id, pb[i].Digest, pb[i].RequestToken = it.ID, it.Digest, it.RequestToken
		req.Items[i] = &pb[i]
	}
	var resp *dedupv1.ClaimResponse
	err = c.send(ctx, "claim", addr, toLeader, func(ctx context.Context, d dedupv1.DedupClient) (err error) {
		resp, err = d.Claim(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return results("claim", resp.GetResults(), func(i int) []byte { return items[i].ID }, len(items),
		func(r *dedupv1.ClaimResult) Code { return claimCode(r.GetCode()) })
}

// Commit turns held leases into committed records living ttl (0: the
// namespace default): CodeOK, or CodeLeaseLost when the lease expired, a
// newer claim fenced it (someone else may be processing the message), or
// the lease is not the one named (LostReason says which). Each Lease needs
// both its tokens (Result.Lease): a lease without its request token is
// refused (InvalidArgument), since only the holder's claim knows it.
func (c *Client) Commit(ctx context.Context, namespace string, leases []Lease, ttl time.Duration) ([]Result, error) {
	return c.commit(ctx, "", namespace, leases, ttl)
}

// commit sends a Commit to the leader with retries (addr ""), or as one
// attempt on the node at addr.
func (c *Client) commit(ctx context.Context, addr, namespace string, leases []Lease, ttl time.Duration) ([]Result, error) {
	ttlMs, err := durationMs("commit", "ttl", ttl)
	if err != nil {
		return nil, err
	}
	if err := validLeaseIDs("commit", leases); err != nil {
		return nil, err
	}
	req := &dedupv1.CommitRequest{Namespace: namespace, Items: leaseItems(leases), TtlMs: ttlMs}
	return c.leaseCall(ctx, "commit", addr, leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
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
	if err := validLeaseIDs("renew", leases); err != nil {
		return nil, err
	}
	req := &dedupv1.RenewRequest{Namespace: namespace, Items: leaseItems(leases), LeaseMs: leaseMs}
	return c.leaseCall(ctx, "renew", "", leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
		return cl.Renew(ctx, req)
	})
}

// Release drops held leases after failed processing so that a redelivery
// can claim at once: CodeOK, or CodeLeaseLost.
func (c *Client) Release(ctx context.Context, namespace string, leases []Lease) ([]Result, error) {
	if err := validLeaseIDs("release", leases); err != nil {
		return nil, err
	}
	req := &dedupv1.ReleaseRequest{Namespace: namespace, Items: leaseItems(leases)}
	return c.leaseCall(ctx, "release", "", leases, func(ctx context.Context, cl dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
		return cl.Release(ctx, req)
	})
}

// Forget removes IDs (operator use) so that they can be processed again:
// CodeOK for each, recorded or not.
func (c *Client) Forget(ctx context.Context, namespace string, ids [][]byte) ([]Result, error) {
	if err := validIDs("forget", ids); err != nil {
		return nil, err
	}
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

func (c *Client) leaseCall(ctx context.Context, op, addr string, leases []Lease, call func(context.Context, dedupv1.DedupClient) (*dedupv1.LeaseResponse, error)) ([]Result, error) {
	var resp *dedupv1.LeaseResponse
	err := c.send(ctx, op, addr, toLeader, func(ctx context.Context, d dedupv1.DedupClient) (err error) {
		resp, err = call(ctx, d)
		return err
	})
	if err != nil {
		return nil, err
	}
	out, err := results(op, resp.GetResults(), func(i int) []byte { return leases[i].ID }, len(leases),
		func(r *dedupv1.LeaseResult) Code { return leaseCode(r.GetCode()) })
	if err != nil {
		return nil, err
	}
	for i, r := range resp.GetResults() {
		if out[i].Code == CodeLeaseLost {
			out[i].LostReason = lostReasonOf(r.GetReason())
		}
	}
	return out, nil
}

func leaseItems(leases []Lease) []*dedupv1.LeaseItem {
	out := make([]*dedupv1.LeaseItem, len(leases))
	pb := make([]dedupv1.LeaseItem, len(leases))
	for i, l := range leases {
		pb[i].Id, pb[i].FencingToken, pb[i].RequestToken = l.ID, l.FencingToken, l.RequestToken
		out[i] = &pb[i]
	}
	return out
}

func sameLen(op string, want, got int) error {
	if want != got {
		return fmt.Errorf("dedupnode %s: server returned %d results for %d items", op, got, want)
	}
	return nil
}
