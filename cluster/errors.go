package cluster

import (
	"errors"
	"fmt"
)

// Sentinel errors of the cluster layer. Callers test them with errors.Is;
// the server maps each to one gRPC code.
var (
	// ErrNotLeader: this node is not the leader, so nothing was proposed.
	// Retrying elsewhere is always safe. The error is a *NotLeaderError
	// carrying the leader's identity when one is known.
	ErrNotLeader = errors.New("not the raft leader")
	// ErrNotReady: this node is leader but has not yet finished the barrier
	// of its term; nothing was proposed. Retry shortly.
	ErrNotReady = errors.New("leader not ready yet (term start barrier pending)")
	// ErrOutcomeUnknown: the write was handed to Raft but leadership was
	// lost (or the node shut down) before it was known to commit. The entry
	// may still commit under the next leader: retry with the same request
	// token to learn the original answer.
	ErrOutcomeUnknown = errors.New("write outcome unknown (leadership lost while in flight); retry with the same request token")
	// ErrShutdown: the node is shutting down; nothing new is accepted.
	ErrShutdown = errors.New("node is shutting down")
	// ErrBusy: this node leads, but Raft's leader loop did not take the
	// entry within the enqueue timeout (it is stuck behind slow disk
	// writes). Nothing was written; retry shortly.
	ErrBusy = errors.New("leader busy: raft did not accept the entry in time")
)

// ErrTransferFailed: a leadership transfer did not complete: its target
// did not catch up and take over within Raft's election timeout (down,
// frozen, overloaded or far behind), or could not be asked to. Nothing
// changed: the leader still leads.
var ErrTransferFailed = errors.New("leadership transfer failed")

// ErrNotCaughtUp: Promote refused a node the leader cannot reach or that
// has not caught up with the log; nothing changed. The error is a
// *NotCaughtUpError naming the node and why.
var ErrNotCaughtUp = errors.New("node is unreachable or has not caught up")

// NotCaughtUpError says why Promote refused a node. It matches
// ErrNotCaughtUp with errors.Is.
type NotCaughtUpError struct {
	ID     string
	Reason string // "its applied index 12 is 400 entries behind ...", ...
}

func (e *NotCaughtUpError) Error() string {
	return fmt.Sprintf("node %q is not promoted: %s", e.ID, e.Reason)
}

// Unwrap makes errors.Is(err, ErrNotCaughtUp) true.
func (e *NotCaughtUpError) Unwrap() error { return ErrNotCaughtUp }

// NotLeaderError says which node leads, if any is known. It matches
// ErrNotLeader with errors.Is.
type NotLeaderError struct {
	// LeaderID, LeaderRaftAddr and LeaderGRPCAddr are empty when no leader
	// is known (an election is in progress or there is no quorum).
	LeaderID       string
	LeaderRaftAddr string
	LeaderGRPCAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return ErrNotLeader.Error() + " (no leader known)"
	}
	return fmt.Sprintf("%s (leader is %s at %s)", ErrNotLeader, e.LeaderID, e.LeaderGRPCAddr)
}

// Unwrap makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }
