package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

// ErrRemoved: this node was removed from the cluster and its ID is retired
// (fsm.FSM.Retired): it runs from a removed member's data dir. Nothing it
// is asked is done, and waiting does not heal it. The error is a
// *RemovedError.
var ErrRemoved = errors.New("node removed from the cluster")

// RemovedError says that this node (ID) was removed from the cluster and
// how it learnt it. It matches ErrRemoved with errors.Is.
type RemovedError struct {
	ID string
	// Source is where the retirement was seen: "its own state" (it applied
	// its removal) or the client address of the peer that said so.
	Source string
}

func (e *RemovedError) Error() string {
	return fmt.Sprintf("this node (%s) was removed from the cluster and its ID is retired; wipe its data dir and join with a new --node-id", e.ID)
}

// Unwrap makes errors.Is(err, ErrRemoved) true.
func (e *RemovedError) Unwrap() error { return ErrRemoved }

// RetiredProbe asks the node reachable for clients at grpcAddr whether
// node ID id is retired (removed from the cluster) in its state.
type RetiredProbe func(ctx context.Context, grpcAddr, id string) (retired bool, err error)

// retiredCheckInterval is how often a node that knows no leader looks for
// its own retirement; it asks its peers after two intervals without one.
const retiredCheckInterval = time.Second

// Removed returns a *RemovedError once this node knows it was removed from
// the cluster, else nil. It never clears: a retired ID is never admitted
// again.
func (n *Node) Removed() error {
	if e := n.removed.Load(); e != nil {
		return e
	}
	return nil
}

// runRetiredCheck finds out that this node was removed. hashicorp/raft
// stops replicating to a removed server as soon as the configuration
// without it commits, so a member that was down at its removal, restarted
// from its data dir, never learns of it: it still holds itself a voter,
// stands for election, and every member refuses its votes (it is not in
// their configuration). It would say "no leader known" for ever. So while
// it knows no leader it looks in its own state (a member that applied its
// OpRemoveNode before the configuration change), then asks the members its
// node table and static peers name (Config.RetiredProbe) whether its ID is
// retired. Once one says so, Health, WaitLeader and WaitReady report a
// *RemovedError and the node logs it once; it keeps running (and voting
// nowhere) until the operator stops it.
func (n *Node) runRetiredCheck() {
	defer n.wg.Done()
	t := time.NewTicker(retiredCheckInterval)
	defer t.Stop()
	var leaderless int
	for {
		select {
		case <-t.C:
		case <-n.stop:
			return
		}
		if n.fsm.Retired(n.cfg.NodeID) {
			n.setRemoved("its own state")
			return
		}
		if id, _, _ := n.Leader(); id != "" || n.raft.State() == raft.Leader {
			leaderless = 0
			continue
		}
		if leaderless++; leaderless < 2 || n.cfg.RetiredProbe == nil {
			continue
		}
		if src := n.askRetired(); src != "" {
			n.setRemoved(src)
			return
		}
	}
}

// askRetired asks each known peer in turn, one second each, whether this
// node's ID is retired, and returns the address of the first that says
// so ("" when none does or none answers).
func (n *Node) askRetired() string {
	addrs := map[string]bool{}
	for id, a := range n.fsm.Nodes() {
		if id != n.cfg.NodeID && a != "" {
			addrs[a] = true
		}
	}
	for _, p := range n.cfg.Peers {
		if p.ID != n.cfg.NodeID && p.GRPCAddr != "" {
			addrs[p.GRPCAddr] = true
		}
	}
	sorted := make([]string, 0, len(addrs))
	for a := range addrs {
		sorted = append(sorted, a)
	}
	sort.Strings(sorted)
	for _, a := range sorted {
		ctx, cancel := context.WithTimeout(n.stopCtx, time.Second)
		retired, err := n.cfg.RetiredProbe(ctx, a, n.cfg.NodeID)
		cancel()
		if err == nil && retired {
			return a
		}
	}
	return ""
}

func (n *Node) setRemoved(source string) {
	e := &RemovedError{ID: n.cfg.NodeID, Source: source}
	if !n.removed.CompareAndSwap(nil, e) {
		return
	}
	n.log.Error(e.Error(), "learnt_from", source)
	n.broadcast()
}
