package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// SettingPreferredLeaderRegions is the cluster setting (fsm.Settings) that
// lists, comma-separated, the regions leadership should stay in.
const SettingPreferredLeaderRegions = "preferred-leader-regions"

// RegionProbe asks the node id (reachable for clients at grpcAddr) for the
// region it was started with ("" for none).
type RegionProbe func(ctx context.Context, id, grpcAddr string) (region string, err error)

// ParseRegions splits a comma-separated region list, trimming the spaces
// around each name and dropping repeated names. An empty list ("" or only
// spaces) is nil: no preference. An empty entry in a list ("us,,eu", a
// trailing comma) is an error naming its position, as is an invalid name
// (CheckRegion: letters, digits, '-', '_' and '.', at most 64 bytes):
// etcd and CockroachDB refuse such lists rather than guess, and a stray
// comma is more often a region left out than one too many.
func ParseRegions(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for i, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			return nil, fmt.Errorf("%q: entry %d is empty (a stray comma?): want region names separated by commas, e.g. us-east,eu-west", s, i+1)
		}
		if err := CheckRegion(r); err != nil {
			return nil, err
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// CheckRegion says whether r is a valid region name ("" is: no region).
func CheckRegion(r string) error {
	if len(r) > 64 {
		return fmt.Errorf("region %q: longer than 64 bytes", r)
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("region %q: want letters, digits, '-', '_' or '.'", r)
		}
	}
	return nil
}

// Region is the region this node was started with ("" for none).
func (n *Node) Region() string { return n.cfg.Region }

// PreferredLeaderRegions returns the cluster setting as this node applied
// it (nil when unset or empty).
func (n *Node) PreferredLeaderRegions() []string {
	rs, _ := ParseRegions(n.fsm.Settings()[SettingPreferredLeaderRegions])
	return rs
}

// NodeRegions returns node ID → region for every node whose region the
// replicated node table records.
func (n *Node) NodeRegions() map[string]string { return n.fsm.NodeRegions() }

// SetSetting sets (or, with unset, clears) a cluster setting through the
// log; a cleared setting stays cleared (SeedSettings only fill a setting
// the cluster never had). Leader only (*NotLeaderError otherwise). Known settings are checked:
// preferred-leader-regions must be a valid region list.
func (n *Node) SetSetting(ctx context.Context, name, value string, unset bool) error {
	switch name {
	case SettingPreferredLeaderRegions:
		rs, err := ParseRegions(value)
		if err != nil {
			return &fsm.InvalidError{Field: "value", Reason: err.Error()}
		}
		value = strings.Join(rs, ",")
	default:
		return &fsm.InvalidError{Field: "name", Reason: fmt.Sprintf("unknown cluster setting %q (known: %s)", name, SettingPreferredLeaderRegions)}
	}
	if unset {
		// Cleared, not removed: a removed setting would be seeded again
		// by the next leader started with --preferred-leader-regions.
		value = ""
	}
	res, err := n.Propose(ctx, []fsm.Op{{Kind: fsm.OpSetSetting, Setting: fsm.Setting{Name: name, Value: value}}})
	if err != nil {
		return err
	}
	return res[0].Err
}

// placement is the leader's state for keeping leadership in the preferred
// regions and the node table's regions current. Touched only by the
// leadership goroutines, which run one at a time.
type placement struct {
	// since is when "this leader is outside the preferred regions and a
	// voter inside exists" began to hold (zero: it does not).
	since time.Time
	// lastTransfer is when this node last handed leadership away for
	// placement; backoff doubles the hold (up to 16×) each time this node
	// is elected again within PreferFlapWindow of such a transfer.
	lastTransfer time.Time
	backoff      int
	// checked is when each node's region was last probed.
	checked map[string]time.Time
}

// regionOps returns the ops that record this node's region and seed the
// cluster settings the table lacks (term start).
func (n *Node) regionOps() []fsm.Op {
	var ops []fsm.Op
	if n.cfg.Region != "" && n.fsm.NodeRegions()[n.cfg.NodeID] != n.cfg.Region {
		ops = append(ops, fsm.Op{Kind: fsm.OpSetNodeRegion, Node: fsm.NodeInfo{ID: n.cfg.NodeID, GRPCAddr: n.cfg.GRPCAddr, Region: n.cfg.Region}})
	}
	settings := n.fsm.Settings()
	names := make([]string, 0, len(n.cfg.SeedSettings))
	for name := range n.cfg.SeedSettings {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, ok := settings[name]; !ok {
			ops = append(ops, fsm.Op{Kind: fsm.OpSetSetting, Setting: fsm.Setting{Name: name, Value: n.cfg.SeedSettings[name]}})
		}
	}
	return ops
}

