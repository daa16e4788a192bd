package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

const membershipTimeout = 10 * time.Second

// Join adds a node as a non-voter (the leadership loop promotes it once it
// has caught up) and records its client address. Leader only. Joining a
// node that is already a member updates its addresses and keeps its
// suffrage (and a read replica's role), so a retried or repeated join is
// harmless. An ID removed from the cluster (fsm.FSM.Retired) is refused:
// IDs are never reused.
//
// A node that reports another cluster's ID (Config.ClusterIDProbe) is
// refused before anything changes.
//
// Errors: *NotLeaderError, fsm.ErrInvalidArgument (a field empty or
// invalid: fsm.ValidateNodeID, CheckHostPort),
// *ClusterMismatchError, ctx's error, or a raft error.
func (n *Node) Join(ctx context.Context, id, raftAddr, grpcAddr string) error {
	return n.join(ctx, id, raftAddr, grpcAddr, false)
}

// JoinReplica adds a node as a read replica: a permanent non-voter that
// applies the log and answers reads but never votes, never counts toward
// a commit and is never promoted by the leadership loop (only by
// Promote). Its role is recorded (fsm.OpSetNodeRole) before it enters the
// Raft configuration, so a leader elected in between never mistakes it
// for a non-voter that is catching up. Leader only; repeating it is
// harmless.
//
// Errors: as Join, and fsm.ErrInvalidArgument when id is a voter already.
func (n *Node) JoinReplica(ctx context.Context, id, raftAddr, grpcAddr string) error {
	return n.join(ctx, id, raftAddr, grpcAddr, true)
}

func (n *Node) join(ctx context.Context, id, raftAddr, grpcAddr string, replica bool) error {
	if id == "" || raftAddr == "" || grpcAddr == "" {
		return &fsm.InvalidError{Field: "node_id/raft_addr/grpc_addr", Reason: "all three are required"}
	}
	// Before any configuration change: a server whose ID the FSM cannot
	// record would be a member no command can name (no address, never
	// retired), and as a voter a dead one.
	if err := fsm.ValidateNodeID(id); err != nil {
		return err
	}
	if err := CheckHostPort(raftAddr); err != nil {
		return &fsm.InvalidError{Field: "raft_addr", Reason: err.Error()}
	}
	if err := CheckHostPort(grpcAddr); err != nil {
		return &fsm.InvalidError{Field: "grpc_addr", Reason: err.Error()}
	}
	if err := n.WaitReady(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return n.mapConfigError(err)
	}
	member, moved := false, ""
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id && string(s.Address) == raftAddr {
			member = true
		} else if string(s.ID) == id {
			moved = string(s.Address)
		}
		if replica && string(s.ID) == id && s.Suffrage != raft.Nonvoter {
			return &fsm.InvalidError{Field: "read_replica", Reason: fmt.Sprintf("node %q is a voter of this cluster; remove it (and wipe its data dir) to rejoin it as a read replica", id)}
		}
	}
	if !member {
		// Before anything is proposed: a refused node leaves no trace.
		if err := n.checkJoinee(ctx, id, grpcAddr); err != nil {
			return err
		}
	}
	if replica && n.fsm.NodeRole(id) != fsm.RoleReplica {
		res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpSetNodeRole, Node: fsm.NodeInfo{ID: id, Role: fsm.RoleReplica}}})
		if err != nil {
			return err
		}
		if err := res[0].Err; err != nil {
			return err
		}
	}
	if !member && moved == "" && n.fsm.Retired(id) {
		return &fsm.InvalidError{Field: "node_id", Reason: fmt.Sprintf("node %q was removed from this cluster, and a removed ID is never admitted again (its old data dir could come back and vote as the new node); join with a new --node-id and an empty data dir", id)}
	}
	if !member {
		if err := waitFuture(ctx, n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, membershipTimeout)); err != nil {
			return n.mapConfigError(err)
		}
		if moved != "" {
			// raft keeps a member's suffrage when AddNonvoter names it.
			n.log.Info("member's raft address changed", "peer", id, "raft_addr", raftAddr, "was", moved, "grpc_addr", grpcAddr)
		} else {
			n.log.Info("added non-voter", "peer", id, "raft_addr", raftAddr, "grpc_addr", grpcAddr, "read_replica", replica)
		}
	}
	// Always end with a command, so the commit index rests on an entry the
	// FSM applies (see leaderTerm).
	res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: id, GRPCAddr: grpcAddr}}})
	if err != nil {
		return err
	}
	return res[0].Err
}

