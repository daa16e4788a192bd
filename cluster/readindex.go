package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// readIndexer shares leadership confirmations between concurrent reads
// (Raft thesis §6.4, batched): a read joins the next round; a round reads
// the commit index and then confirms leadership with a quorum (one
// heartbeat round trip). Every read in a round arrived before the round
// started, so the round's commit index is at least the commit index at
// each read's start.
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
// commit index and again after VerifyLeader: equal terms, ready in that
// term, and a successful quorum check in between mean no other leader can
// have committed anything this commit index misses.
func (n *Node) readIndexOnce() (uint64, error) {
	t1 := n.raft.CurrentTerm()
	if n.raft.State() != raft.Leader {
		return 0, n.notLeaderError()
	}
	if n.readyTerm.Load() != t1 {
		return 0, ErrNotReady
	}
	idx := n.raft.CommitIndex()
	if err := n.awaitFuture(n.raft.VerifyLeader()); err != nil {
		if errors.Is(err, raft.ErrRaftShutdown) {
			return 0, ErrShutdown
		}
		nl := n.notLeaderError()
		return 0, fmt.Errorf("confirm leadership: %w (%w)", nl, err)
	}
	if t2 := n.raft.CurrentTerm(); t2 != t1 {
		return 0, n.notLeaderError()
	}
	return idx, nil
}
