package fsm

import (
	"errors"
	"testing"
)

// TestRemoveNode_RetiresTheIDForGood: removing a node retires its ID,
// also when the node table never held it (a member removed before its
// join recorded an address); the retirement survives a restart and a
// snapshot, and removing again changes nothing.
func TestRemoveNode_RetiresTheIDForGood(t *testing.T) {
	h := newHarness(t)
	const t0 = int64(1_700_000_000_000)
	h.apply(t0, Op{Kind: OpSetNode, Node: NodeInfo{ID: "n2", GRPCAddr: "127.0.0.1:2"}})
	if h.f.Retired("n2") {
		t.Fatal("n2 retired before its removal")
	}
	r := h.apply(t0+1, Op{Kind: OpRemoveNode, Node: NodeInfo{ID: "n2"}}, Op{Kind: OpRemoveNode, Node: NodeInfo{ID: "n9"}})
	if r.Ops[0].Err != nil || !errors.Is(r.Ops[1].Err, ErrNodeNotFound) {
		t.Fatalf("removals: %v, %v; want ok and node not found", r.Ops[0].Err, r.Ops[1].Err)
	}
	for _, id := range []string{"n2", "n9"} {
		if !h.f.Retired(id) {
			t.Fatalf("%s removed but not retired", id)
		}
	}
	if h.f.Retired("n3") {
		t.Fatal("n3 retired without a removal")
	}
	if r := h.apply(t0+2, Op{Kind: OpRemoveNode, Node: NodeInfo{ID: "n2"}}); !errors.Is(r.Ops[0].Err, ErrNodeNotFound) || !h.f.Retired("n2") {
		t.Fatalf("second removal of n2: %v, retired %v", r.Ops[0].Err, h.f.Retired("n2"))
	}
	if r := h.apply(t0+3, Op{Kind: OpRemoveNode}); !errors.Is(r.Ops[0].Err, ErrInvalidArgument) || h.f.Retired("") {
		t.Fatalf("removal of an empty ID: %v, want invalid and nothing retired", r.Ops[0].Err)
	}
	h.reopen()
	if !h.f.Retired("n2") || !h.f.Retired("n9") {
		t.Fatal("retirements lost at restart")
	}
	dst := newHarness(t)
	restoreFrom(t, h.f, dst.f)
	if !dst.f.Retired("n2") || !dst.f.Retired("n9") || dst.f.Retired("n3") {
		t.Fatal("a restored replica does not hold the same retirements")
	}
}