// Remove removes a node from the Raft configuration and the node table,
// and retires its ID: Join refuses it from then on. Leader only. Removing the leader itself makes it step down afterwards.
// A member whose ID is longer than the FSM records (fsm.MaxNodeIDBytes;
// admitted by versions that did not check) cannot be retired: it is
// removed from the configuration alone (removeUnrecordable).
//
// Errors: *NotLeaderError, fsm.ErrNodeNotFound (not a member), ctx's
// error, or a raft error.
func (n *Node) Remove(ctx context.Context, id string) error {
	if id == "" {
		return &fsm.InvalidError{Field: "node_id", Reason: "required"}
	}
	if err := n.WaitReady(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return n.mapConfigError(err)
	}
	found := false
	for _, s := range cf.Configuration().Servers {
		found = found || string(s.ID) == id
	}
	removeNode := func() error {
		res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpRemoveNode, Node: fsm.NodeInfo{ID: id}}})
		if err != nil {
			return err
		}
		if err := res[0].Err; err != nil && !errors.Is(err, fsm.ErrNodeNotFound) {
			return err
		}
		return nil
	}
	if !found {
		if _, ok := n.fsm.Nodes()[id]; ok {
			return removeNode() // left over in the node table only
		}
		return fmt.Errorf("node %q: %w", id, fsm.ErrNodeNotFound)
	}
	if len(id) > fsm.MaxNodeIDBytes {
		return n.removeUnrecordable(ctx, id)
	}
	// Retire the ID before the configuration change: a leader lost in
	// between must not leave an ID out of the cluster yet admissible
	// again. (After removing itself the leader can propose nothing more.)
	if err := removeNode(); err != nil {
		return err
	}
	if err := waitFuture(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, membershipTimeout)); err != nil {
		return n.mapConfigError(err)
	}
	n.log.Info("removed server", "peer", id)
	if id != n.cfg.NodeID {
		// End with a command, so the commit index rests on an entry the
		// FSM applies (see leaderTerm); it finds the node gone already.
		return removeNode()
	}
	return nil
}

// removeUnrecordable removes a member whose ID is longer than the FSM
// records (fsm.MaxNodeIDBytes), which versions that did not check IDs let
// into the configuration: every command naming it is rejected, so it is in
// no node table, has no address and cannot be retired. It leaves the Raft
// configuration alone, then a tick makes the commit index rest on an entry
// the FSM applies. Join refuses such an ID (fsm.ValidateNodeID), so it
// cannot come back unretired.
func (n *Node) removeUnrecordable(ctx context.Context, id string) error {
	if err := waitFuture(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, membershipTimeout)); err != nil {
		return n.mapConfigError(err)
	}
	n.log.Warn("removed a server whose ID the state machine cannot record: it was in the Raft configuration only, and is not retired (join refuses such IDs)",
		"peer", fmt.Sprintf("%.32q...", id), "id_bytes", len(id), "limit", fsm.MaxNodeIDBytes)
	res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpTick}})
	if err != nil {
		return err
	}
	return res[0].Err
}

