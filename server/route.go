package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

// mdForwarded marks a call one node forwarded to the node it believed was
// the leader. A forwarded call is never forwarded again: a node that is not
// the leader answers NOT_LEADER and the first node re-routes.
const mdForwarded = "x-dedupnode-forwarded-by"

func isForwarded(ctx context.Context) bool {
	// ValueFromIncomingContext reads one key; FromIncomingContext would
	// copy the whole metadata map on every call.
	return len(metadata.ValueFromIncomingContext(ctx, mdForwarded)) > 0
}

// leaderBudget bounds waiting for a leader: LeaderWait, and always short
// of the request's deadline so the caller gets a retryable Unavailable
// rather than DeadlineExceeded during an election.
func (s *Server) leaderBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	budget := s.cfg.LeaderWait
	if dl, ok := ctx.Deadline(); ok {
		rem := time.Until(dl)
		budget = min(budget, rem-min(rem/10, 200*time.Millisecond))
	}
	return context.WithTimeout(ctx, budget)
}

// onLeader runs local on this node if it is the (ready) leader, else
// remote against the leader's connection. Both run under the request's
// ctx; finding a leader is bounded by leaderBudget. Attempts that provably
// wrote nothing (this node or the target was not the leader) are re-routed
// until the budget ends. remote == nil means "leader only" (no forwarding).
func (s *Server) onLeader(ctx context.Context, local func(context.Context) error, remote func(context.Context, *grpc.ClientConn) error) error {
	// The budget (a timer) is made only when this node must wait: the
	// common call, on a ready leader, runs local at once.
	var lastErr error
	if s.node.Ready() {
		err := local(ctx)
		if !errors.Is(err, cluster.ErrNotLeader) || ctx.Err() != nil {
			return err
		}
		lastErr = err // nothing was proposed (leadership moved): route as below
	}
	wctx, cancel := s.leaderBudget(ctx)
	defer cancel()
	forwarded := isForwarded(ctx)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-s.node.Changed():
			case <-time.After(50 * time.Millisecond):
			case <-wctx.Done():
			}
			if wctx.Err() != nil {
				if lastErr != nil {
					return lastErr
				}
				return &cluster.NotLeaderError{}
			}
		}
		if s.node.IsLeader() {
			if err := s.node.WaitReady(wctx); err != nil {
				if errors.Is(err, cluster.ErrNotLeader) {
					lastErr = err
					continue
				}
				return err
			}
			err := local(ctx)
			if errors.Is(err, cluster.ErrNotLeader) && ctx.Err() == nil {
				lastErr = err // nothing was proposed: re-route
				continue
			}
			return err
		}
		if forwarded || remote == nil {
			if err := s.node.Removed(); err != nil {
				return err
			}
			id, raftAddr, grpcAddr := s.node.Leader()
			return &cluster.NotLeaderError{LeaderID: id, LeaderRaftAddr: raftAddr, LeaderGRPCAddr: grpcAddr}
		}
		id, addr, err := s.node.WaitLeader(wctx)
		if err != nil {
			if lastErr != nil && errors.Is(err, cluster.ErrNotLeader) {
				return lastErr
			}
			return err
		}
		if id == s.node.ID() {
			continue // became leader meanwhile
		}
		cc, err := s.conn(addr)
		if err != nil {
			return err
		}
		err = remote(metadata.AppendToOutgoingContext(ctx, mdForwarded, s.node.ID()), cc)
		if reasonOf(err) == ReasonNotLeader && ctx.Err() == nil {
			lastErr = err // the target was not (yet) the leader: nothing written
			continue
		}
		return err
	}
}

// readIndex returns a linearizable read index from the leader: its own
// ReadIndex when this node leads, else Internal.ReadIndex on the leader.
func (s *Server) readIndex(ctx context.Context) (uint64, error) {
	var idx uint64
	err := s.onLeader(ctx,
		func(ctx context.Context) (err error) {
			idx, err = s.node.ReadIndex(ctx)
			return err
		},
		func(ctx context.Context, cc *grpc.ClientConn) (err error) {
			idx, err = s.remoteReadIndex(ctx, cc) // shared with concurrent reads
			return err
		})
	return idx, err
}

// linearize waits until this node's FSM reflects every write acknowledged
// before the call (read index, then WaitApplied).
//
// Without a request deadline the wait for the local apply is capped at
// maxApplyWait; a node that cannot catch up in time answers Unavailable
// (errLagging) so the client tries another node.
func (s *Server) linearize(ctx context.Context) error {
	idx, err := s.readIndex(ctx)
	if err != nil {
		return err
	}
	wctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, maxApplyWait)
		defer cancel()
	}
	if err := s.node.FSM().WaitApplied(wctx, idx); err != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("%w: %w", errLagging, err)
		}
		return err
	}
	return nil
}

// maxApplyWait caps a linearizable read's wait for the local apply when the
// request has no deadline.
const maxApplyWait = 30 * time.Second

// ReadIndex implements dedupv1.InternalServer: the leader's confirmed
// commit index. Never forwarded: a non-leader answers NOT_LEADER.
func (s *Server) ReadIndex(ctx context.Context, _ *dedupv1.ReadIndexRequest) (*dedupv1.ReadIndexResponse, error) {
	var idx uint64
	err := s.onLeader(ctx, func(ctx context.Context) (err error) {
		idx, err = s.node.ReadIndex(ctx)
		return err
	}, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.ReadIndexResponse{ReadIndex: idx}, nil
}