// termPlacement starts a term's placement state: a node elected again soon
// after it handed leadership away for placement waits longer next time.
func (n *Node) termPlacement() {
	p := &n.place
	p.since = time.Time{}
	if !p.lastTransfer.IsZero() && time.Since(p.lastTransfer) < n.cfg.PreferFlapWindow {
		p.backoff = min(max(2*p.backoff, 2), 16)
	} else {
		p.backoff = 1
	}
}

// syncRegions probes the members whose region the node table lacks (and
// every member once per minute) and records what they answer.
func (n *Node) syncRegions(ctx context.Context) {
	if n.cfg.RegionProbe == nil {
		return
	}
	p := &n.place
	if p.checked == nil {
		p.checked = map[string]time.Time{}
	}
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	nodes, regions := n.fsm.Nodes(), n.fsm.NodeRegions()
	for _, s := range cf.Configuration().Servers {
		id := string(s.ID)
		addr := nodes[id]
		if id == n.cfg.NodeID || addr == "" {
			continue
		}
		if _, ok := regions[id]; ok && time.Since(p.checked[id]) < time.Minute {
			continue
		}
		if time.Since(p.checked[id]) < 5*time.Second {
			continue // a node without a region: ask again now and then
		}
		p.checked[id] = time.Now()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		region, err := n.cfg.RegionProbe(pctx, id, addr)
		cancel()
		if err != nil || region == regions[id] || CheckRegion(region) != nil {
			continue
		}
		op := fsm.Op{Kind: fsm.OpSetNodeRegion, Node: fsm.NodeInfo{ID: id, GRPCAddr: addr, Region: region}}
		if _, err := n.proposeInternal(ctx, []fsm.Op{op}); err != nil && ctx.Err() == nil {
			n.log.Warn("recording a node's region failed", "peer", id, "region", region, "err", err)
		} else if err == nil {
			n.log.Info("recorded node region", "peer", id, "region", region)
		}
	}
}

// placeLeader hands leadership to a caught-up voter in a preferred region
// when this leader is outside them. Hysteresis: the condition must have
// held for PreferHold (times the backoff) on this leader, and this node
// hands leadership away for placement at most once per PreferMinInterval.
// A voter counts as caught up when its applied index is within
// PromoteMaxLag of the commit index (Progress probe); among several, the
// first preferred region wins, then the most applied.
func (n *Node) placeLeader(ctx context.Context) {
	p := &n.place
	pref := n.PreferredLeaderRegions()
	if len(pref) == 0 || slices.Contains(pref, n.cfg.Region) {
		p.since = time.Time{}
		return
	}
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	regions := n.fsm.NodeRegions()
	var cands []raft.Server
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter && s.ID != raft.ServerID(n.cfg.NodeID) && slices.Contains(pref, regions[string(s.ID)]) {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		p.since = time.Time{}
		return
	}
	now := time.Now()
	if p.since.IsZero() {
		p.since = now
		n.log.Info("leader outside the preferred regions", "region", n.cfg.Region, "preferred", strings.Join(pref, ","),
			"hold", n.cfg.PreferHold*time.Duration(max(p.backoff, 1)))
		return
	}
	if now.Sub(p.since) < n.cfg.PreferHold*time.Duration(max(p.backoff, 1)) ||
		(!p.lastTransfer.IsZero() && now.Sub(p.lastTransfer) < n.cfg.PreferMinInterval) {
		return
	}
	// The best caught-up candidate.
	commit := n.raft.CommitIndex()
	var best *raft.Server
	var bestRank int
	var bestApplied uint64
	for i := range cands {
		s := &cands[i]
		applied, ok := n.progressOf(ctx, s)
		if !ok || applied+n.cfg.PromoteMaxLag < commit {
			continue
		}
		rank := slices.Index(pref, regions[string(s.ID)])
		if best == nil || rank < bestRank || rank == bestRank && applied > bestApplied {
			best, bestRank, bestApplied = s, rank, applied
		}
	}
	if best == nil {
		return
	}
	p.lastTransfer = now
	n.log.Info("moving leadership into a preferred region", "to", best.ID, "region", regions[string(best.ID)],
		"from_region", n.cfg.Region, "outside_for", now.Sub(p.since).Round(time.Millisecond))
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := waitFuture(tctx, n.raft.LeadershipTransferToServer(best.ID, best.Address)); err != nil && ctx.Err() == nil {
		n.log.Warn("leadership transfer into a preferred region failed", "to", best.ID, "err", err)
	}
}

// progressOf returns the applied index of voter s (Progress probe), or
// false when it cannot be known.
func (n *Node) progressOf(ctx context.Context, s *raft.Server) (uint64, bool) {
	addr := n.fsm.Nodes()[string(s.ID)]
	if n.cfg.Progress == nil || addr == "" {
		return 0, false
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	applied, err := n.cfg.Progress(pctx, string(s.ID), addr)
	return applied, err == nil
}
