package fsm

import (
	"errors"
	"testing"
)

// TestNodeRole_RecordedRestartedSnapshottedRemoved: a replica's role is
// replicated state: it survives a restart and a snapshot restore, goes
// back to RoleMember on request and disappears with the node.
func TestNodeRole_RecordedRestartedSnapshottedRemoved(t *testing.T) {
	h := newHarness(t)
	res := h.apply(t0,
		Op{Kind: OpSetNodeRole, Node: NodeInfo{ID: "r1", Role: RoleReplica}},
		Op{Kind: OpSetNode, Node: NodeInfo{ID: "r1", GRPCAddr: "h:1"}},
		Op{Kind: OpSetNodeRole, Node: NodeInfo{ID: "r2", Role: RoleReplica}},
	)
	for i, r := range res.Ops {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
	if got := h.f.Replicas(); !got["r1"] || !got["r2"] || len(got) != 2 {
		t.Fatalf("replicas %v, want r1 and r2", got)
	}
	h.reopen()
	if h.f.NodeRole("r1") != RoleReplica {
		t.Fatalf("after restart r1 is %s, want replica", h.f.NodeRole("r1"))
	}
	dst := newHarness(t)
	restoreFrom(t, h.f, dst.f)
	if dst.f.NodeRole("r2") != RoleReplica {
		t.Fatalf("after restore r2 is %s, want replica", dst.f.NodeRole("r2"))
	}
	h.apply(t0+1, Op{Kind: OpSetNodeRole, Node: NodeInfo{ID: "r2", Role: RoleMember}}, Op{Kind: OpRemoveNode, Node: NodeInfo{ID: "r1"}})
	if got := h.f.Replicas(); len(got) != 0 {
		t.Fatalf("replicas %v after promote and remove, want none", got)
	}
	h.reopen()
	if got := h.f.Replicas(); len(got) != 0 {
		t.Fatalf("replicas %v after restart, want none", got)
	}
	if r := h.apply(t0+2, Op{Kind: OpSetNodeRole, Node: NodeInfo{Role: RoleReplica}}); !errors.Is(r.Ops[0].Err, ErrInvalidArgument) {
		t.Fatalf("empty node id: %v, want invalid argument", r.Ops[0].Err)
	}
}

func TestNodeRole_UnknownRoleIsCorrupt(t *testing.T) {
	b := AppendCommand(nil, &Command{Ops: []Op{{Kind: OpSetNodeRole, Node: NodeInfo{ID: "x", Role: RoleReplica}}}})
	b[len(b)-1] = 7
	if _, err := DecodeCommand(b); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("role 7: %v, want ErrCorruptCommand", err)
	}
}
