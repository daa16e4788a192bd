package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// remoteReads shares a follower's Internal.ReadIndex calls to the leader
// between concurrent linearizable reads, as the leader's own read index
// shares heartbeat rounds: a read joins the next round for its leader
// connection; a round's RPC starts after every read in it arrived, so the
// index the leader returns (its commit index when it received the RPC,
// confirmed by a quorum) covers every write acknowledged before any of
// those reads began. One RPC per round instead of one per Check call.
//
// The zero value is ready to use.
type remoteReads struct {
	mu     sync.Mutex
	rounds map[*grpc.ClientConn]*remoteSlot
}

// remoteSlot is the per-connection state: the round being formed and
// whether a runner is active.
type remoteSlot struct {
	next    *remoteRound
	running bool
}

type remoteRound struct {
	done chan struct{}
	idx  uint64
	err  error
}

// remoteRoundTimeout bounds one shared RPC; each reader's own ctx bounds
// its wait.
const remoteRoundTimeout = 10 * time.Second

// remoteReadIndex returns the leader's read index through cc, sharing the
// RPC with concurrent callers.
func (s *Server) remoteReadIndex(ctx context.Context, cc *grpc.ClientConn) (uint64, error) {
	r := s.reads.join(s, cc)
	select {
	case <-r.done:
		return r.idx, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (rr *remoteReads) join(s *Server, cc *grpc.ClientConn) *remoteRound {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.rounds == nil {
		rr.rounds = make(map[*grpc.ClientConn]*remoteSlot)
	}
	sl := rr.rounds[cc]
	if sl == nil {
		sl = &remoteSlot{}
		rr.rounds[cc] = sl
	}
	if sl.next == nil {
		sl.next = &remoteRound{done: make(chan struct{})}
	}
	r := sl.next
	if !sl.running {
		sl.running = true
		// Called from a request handler: Close waits for handlers
		// (GracefulStop) before s.wg.Wait, so this Add precedes the Wait.
		s.wg.Add(1)
		go rr.run(s, cc, sl)
	}
	return r
}

// run serves rounds for one connection until none is waiting.
func (rr *remoteReads) run(s *Server, cc *grpc.ClientConn, sl *remoteSlot) {
	defer s.wg.Done()
	for {
		rr.mu.Lock()
		r := sl.next
		sl.next = nil
		if r == nil {
			sl.running = false
			delete(rr.rounds, cc)
			rr.mu.Unlock()
			return
		}
		rr.mu.Unlock()
		r.idx, r.err = s.readIndexRPC(cc)
		close(r.done)
	}
}

func (s *Server) readIndexRPC(cc *grpc.ClientConn) (uint64, error) {
	base, cancel := context.WithTimeout(context.Background(), remoteRoundTimeout)
	defer cancel()
	// Close cancels a round at once (handlers waiting on it would
	// otherwise hold GracefulStop up to remoteRoundTimeout).
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-base.Done():
		}
	}()
	ctx := metadata.AppendToOutgoingContext(base, mdForwarded, s.node.ID())
	r, err := dedupv1.NewInternalClient(cc).ReadIndex(ctx, &dedupv1.ReadIndexRequest{})
	if err != nil {
		return 0, err
	}
	return r.ReadIndex, nil
}
