package server

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/fsm"
)

// permissive is a namespace with the widest limits: used to check what can
// be checked without the namespace (a follower may not know it yet). It has
// no name, so its errors name no namespace but the limit any namespace has.
var permissive = fsm.NamespaceConfig{MaxTTLMs: fsm.MaxTTLLimitMs, MaxIDBytes: fsm.MaxIDBytesLimit}

// validateBasic checks op as far as possible without its namespace.
func (s *Server) validateBasic(op *fsm.Op) error {
	if op.Namespace != "" {
		if err := fsm.ValidateNamespaceName(op.Namespace); err != nil {
			return err
		}
	}
	return fsm.Validate(op, &permissive, s.lim)
}

// prepare validates op against its namespace on the leader and returns the
// ops to propose: op alone, or, with AutoCreateNamespaces and an unknown
// namespace, a CreateNamespace first.
func (s *Server) prepare(op fsm.Op) ([]fsm.Op, bool, error) {
	name := op.Namespace
	if name == "" {
		name = fsm.DefaultNamespace
	}
	ns, ok := s.node.FSM().Namespace(name)
	created := false
	if !ok {
		if !s.cfg.AutoCreateNamespaces {
			return nil, false, &fsm.NamespaceError{Name: name, Err: fsm.ErrNamespaceNotFound}
		}
		ns, created = fsm.DefaultNamespaceConfig(name), true
	}
	if err := fsm.Validate(&op, &ns, s.lim); err != nil {
		return nil, false, err
	}
	if created {
		return []fsm.Op{{Kind: fsm.OpCreateNamespace, Namespace: name, Config: ns}, op}, true, nil
	}
	return []fsm.Op{op}, false, nil
}

// write validates op, proposes it on the leader (forwarding with remote
// from a follower) and returns its item results. Nothing invalid is ever
// proposed.
func (s *Server) write(ctx context.Context, op fsm.Op, remote func(context.Context, *grpc.ClientConn) error) ([]fsm.ItemResult, bool, error) {
	if err := s.validateBasic(&op); err != nil {
		return nil, false, err
	}
	var items []fsm.ItemResult
	local := false
	err := s.onLeader(ctx, func(ctx context.Context) error {
		ops, created, err := s.prepare(op)
		if err != nil {
			return err
		}
		res, err := s.node.Propose(ctx, ops)
		if err != nil {
			return err
		}
		if created {
			if err := res[0].Err; err != nil && !errors.Is(err, fsm.ErrNamespaceExists) {
				return err
			}
		}
		r := res[len(res)-1]
		if r.Err != nil {
			return r.Err
		}
		if len(r.Items) != len(op.Items) {
			return fmt.Errorf("state machine returned %d results for %d items", len(r.Items), len(op.Items))
		}
		items, local = r.Items, true
		return nil
	}, remote)
	return items, local, err
}

func tokenOr(item, req []byte) []byte {
	if len(item) > 0 {
		return item
	}
	return req
}

func checkRequestToken(tok []byte) error {
	if len(tok) > fsm.MaxTokenBytes {
		return invalidf("request_token", "%d bytes exceed %d", len(tok), fsm.MaxTokenBytes)
	}
	return nil
}

// renameIDField turns fsm's "items[i].id" into "ids[i]" for requests whose
// IDs are a plain list.
func renameIDField(err error) error {
	var inv *fsm.InvalidError
	if errors.As(err, &inv) && strings.HasPrefix(inv.Field, "items[") && strings.HasSuffix(inv.Field, "].id") {
		return &fsm.InvalidError{Field: "ids" + strings.TrimSuffix(strings.TrimPrefix(inv.Field, "items"), ".id"), Reason: inv.Reason, Item: inv.Item}
	}
	return err
}

