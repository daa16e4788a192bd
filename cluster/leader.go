package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// runObserver drains raft observations: leader changes wake waiters
// (WaitLeader, WaitReady); failed heartbeats feed the promotion rule. The
// observer is non-blocking, so raft never stalls on us; a dropped
// observation only delays a waiter until its next poll.
func (n *Node) runObserver() {
	defer n.wg.Done()
	for {
		select {
		case o := <-n.obsCh:
			switch d := o.Data.(type) {
			case raft.LeaderObservation, raft.PeerObservation:
				n.broadcast()
			case raft.FailedHeartbeatObservation:
				n.hbMu.Lock()
				n.hbFail[d.PeerID] = time.Now()
				n.hbMu.Unlock()
			}
		case <-n.stop:
			return
		}
	}
}

// runLeadership drains Config.NotifyCh (raft blocks on it, and LeaderCh
// drops transitions) and runs one leaderTerm goroutine per term in which
// this node leads, cancelling it when leadership ends.
func (n *Node) runLeadership() {
	defer n.wg.Done()
	var stopCurrent func()
	stopTerm := func() {
		if stopCurrent != nil {
			stopCurrent()
			stopCurrent = nil
		}
		n.readyTerm.Store(0)
		n.peers.stop()
		n.broadcast()
	}
	for {
		select {
		case leader := <-n.notifyCh:
			stopTerm()
			if leader {
				n.peers.lead(time.Now())
				n.restoreTimeouts()
				stopCurrent = n.startTerm()
			}
		case <-n.stop:
			stopTerm()
			return
		}
	}
}

// startTerm runs leaderTerm in a goroutine; the returned func cancels it
// and waits for it to end.
func (n *Node) startTerm() func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.leaderTerm(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// leaderTerm is the leader's work for one term:
//
//  1. Barrier: every entry of earlier terms is applied, so fsm.Nodes and
//     fsm.LastTimestamp are current.
//  2. The term-start command (the cluster ID when the state has none,
//     OpSetNode for itself and static peers whose client address the node
//     table lacks, else an OpTick). Once it has
//     applied, the commit index always sits on an entry the FSM applies
//     (no-op and barrier entries never reach it), so a read index can be
//     waited for with fsm.WaitApplied on any node.
//  3. Ready: Propose and ReadIndex are served from now on.
//  4. Every TickInterval: propose an OpTick if buckets expired, promote
//     caught-up non-voters (read replicas excluded), record the regions
//     the node table lacks, and hand leadership to a preferred region
//     (regions.go). Every StampInterval: an OpTick if the log went idle
//     and read replicas exist.
func (n *Node) leaderTerm(ctx context.Context) {
	term := n.raft.CurrentTerm()
	if err := waitFuture(ctx, n.raft.Barrier(0)); err != nil {
		if ctx.Err() == nil {
			n.log.Warn("term barrier failed", "term", term, "err", err)
		}
		return
	}
	backoff := 100 * time.Millisecond
	for {
		_, err := n.proposeInternal(ctx, n.termStartOps())
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, ErrNotLeader) || errors.Is(err, ErrShutdown) {
			return
		}
		n.log.Warn("term start command failed; retrying", "term", term, "err", err)
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		case <-ctx.Done():
			return
		}
	}
	if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
		return
	}
	n.readyTerm.Store(term)
	n.broadcast()
	n.log.Info("leader ready", "term", term)

	nonvoterSince := map[raft.ServerID]time.Time{}
	n.termPlacement()
	t := time.NewTicker(n.cfg.TickInterval)
	defer t.Stop()
	var stampC <-chan time.Time
	if n.cfg.StampInterval > 0 {
		st := time.NewTicker(n.cfg.StampInterval)
		defer st.Stop()
		stampC = st.C
	}
	for {
		select {
		case <-t.C:
			n.expireTick(ctx)
			n.promote(ctx, nonvoterSince)
			n.syncRegions(ctx)
			n.placeLeader(ctx)
		case <-stampC:
			n.stampTick(ctx)
		case <-ctx.Done():
			return
		}
	}
}

