package cluster

import (
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Reachability is a member's liveness as the leader sees it.
type Reachability uint8

const (
	// ReachUnknown: this node does not lead, so it sends no heartbeats and
	// knows nothing of the others' liveness (the server asks the leader).
	ReachUnknown Reachability = iota
	// Reachable: the leader heard back from the member within the last
	// heartbeat timeout and no exchange failed since.
	Reachable
	// Unreachable: an AppendEntries (heartbeat or append) to the member
	// failed since the last one it answered, or it answered none for
	// longer than the heartbeat timeout (a frozen process: its TCP
	// connection stays open, so calls hang rather than fail).
	Unreachable
)

func (r Reachability) String() string {
	switch r {
	case Reachable:
		return "reachable"
	case Unreachable:
		return "unreachable"
	}
	return "unknown"
}

// peerTracker records, on the leader, the outcome of every AppendEntries
// it sends (heartbeats included), per peer. It is fed by guardedTransport
// rather than by raft's FailedHeartbeatObservation alone: a heartbeat to a
// frozen (SIGSTOP) or black-holed peer neither fails nor succeeds until
// the transport's 10 s I/O timeout, and raft exposes no per-follower last
// contact or match index. Heartbeats go out every HeartbeatTimeout/10, so a
// peer silent for a whole HeartbeatTimeout has missed about ten.
type peerTracker struct {
	mu    sync.Mutex
	since time.Time // when this node began leading; zero when it does not
	peers map[raft.ServerID]*peerContact
}

type peerContact struct {
	tracked time.Time // first AppendEntries sent to it in this term
	last    time.Time // last answered AppendEntries
	lastLog uint64    // the peer's last log index in that answer
	failed  time.Time // first failure after last; zero if none
	err     string    // the latest failure after last
}

// lead starts tracking for a term this node leads (everything known from
// an earlier term is stale); stop ends it.
func (p *peerTracker) lead(now time.Time) {
	p.mu.Lock()
	p.since, p.peers = now, map[raft.ServerID]*peerContact{}
	p.mu.Unlock()
}

func (p *peerTracker) stop() {
	p.mu.Lock()
	p.since, p.peers = time.Time{}, nil
	p.mu.Unlock()
}

// sending notes an AppendEntries about to go to id: the first one of the
// term starts tracking it (a member added during the term is tracked from
// then, not from the term's start).
func (p *peerTracker) sending(id raft.ServerID, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peers != nil && p.peers[id] == nil {
		p.peers[id] = &peerContact{tracked: now}
	}
}

// record is one AppendEntries outcome. errStalled is this node's own
// disk, not the peer's fault, and is not recorded.
func (p *peerTracker) record(id raft.ServerID, resp *raft.AppendEntriesResponse, err error, now time.Time) {
	if errors.Is(err, errStalled) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peers == nil {
		return // not leading (a call of a term that just ended)
	}
	c := p.peers[id]
	if c == nil {
		c = &peerContact{tracked: now}
		p.peers[id] = c
	}
	if err != nil {
		if c.failed.IsZero() {
			c.failed = now
		}
		c.err = err.Error()
		return
	}
	c.last, c.lastLog, c.failed, c.err = now, resp.LastLog, time.Time{}, ""
}

// PeerLiveness is one member's liveness as the leader sees it.
type PeerLiveness struct {
	Reachability Reachability
	// UnreachableSince (Unreachable only): the leader's last answered
	// exchange with it or, if it never answered in this term, when the
	// leader first sent to it in this term (a member added during the term
	// is not older than its addition).
	UnreachableSince time.Time
	// LogLag is how many entries the member's log was behind the leader's
	// last index, as of its last answer (0 when caught up or unknown).
	LogLag uint64
	// LastError is the latest failed exchange since its last answer (""
	// when none failed: a frozen member times out rather than fails).
	LastError string
}

// liveness computes id's liveness at now; ok is false when this node does
// not lead. threshold is the heartbeat timeout; lastIndex the leader's
// last log index.
func (p *peerTracker) liveness(id raft.ServerID, now time.Time, threshold time.Duration, lastIndex uint64) (PeerLiveness, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peers == nil {
		return PeerLiveness{}, false
	}
	c := peerContact{tracked: now} // nothing sent to it yet: just added
	if pc := p.peers[id]; pc != nil {
		c = *pc
	}
	last := c.last
	if last.IsZero() {
		// Raft counts a new follower as contacted when its replication
		// starts: give it one heartbeat timeout to answer.
		last = c.tracked
	}
	out := PeerLiveness{Reachability: Reachable}
	if !c.last.IsZero() && lastIndex > c.lastLog {
		out.LogLag = lastIndex - c.lastLog
	}
	if !c.failed.IsZero() || now.Sub(last) > threshold {
		out.Reachability, out.UnreachableSince, out.LastError = Unreachable, last, c.err
	}
	return out, true
}