// Mark implements dedupv1.DedupServer.
func (s *Server) Mark(ctx context.Context, req *dedupv1.MarkRequest) (*dedupv1.MarkResponse, error) {
	if err := checkRequestToken(req.RequestToken); err != nil {
		return nil, toStatus(err)
	}
	op := fsm.Op{Kind: fsm.OpMark, Namespace: req.Namespace, DurationMs: req.TtlMs, Items: make([]fsm.Item, len(req.Items))}
	for i, it := range req.Items {
		op.Items[i] = fsm.Item{ID: it.Id, Digest: it.Digest, Token: tokenOr(it.RequestToken, req.RequestToken)}
	}
	var fwd *dedupv1.MarkResponse
	items, local, err := s.write(ctx, op, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		fwd, err = dedupv1.NewDedupClient(cc).Mark(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if !local {
		return fwd, nil
	}
	resp, err := markAnswer(req, items)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// Claim implements dedupv1.DedupServer.
func (s *Server) Claim(ctx context.Context, req *dedupv1.ClaimRequest) (*dedupv1.ClaimResponse, error) {
	if err := checkRequestToken(req.RequestToken); err != nil {
		return nil, toStatus(err)
	}
	op := fsm.Op{Kind: fsm.OpClaim, Namespace: req.Namespace, DurationMs: req.LeaseMs, Items: make([]fsm.Item, len(req.Items))}
	var minted []byte
	for i, it := range req.Items {
		tok := tokenOr(it.RequestToken, req.RequestToken)
		if len(tok) == 0 {
			// The request token is the lease's secret (the holder proves
			// the lease with it): a claim without one gets one, which its
			// ACQUIRED answer carries, rather than a lease nobody can
			// commit. Chosen here, before the log, like the timestamp.
			if minted == nil {
				minted = newLeaseToken()
			}
			tok = minted
		}
		op.Items[i] = fsm.Item{ID: it.Id, Digest: it.Digest, Token: tok}
	}
	var fwd *dedupv1.ClaimResponse
	items, local, err := s.write(ctx, op, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		fwd, err = dedupv1.NewDedupClient(cc).Claim(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if !local {
		return fwd, nil
	}
	resp := &dedupv1.ClaimResponse{Results: make([]*dedupv1.ClaimResult, len(items))}
	for i, r := range items {
		var code dedupv1.ClaimResult_Code
		switch r.Code {
		case fsm.CodeAcquired:
			code = dedupv1.ClaimResult_ACQUIRED
		case fsm.CodeDuplicate:
			code = dedupv1.ClaimResult_DUPLICATE
		case fsm.CodeInProgress:
			code = dedupv1.ClaimResult_IN_PROGRESS
		case fsm.CodeConflict:
			code = dedupv1.ClaimResult_CONFLICT
		default:
			return nil, toStatus(fmt.Errorf("claim: unexpected result %s for item %d", r.Code, i))
		}
		resp.Results[i] = &dedupv1.ClaimResult{Code: code, Record: recordPB(r.Record, op.Items[i].Token)}
	}
	return resp, nil
}

// newLeaseToken is a random request token for a claim sent without one:
// 16 bytes, as the Go client's.
func newLeaseToken() []byte {
	b := make([]byte, 16)
	if _, err := cryptorand.Read(b); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return b
}

// leaseOp runs Commit, Renew or Release.
func (s *Server) leaseOp(ctx context.Context, kind fsm.OpKind, ns string, durationMs int64, items []*dedupv1.LeaseItem,
	fwdCall func(context.Context, dedupv1.DedupClient) (*dedupv1.LeaseResponse, error)) (*dedupv1.LeaseResponse, error) {
	op := fsm.Op{Kind: kind, Namespace: ns, DurationMs: durationMs, Items: make([]fsm.Item, len(items))}
	for i, it := range items {
		op.Items[i] = fsm.Item{ID: it.Id, Fence: it.FencingToken, Token: it.RequestToken}
	}
	if err := s.validateBasic(&op); err != nil {
		return nil, toStatus(err)
	}
	// The fencing token alone does not prove the lease: it is a Raft
	// index, which anyone can guess. The claim's request token, which
	// only the holder knows, must come with it. (The FSM checks an item
	// without one by its fence alone, for log entries written before:
	// none may be proposed now.)
	for i := range op.Items {
		if len(op.Items[i].Token) == 0 {
			return nil, toStatus(&fsm.InvalidError{Field: fmt.Sprintf("items[%d].request_token", i), Item: i + 1,
				Reason: "required: the request token of the claim that granted the lease (its ACQUIRED answer's record.request_token)"})
		}
	}
	var fwd *dedupv1.LeaseResponse
	res, local, err := s.write(ctx, op, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		fwd, err = fwdCall(ctx, dedupv1.NewDedupClient(cc))
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	if !local {
		return fwd, nil
	}
	resp := &dedupv1.LeaseResponse{Results: make([]*dedupv1.LeaseResult, len(res))}
	for i, r := range res {
		var code dedupv1.LeaseResult_Code
		switch r.Code {
		case fsm.CodeOK:
			code = dedupv1.LeaseResult_OK
		case fsm.CodeLeaseLost:
			code = dedupv1.LeaseResult_LEASE_LOST
		default:
			return nil, toStatus(fmt.Errorf("%s: unexpected result %s for item %d", kind, r.Code, i))
		}
		resp.Results[i] = &dedupv1.LeaseResult{Code: code, Record: recordPB(r.Record, op.Items[i].Token), Reason: lostReasonPB(r.Reason)}
	}
	return resp, nil
}

func lostReasonPB(r fsm.LostReason) dedupv1.LeaseResult_Reason {
	switch r {
	case fsm.LostNotClaimed:
		return dedupv1.LeaseResult_NOT_CLAIMED
	case fsm.LostExpired:
		return dedupv1.LeaseResult_EXPIRED
	case fsm.LostTokenMismatch:
		return dedupv1.LeaseResult_TOKEN_MISMATCH
	case fsm.LostAlreadyCommitted:
		return dedupv1.LeaseResult_ALREADY_COMMITTED
	}
	return dedupv1.LeaseResult_REASON_UNSPECIFIED
}

// Commit implements dedupv1.DedupServer.
func (s *Server) Commit(ctx context.Context, req *dedupv1.CommitRequest) (*dedupv1.LeaseResponse, error) {
	return s.leaseOp(ctx, fsm.OpCommit, req.Namespace, req.TtlMs, req.Items,
		func(ctx context.Context, c dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
			return c.Commit(ctx, req)
		})
}

// Renew implements dedupv1.DedupServer.
func (s *Server) Renew(ctx context.Context, req *dedupv1.RenewRequest) (*dedupv1.LeaseResponse, error) {
	return s.leaseOp(ctx, fsm.OpRenew, req.Namespace, req.LeaseMs, req.Items,
		func(ctx context.Context, c dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
			return c.Renew(ctx, req)
		})
}

// Release implements dedupv1.DedupServer.
func (s *Server) Release(ctx context.Context, req *dedupv1.ReleaseRequest) (*dedupv1.LeaseResponse, error) {
	return s.leaseOp(ctx, fsm.OpRelease, req.Namespace, 0, req.Items,
		func(ctx context.Context, c dedupv1.DedupClient) (*dedupv1.LeaseResponse, error) {
			return c.Release(ctx, req)
		})
}

// Forget implements dedupv1.DedupServer.
func (s *Server) Forget(ctx context.Context, req *dedupv1.ForgetRequest) (*dedupv1.ForgetResponse, error) {
	op := fsm.Op{Kind: fsm.OpForget, Namespace: req.Namespace, Items: make([]fsm.Item, len(req.Ids))}
	for i, id := range req.Ids {
		op.Items[i] = fsm.Item{ID: id}
	}
	var fwd *dedupv1.ForgetResponse
	res, local, err := s.write(ctx, op, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		fwd, err = dedupv1.NewDedupClient(cc).Forget(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(renameIDField(err))
	}
	if !local {
		return fwd, nil
	}
	resp := &dedupv1.ForgetResponse{Results: make([]*dedupv1.ForgetResult, len(res))}
	for i := range res {
		resp.Results[i] = &dedupv1.ForgetResult{Code: dedupv1.ForgetResult_OK}
	}
	return resp, nil
}

// Check implements dedupv1.DedupServer. Linearizable by default (read
// index from the leader, then wait until applied here); STALE answers from
// this node's state as it is; BOUNDED from this node's state when it can
// show it is at most max_staleness_ms behind (freshWithin), else like
// LINEARIZABLE. The response's read_path says which.
func (s *Server) Check(ctx context.Context, req *dedupv1.CheckRequest) (*dedupv1.CheckResponse, error) {
	if err := s.validateCheck(req, nil); err != nil {
		return nil, toReadStatus(err)
	}
	path := dedupv1.ReadPath_READ_PATH_LOCAL
	switch req.Consistency {
	case dedupv1.Consistency_CONSISTENCY_STALE:
		// A removed node's state stopped at its removal: no answer from
		// it, however stale the caller accepts.
		if err := s.node.Removed(); err != nil {
			return nil, toReadStatus(err)
		}
	case dedupv1.Consistency_CONSISTENCY_BOUNDED:
		if !s.freshWithin(req.MaxStalenessMs) {
			if err := s.linearize(ctx); err != nil {
				return nil, toReadStatus(err)
			}
			path = dedupv1.ReadPath_READ_PATH_READ_INDEX
		}
	case dedupv1.Consistency_CONSISTENCY_UNSPECIFIED, dedupv1.Consistency_CONSISTENCY_LINEARIZABLE:
		if err := s.linearize(ctx); err != nil {
			return nil, toReadStatus(err)
		}
		path = dedupv1.ReadPath_READ_PATH_READ_INDEX
	default:
		return nil, toReadStatus(invalidf("consistency", "unknown value %d", req.Consistency))
	}
	f := s.node.FSM()
	name := req.Namespace
	if name == "" {
		name = fsm.DefaultNamespace
	}
	applied := f.AppliedIndex()
	ns, ok := f.Namespace(name)
	if !ok {
		// With AutoCreateNamespaces too: a read creates nothing, and
		// answering not_seen from a namespace that does not exist would
		// hide a mistyped name behind answers that look right.
		return nil, toStatus(&fsm.NamespaceError{Name: name, Err: fsm.ErrNamespaceNotFound})
	}
	if err := s.validateCheck(req, &ns); err != nil {
		return nil, toStatus(err)
	}
	now := max(time.Now().UnixMilli(), f.LastTimestamp())
	res, err := f.Check(name, req.Ids, now)
	if err != nil {
		return nil, toStatus(err)
	}
	resp, err := checkAnswer(req, res, applied, path)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// freshWithin reports whether this node's state provably includes every
// write acknowledged more than maxStalenessMs ago. The proof is the
// largest leader timestamp L applied here (fsm.LastTimestamp): L was
// stamped, by some leader's clock, on an entry that precedes in the log
// any entry not applied here, so before any such write was acknowledged.
// With every leader's clock at most MaxClockOffset ahead of this node's,
// and this node's clock not stepping back, a write acknowledged before
// now - maxStaleness and not applied here would force
// L <= now - maxStaleness + MaxClockOffset, which the test excludes (proof:
// cluster/DESIGN.md, Read replicas). An idle log still advances L: the
// leader proposes a tick every cluster.Config.StampInterval while read
// replicas exist. A node cut off from the leader stops applying, L stops,
// and the test fails after maxStaleness - MaxClockOffset.
func (s *Server) freshWithin(maxStalenessMs int64) bool {
	lag := time.Now().UnixMilli() - s.node.FSM().LastTimestamp()
	return lag+s.cfg.MaxClockOffset.Milliseconds() < maxStalenessMs
}

// validateCheck checks a Check request; with ns nil only what needs no
// namespace.
func (s *Server) validateCheck(req *dedupv1.CheckRequest, ns *fsm.NamespaceConfig) error {
	if ns == nil {
		bounded := req.Consistency == dedupv1.Consistency_CONSISTENCY_BOUNDED
		switch {
		case bounded && req.MaxStalenessMs <= 0:
			return invalidf("max_staleness_ms", "%d: consistency BOUNDED needs a max staleness above 0 (e.g. 5000)", req.MaxStalenessMs)
		case !bounded && req.MaxStalenessMs != 0:
			return invalidf("max_staleness_ms", "%d: only consistency BOUNDED takes a max staleness", req.MaxStalenessMs)
		}
	}
	if req.Namespace != "" {
		if err := fsm.ValidateNamespaceName(req.Namespace); err != nil {
			return err
		}
	}
	if len(req.Ids) == 0 {
		return invalidf("ids", "at least one ID is required")
	}
	if len(req.Ids) > s.lim.MaxBatch {
		return invalidf("ids", "%d IDs exceed the maximum batch of %d", len(req.Ids), s.lim.MaxBatch)
	}
	limit, name := fsm.MaxIDBytesLimit, ""
	if ns != nil {
		limit, name = ns.MaxIDBytes, ns.Name
	}
	for i, id := range req.Ids {
		if len(id) == 0 {
			return invalidID(i, "empty message ID")
		}
		if len(id) > limit {
			return invalidID(i, fmt.Sprintf("%d bytes exceed the namespace %q limit of %d", len(id), name, limit))
		}
	}
	return nil
}

// invalidID rejects ids[i] of a Check.
func invalidID(i int, reason string) error {
	return &fsm.InvalidError{Field: fmt.Sprintf("ids[%d]", i), Reason: reason, Item: i + 1}
}

// recordPB is r as the answer to an item sent with request token
// presented (nil: none, as in a Check) shows it: a live lease without its
// fencing token and request token, which together prove the lease
// (LeaseItem), unless presented is that request token, which only the
// lease's holder knows (its claim, retries of it, its lease calls). So no
// answer lets another caller commit, renew or release the lease.
func recordPB(r fsm.Record, presented []byte) *dedupv1.Record {
	if r.State == fsm.StateLeased && (len(presented) == 0 || !bytes.Equal(presented, r.Token)) {
		r.Token, r.Fence = nil, 0
	}
	var st dedupv1.RecordState
	switch r.State {
	case fsm.StateCommitted:
		st = dedupv1.RecordState_RECORD_STATE_COMMITTED
	case fsm.StateLeased:
		st = dedupv1.RecordState_RECORD_STATE_LEASED
	default:
		return nil
	}
	return &dedupv1.Record{
		State:           st,
		FirstSeenUnixMs: r.FirstSeenMs,
		ExpiresUnixMs:   r.ExpiresMs,
		RequestToken:    r.Token,
		Digest:          r.Digest,
		FencingToken:    r.Fence,
	}
}