// Promote makes the non-voter id a voter at once (the leadership loop
// does it by itself once the node has caught up, except for read
// replicas), then proposes a command so the commit index rests on an entry
// the FSM applies (see Join): the node's client address when the node
// table has it, else a tick. A read replica's role is cleared first, so if
// the configuration change fails the leadership loop promotes it once it
// has caught up. Leader only; promoting a voter only proposes that
// command.
//
// Unless force, a non-voter the leader cannot reach or that has not caught
// up (as the leadership loop judges it) is refused with a
// *NotCaughtUpError: a voter that is down, or far behind, costs the
// cluster the failure it could otherwise survive.
//
// Errors: *NotLeaderError, fsm.ErrNodeNotFound (not a member),
// *NotCaughtUpError, ctx's error, or a raft error.
func (n *Node) Promote(ctx context.Context, id string, force bool) error {
	if err := n.WaitReady(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return n.mapConfigError(err)
	}
	var srv *raft.Server
	for _, m := range cf.Configuration().Servers {
		if string(m.ID) == id {
			srv = &m
		}
	}
	if srv == nil {
		return fmt.Errorf("node %q: %w", id, fsm.ErrNodeNotFound)
	}
	if srv.Suffrage != raft.Voter && !force {
		if why := n.lagging(ctx, *srv); why != "" {
			return &NotCaughtUpError{ID: id, Reason: why}
		}
	}
	if srv.Suffrage != raft.Voter && n.fsm.NodeRole(id) != fsm.RoleMember {
		res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpSetNodeRole, Node: fsm.NodeInfo{ID: id, Role: fsm.RoleMember}}})
		if err != nil {
			return err
		}
		if err := res[0].Err; err != nil {
			return err
		}
	}
	if srv.Suffrage != raft.Voter {
		if err := waitFuture(ctx, n.raft.AddVoter(srv.ID, srv.Address, 0, membershipTimeout)); err != nil {
			if mapped := n.mapConfigError(err); mapped != err {
				return mapped // not the leader, or shutting down
			}
			return fmt.Errorf("promote %s: %w", id, err)
		}
		n.log.Info("promoted to voter", "peer", id)
	}
	op := fsm.Op{Kind: fsm.OpTick}
	if addr := n.fsm.Nodes()[id]; addr != "" {
		op = fsm.Op{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: id, GRPCAddr: addr}}
	}
	res, err := n.Propose(ctx, []fsm.Op{op})
	if err != nil {
		return err
	}
	return res[0].Err
}

// TransferLeadership hands leadership to the voter id ("" lets Raft pick
// the most up-to-date voter) and waits (bounded by ctx) until a new leader
// is known. Leader only. Returns the new leader's ID; naming the leader
// itself returns its ID at once.
func (n *Node) TransferLeadership(ctx context.Context, id string) (string, error) {
	if n.raft.State() != raft.Leader {
		return "", n.notLeaderError()
	}
	if id == n.cfg.NodeID {
		return id, nil // already leads: nothing to hand over
	}
	var f raft.Future
	if id == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		var addr raft.ServerAddress
		cf := n.raft.GetConfiguration()
		if err := cf.Error(); err != nil {
			return "", n.mapConfigError(err)
		}
		for _, s := range cf.Configuration().Servers {
			if string(s.ID) == id && s.Suffrage == raft.Voter {
				addr = s.Address
			}
		}
		if addr == "" {
			return "", &fsm.InvalidError{Field: "node_id", Reason: fmt.Sprintf("%q is not a voter of this cluster", id)}
		}
		f = n.raft.LeadershipTransferToServer(raft.ServerID(id), addr)
	}
	if err := waitFuture(ctx, f); err != nil {
		if mapped := n.mapConfigError(err); mapped != err || ctx.Err() != nil {
			return "", mapped
		}
		// Raft's own failures ("leadership transfer timeout", a TimeoutNow
		// that could not be sent) say nothing of the target.
		target := id
		if target == "" {
			target = "the most up-to-date voter"
		}
		return "", fmt.Errorf("%w: %s did not catch up and take over within the election timeout (down, frozen, overloaded or far behind?; raft: %v); %s still leads", ErrTransferFailed, target, err, n.cfg.NodeID)
	}
	for {
		ch := n.Changed()
		if lid, _, _ := n.Leader(); lid != "" && lid != n.cfg.NodeID {
			return lid, nil
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func (n *Node) mapConfigError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w (%w)", n.notLeaderError(), err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	}
	return err
}
