package fsm

import (
	"errors"
	"testing"
)

// The cluster ID is set once through the log and then holds: a second
// value, or its removal, is refused by every replica alike, and the ID
// survives a restart and travels in a snapshot. A state of an older
// version (no ID) reads as "".
func TestClusterID_SetOnceKeptAcrossRestartAndSnapshot(t *testing.T) {
	h := newHarness(t)
	if got := h.f.ClusterID(); got != "" {
		t.Fatalf("fresh state: cluster ID %q, want none", got)
	}
	set := func(v string) Op {
		return Op{Kind: OpSetSetting, Setting: Setting{Name: ClusterIDSetting, Value: v}}
	}
	res := h.apply(t0, set("aaaa"), set("aaaa"), set("bbbb"),
		Op{Kind: OpSetSetting, Setting: Setting{Name: ClusterIDSetting, Unset: true}}, set(""))
	for i, r := range res.Ops[:2] {
		if r.Err != nil {
			t.Fatalf("op %d (first value, then the same again): %v", i, r.Err)
		}
	}
	if err := res.Ops[2].Err; !errors.Is(err, ErrClusterIDSet) {
		t.Fatalf("second cluster ID: %v, want ErrClusterIDSet", err)
	}
	for i, r := range res.Ops[3:] {
		if !errors.Is(r.Err, ErrInvalidArgument) {
			t.Fatalf("op %d (unset / empty): %v, want ErrInvalidArgument", i+3, r.Err)
		}
	}
	want := func(h *harness, what string) {
		t.Helper()
		if got := h.f.ClusterID(); got != "aaaa" {
			t.Fatalf("%s: cluster ID %q, want aaaa", what, got)
		}
	}
	want(h, "applied")
	h.reopen()
	want(h, "after restart")
	dst := newHarness(t)
	restoreFrom(t, h.f, dst.f)
	want(dst, "restored from a snapshot")
}