// stampTick proposes an OpTick when the cluster has read replicas and no
// applied entry carries a leader timestamp from the last StampInterval:
// a replica's proof of freshness for bounded-staleness reads is the
// timestamp of the last entry it applied, so it must advance on an idle
// log too (see DESIGN.md, Read replicas). Under load client entries carry
// the clock and no tick is added.
func (n *Node) stampTick(ctx context.Context) {
	if time.Now().UnixMilli()-n.fsm.LastTimestamp() < n.cfg.StampInterval.Milliseconds() || len(n.fsm.Replicas()) == 0 {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := n.proposeInternal(tctx, []fsm.Op{{Kind: fsm.OpTick}}); err != nil && ctx.Err() == nil {
		n.log.Debug("timestamp tick failed", "err", err)
	}
}

func (n *Node) termStartOps() []fsm.Op {
	nodes := n.fsm.Nodes()
	ops, err := n.clusterIDOps()
	if err != nil {
		// Without randomness there is no ID to give; the cluster works
		// without one (as an older version's did) and the next term tries
		// again.
		n.log.Error("cannot assign a cluster ID", "err", err)
	}
	if nodes[n.cfg.NodeID] != n.cfg.GRPCAddr {
		ops = append(ops, fsm.Op{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: n.cfg.NodeID, GRPCAddr: n.cfg.GRPCAddr}})
	}
	for _, p := range n.cfg.Peers {
		// A static peer removed since is retired: putting it back would
		// list it in members and hand its address to clients.
		if p.ID != n.cfg.NodeID && p.GRPCAddr != "" && nodes[p.ID] == "" && !n.fsm.Retired(p.ID) {
			ops = append(ops, fsm.Op{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: p.ID, GRPCAddr: p.GRPCAddr}})
		}
	}
	ops = append(ops, n.regionOps()...)
	if len(ops) == 0 {
		ops = append(ops, fsm.Op{Kind: fsm.OpTick})
	}
	return ops
}

// expireTick proposes an OpTick when whole buckets have expired, so space
// comes back even when no client writes arrive.
func (n *Node) expireTick(ctx context.Context) {
	now := max(time.Now().UnixMilli(), n.fsm.LastTimestamp())
	if n.fsm.ExpiredBuckets(now) == 0 {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.proposeInternal(tctx, []fsm.Op{{Kind: fsm.OpTick}}); err != nil && ctx.Err() == nil {
		n.log.Warn("expiry tick failed", "err", err)
	}
}

// promote turns caught-up non-voters into voters, except read replicas
// (fsm.RoleReplica, recorded before the replica entered the
// configuration). The rule: a non-voter is
// promoted once it has been in the configuration for at least PromoteAfter
// (as seen by this leader) and
//   - with a Progress probe and a known client address: its FSM's applied
//     index is within PromoteMaxLag of the leader's commit index read
//     before the probe;
//   - otherwise: no heartbeat to it failed within the last PromoteAfter.
//
// A node still installing a snapshot answers the probe with an old applied
// index, so it stays a non-voter and cannot hurt the quorum meanwhile.
func (n *Node) promote(ctx context.Context, since map[raft.ServerID]time.Time) {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	now := time.Now()
	present := map[raft.ServerID]bool{}
	replicas := n.fsm.Replicas()
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage != raft.Nonvoter || replicas[string(s.ID)] {
			continue // read replicas are promoted only on request (Promote)
		}
		present[s.ID] = true
		first, ok := since[s.ID]
		if !ok {
			since[s.ID] = now
			continue
		}
		if now.Sub(first) < n.cfg.PromoteAfter || !n.caughtUp(ctx, s) {
			continue
		}
		if err := waitFuture(ctx, n.raft.AddVoter(s.ID, s.Address, 0, 5*time.Second)); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("promote non-voter failed", "peer", s.ID, "err", err)
			}
			continue
		}
		delete(since, s.ID)
		n.log.Info("promoted non-voter to voter", "peer", s.ID, "raft_addr", s.Address)
	}
	for id := range since {
		if !present[id] {
			delete(since, id)
		}
	}
}

func (n *Node) caughtUp(ctx context.Context, s raft.Server) bool {
	return n.lagging(ctx, s) == ""
}

// lagging says why the non-voter s is not ready to vote ("" if it is): the
// leader cannot reach it, or its applied index is more than PromoteMaxLag
// behind the commit index (with a Progress probe and a known client
// address), or a heartbeat to it failed within the last PromoteAfter.
func (n *Node) lagging(ctx context.Context, s raft.Server) string {
	commit := n.raft.CommitIndex()
	if n.cfg.Progress != nil {
		if addr := n.fsm.Nodes()[string(s.ID)]; addr != "" {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			applied, err := n.cfg.Progress(pctx, string(s.ID), addr)
			if err != nil {
				return fmt.Sprintf("the leader cannot reach it at %s (%v)", addr, err)
			}
			if applied+n.cfg.PromoteMaxLag < commit {
				return fmt.Sprintf("it has not caught up: applied index %d, commit index %d (at most %d behind)", applied, commit, n.cfg.PromoteMaxLag)
			}
			return ""
		}
	}
	n.hbMu.Lock()
	last, failed := n.hbFail[s.ID]
	n.hbMu.Unlock()
	if failed && time.Since(last) <= n.cfg.PromoteAfter {
		return fmt.Sprintf("a Raft heartbeat to it at %s failed %s ago", s.Address, time.Since(last).Round(time.Millisecond))
	}
	return ""
}
