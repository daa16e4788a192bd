package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// ErrClusterMismatch: a peer (a node to join, a leader to forward to)
// belongs to another cluster. The error is a *ClusterMismatchError.
var ErrClusterMismatch = errors.New("node belongs to another cluster")

// ClusterMismatchError names both cluster IDs and the peer. It matches
// ErrClusterMismatch with errors.Is.
type ClusterMismatchError struct {
	Ours   string // this node's cluster ID
	Theirs string // the cluster ID the peer reported
	Addr   string // the peer's gRPC address
	NodeID string // the peer's node ID, "" if unknown
}

func (e *ClusterMismatchError) Error() string {
	who := e.Addr
	if e.NodeID != "" {
		who = fmt.Sprintf("%q at %s", e.NodeID, e.Addr)
	}
	return fmt.Sprintf("node %s belongs to cluster %s, not to this cluster %s", who, e.Theirs, e.Ours)
}

// Unwrap makes errors.Is(err, ErrClusterMismatch) true.
func (e *ClusterMismatchError) Unwrap() error { return ErrClusterMismatch }

// probeTimeout bounds the cluster ID probe of a joining node.
const probeTimeout = 3 * time.Second

// ClusterIDProbe asks the node id (reachable for clients at grpcAddr) for
// its cluster ID ("" when it has none: a new, empty node).
type ClusterIDProbe func(ctx context.Context, id, grpcAddr string) (string, error)

// NewClusterID returns a fresh random cluster ID: 128 bits as 32 lowercase
// hex characters. Only the leader calls it, before the ID enters the log
// (the FSM reads no randomness).
func NewClusterID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("cluster ID: crypto/rand: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ClusterID returns the cluster ID as this node applied it, "" until the
// entry that set it has applied here.
func (n *Node) ClusterID() string { return n.fsm.ClusterID() }

// clusterIDOps returns the op that gives the cluster its ID when the state
// has none, for the term-start command: a cluster bootstrapped now, or one
// whose data an older version wrote. It runs after the term barrier, so
// every ID an earlier term set has applied here and none is replaced (the
// FSM would refuse it anyway).
func (n *Node) clusterIDOps() ([]fsm.Op, error) {
	if n.fsm.ClusterID() != "" {
		return nil, nil
	}
	id, err := NewClusterID()
	if err != nil {
		return nil, err
	}
	n.log.Info("assigning the cluster ID", "cluster_id", id)
	return []fsm.Op{{Kind: fsm.OpSetSetting, Setting: fsm.Setting{Name: fsm.ClusterIDSetting, Value: id}}}, nil
}

// checkJoinee refuses to add a node that reports another cluster's ID: its
// data dir holds another cluster's state, which this cluster's snapshot
// would replace (or whose Raft log would fight this one's). A node that
// cannot be asked (no probe, not reachable yet) or has no ID (an empty
// data dir) is let in: it takes this cluster's ID from the log.
func (n *Node) checkJoinee(ctx context.Context, id, grpcAddr string) error {
	ours := n.fsm.ClusterID()
	if n.cfg.ClusterIDProbe == nil || ours == "" {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	theirs, err := n.cfg.ClusterIDProbe(pctx, id, grpcAddr)
	switch {
	case errors.Is(err, ErrClusterMismatch):
		return err
	case err != nil:
		n.log.Warn("joining node not reachable to check its cluster ID; adding it anyway", "peer", id, "grpc_addr", grpcAddr, "err", err)
		return nil
	case theirs != "" && theirs != ours:
		return &ClusterMismatchError{Ours: ours, Theirs: theirs, Addr: grpcAddr, NodeID: id}
	}
	return nil
}
