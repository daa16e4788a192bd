package fsm

import (
	"maps"
	"testing"
)

// Node regions and cluster settings are replicated state: applied from the
// log, kept across a restart, carried by a snapshot, removed with the node.
func TestNodeRegionsAndSettings_ApplyRestartSnapshot(t *testing.T) {
	h := newHarness(t)
	res := h.apply(t0,
		Op{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n1", GRPCAddr: "h:1", Region: "us"}},
		Op{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n2", GRPCAddr: "h:2", Region: "eu"}},
		Op{Kind: OpSetNode, Node: NodeInfo{ID: "n3", GRPCAddr: "h:3"}},
		Op{Kind: OpSetSetting, Setting: Setting{Name: "preferred-leader-regions", Value: "us"}},
		Op{Kind: OpSetSetting, Setting: Setting{Name: "gone", Value: "x"}},
		Op{Kind: OpSetSetting, Setting: Setting{Name: "gone", Unset: true}},
		Op{Kind: OpSetSetting, Setting: Setting{Name: "empty", Value: ""}},
		Op{Kind: OpSetSetting, Setting: Setting{}},
	)
	for i, r := range res.Ops[:7] {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
	if res.Ops[7].Err == nil {
		t.Fatal("a setting without a name applied")
	}
	want := func(h *harness, what string) {
		t.Helper()
		if got, w := h.f.NodeRegions(), map[string]string{"n1": "us", "n2": "eu"}; !maps.Equal(got, w) {
			t.Fatalf("%s: regions %v, want %v", what, got, w)
		}
		if got, w := h.f.Nodes(), map[string]string{"n1": "h:1", "n2": "h:2", "n3": "h:3"}; !maps.Equal(got, w) {
			t.Fatalf("%s: nodes %v, want %v", what, got, w)
		}
		if got, w := h.f.Settings(), map[string]string{"preferred-leader-regions": "us", "empty": ""}; !maps.Equal(got, w) {
			t.Fatalf("%s: settings %v, want %v", what, got, w)
		}
	}
	want(h, "applied")
	h.reopen()
	want(h, "after restart")
	dst := newHarness(t)
	restoreFrom(t, h.f, dst.f)
	want(dst, "restored from a snapshot")

	// A region moves, and goes with its node.
	h.apply(t0+1, Op{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n2", GRPCAddr: "h:2", Region: "ap"}},
		Op{Kind: OpRemoveNode, Node: NodeInfo{ID: "n1"}})
	if got, w := h.f.NodeRegions(), map[string]string{"n2": "ap"}; !maps.Equal(got, w) {
		t.Fatalf("regions %v, want %v", got, w)
	}
	h.apply(t0+2, Op{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n2", GRPCAddr: "h:2"}})
	if got := h.f.NodeRegions(); len(got) != 0 {
		t.Fatalf("regions %v after clearing n2's", got)
	}
}
