package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// readIndexer shares leadership confirmations between concurrent reads
// (Raft thesis §6.4, batched): a read joins the next round; a round reads
// the commit index and then has a voter majority confirm the leader's
// term (confirmLeadership: a heartbeat round, or a committed entry while
// the configuration holds a non-voter). Every read in a round arrived
// before the round started, so the round's commit index is at least the
// commit index at each read's start.
type readIndexer struct {
	n *Node

	mu      sync.Mutex
	next    *readRound
	running bool
}

type readRound struct {
	done  chan struct{}
	index uint64
	err   error
}

// ReadIndex returns an index such that a state machine that has applied up
// to it reflects every write acknowledged before the call: the leader's
// commit index, taken after this leader's term barrier and confirmed by a
// quorum heartbeat. Leader only.
//
// Errors: *NotLeaderError (also when leadership could not be confirmed:
// nothing was read, retry), ErrNotReady (the term barrier did not finish
// within ctx), ErrShutdown, or ctx's error.
//
// Followers get the index from the leader (Internal.ReadIndex) and wait
// with fsm.WaitApplied before answering from their own FSM.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	if err := n.WaitReady(ctx); err != nil {
		return 0, err
	}
	r := n.reads.join()
	select {
	case <-r.done:
		return r.index, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (ri *readIndexer) join() *readRound {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	select {
	case <-ri.n.stop: // no new goroutines once shutdown began
		r := &readRound{done: make(chan struct{}), err: ErrShutdown}
		close(r.done)
		return r
	default:
	}
	if ri.next == nil {
		ri.next = &readRound{done: make(chan struct{})}
	}
	r := ri.next
	if !ri.running {
		ri.running = true
		ri.n.wg.Add(1)
		go ri.run()
	}
	return r
}

func (ri *readIndexer) run() {
	defer ri.n.wg.Done()
	for {
		ri.mu.Lock()
		r := ri.next
		ri.next = nil
		if r == nil {
			ri.running = false
			ri.mu.Unlock()
			return
		}
		ri.mu.Unlock()
		r.index, r.err = ri.n.readIndexOnce()
		close(r.done)
	}
}

// readIndexOnce does one confirmation round. The term is read before the
// commit index and again after confirmLeadership: equal terms, ready in
// that term, and a voter majority's confirmation in between mean no other
// leader can have committed anything this commit index misses.
func (n *Node) readIndexOnce() (uint64, error) {
	t1 := n.raft.CurrentTerm()
	if n.raft.State() != raft.Leader {
		return 0, n.notLeaderError()
	}
	if n.readyTerm.Load() != t1 {
		return 0, ErrNotReady
	}
	idx := n.raft.CommitIndex()
	if err := n.confirmLeadership(); err != nil {
		return 0, err
	}
	if t2 := n.raft.CurrentTerm(); t2 != t1 {
		return 0, n.notLeaderError()
	}
	return idx, nil
}

// confirmLeadership checks that a majority of the voters still follow this
// leader's term, after the caller read the commit index.
//
// raft.VerifyLeader does that with one heartbeat round, but it counts an
// answer from every follower it replicates to, non-voters included
// (hashicorp/raft verifyLeader: each replState votes toward the quorum).
// With a read replica (or a joining node still catching up) in the
// configuration, that non-voter alone could confirm a leader whom the
// voters already left: cut off the leader's region, replica included, and
// the old leader would keep answering "linearizable" reads from a state
// the new leader's acknowledged writes are missing, until its lease check
// steps it down. So when the configuration holds a non-voter the round
// commits an OpTick instead: Raft's commitment counts voters only, and an
// entry committed in this term proves a voter majority followed the term
// after the commit index was read. It costs an entry (and its fsyncs)
// per round, shared by every read waiting on it, and only in clusters
// with non-voters.
func (n *Node) confirmLeadership() error {
	if !n.hasNonvoters() {
		if err := n.awaitFuture(n.raft.VerifyLeader()); err != nil {
			if errors.Is(err, raft.ErrRaftShutdown) {
				return ErrShutdown
			}
			return fmt.Errorf("confirm leadership: %w (%w)", n.notLeaderError(), err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), confirmByCommitTimeout)
	defer cancel()
	if _, err := n.proposeInternal(ctx, []fsm.Op{{Kind: fsm.OpTick}}); err != nil {
		if errors.Is(err, ErrShutdown) {
			return ErrShutdown
		}
		return fmt.Errorf("confirm leadership by a commit: %w (%w)", n.notLeaderError(), err)
	}
	return nil
}

// confirmByCommitTimeout bounds a confirmation round by commit. A leader
// cut off from its voters fails the round sooner, when raft steps it down
// (LeaderLeaseTimeout); the bound is for a leader whose disk stalls.
const confirmByCommitTimeout = 30 * time.Second

// hasNonvoters reports whether the latest Raft configuration, committed
// or not, holds a server without a vote (read replica, or a node being
// added or caught up). raft answers GetConfiguration without a round
// through its main loop.
func (n *Node) hasNonvoters() bool {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return true // unknown: take the path that is right either way
	}
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			return true
		}
	}
	return false
}
