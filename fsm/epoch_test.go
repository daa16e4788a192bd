package fsm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestFenceEpochRaisesEveryLaterToken: tokens are the Raft index in epoch 0;
// after OpRaiseFenceEpoch every token exceeds any token of a lower epoch,
// whatever the indexes; the epoch never goes down, is persisted, and
// travels in snapshots.
func TestFenceEpochRaisesEveryLaterToken(t *testing.T) {
	h := newHarness(t)
	claim := func(ts int64, id string) ItemResult {
		return h.one(ts, Op{Kind: OpClaim, DurationMs: 5_000, Items: []Item{{ID: []byte(id)}}})
	}
	a := claim(t0, "a")
	wantCode(t, "claim a", a, CodeAcquired)
	if a.Record.Fence != h.index || FenceEpochOf(a.Record.Fence) != 0 {
		t.Fatalf("epoch-0 fence = %d, want the Raft index %d", a.Record.Fence, h.index)
	}
	// The largest token epoch 0 could ever grant.
	maxEpoch0 := MakeFence(0, maxFenceIndex)

	raise := func(epoch uint64) OpResult {
		t.Helper()
		return h.apply(t0+1, Op{Kind: OpRaiseFenceEpoch, FenceEpoch: epoch}).Ops[0]
	}
	if r := raise(3); r.Err != nil || r.FenceEpoch != 3 {
		t.Fatalf("raise to 3: %+v", r)
	}
	if r := raise(2); r.Err != nil || r.FenceEpoch != 3 {
		t.Fatalf("raise to 2 lowered the epoch: %+v", r)
	}
	if r := raise(MaxFenceEpoch + 1); !errors.Is(r.Err, ErrFenceRange) || r.FenceEpoch != 3 {
		t.Fatalf("raise past the maximum: %+v", r)
	}
	b := claim(t0+2, "b")
	if FenceEpochOf(b.Record.Fence) != 3 || b.Record.Fence&maxFenceIndex != h.index || b.Record.Fence <= maxEpoch0 {
		t.Fatalf("epoch-3 fence = %#x (index %d)", b.Record.Fence, h.index)
	}
	// The fence presented must be the new one.
	wantCode(t, "commit b", h.one(t0+3, Op{Kind: OpCommit, Items: []Item{{ID: []byte("b"), Fence: b.Record.Fence}}}), CodeOK)

	h.reopen()
	if got := h.f.FenceEpoch(); got != 3 {
		t.Fatalf("epoch after restart = %d, want 3", got)
	}
	c := newHarness(t)
	restoreFrom(t, h.f, c.f)
	if got := c.f.FenceEpoch(); got != 3 {
		t.Fatalf("epoch after snapshot restore = %d, want 3", got)
	}
	dh, _ := h.f.Digest()
	dc, _ := c.f.Digest()
	if !bytes.Equal(dh, dc) {
		t.Fatal("restored replica differs")
	}
}

// TestFenceEpochApplyIsDeterministic: a raise inside a batch gives the
// same tokens and state as entries applied one by one.
func TestFenceEpochApplyIsDeterministic(t *testing.T) {
	var logs []*raft.Log
	for i, op := range []Op{
		{Kind: OpClaim, Items: []Item{{ID: []byte("x")}}},
		{Kind: OpRaiseFenceEpoch, FenceEpoch: 7},
		{Kind: OpClaim, Items: []Item{{ID: []byte("y")}}},
		{Kind: OpRaiseFenceEpoch, FenceEpoch: 5},
		{Kind: OpClaim, Items: []Item{{ID: []byte("z")}}},
	} {
		logs = append(logs, logOf(uint64(i+1), &Command{TimestampMs: t0, Ops: []Op{op}}))
	}
	a, b := newHarness(t), newHarness(t)
	var ra []any
	for _, l := range logs {
		ra = append(ra, a.f.Apply(l))
	}
	rb := b.f.ApplyBatch(logs)
	for i := range ra {
		x, y := ra[i].(*ApplyResult), rb[i].(*ApplyResult)
		if len(x.Ops[0].Items) > 0 && x.Ops[0].Items[0].Record.Fence != y.Ops[0].Items[0].Record.Fence {
			t.Fatalf("entry %d: fences differ", i+1)
		}
	}
	if z := rb[4].(*ApplyResult).Ops[0].Items[0].Record.Fence; z != MakeFence(7, 5) {
		t.Fatalf("fence of z = %#x, want %#x", z, MakeFence(7, 5))
	}
	da, _ := a.f.Digest()
	db, _ := b.f.Digest()
	if !bytes.Equal(da, db) {
		t.Fatal("batched and single applies differ")
	}
}

// TestSeedFenceEpochAndCountRecords covers the two helpers of seeding a
// cluster from a backup.
func TestSeedFenceEpochAndCountRecords(t *testing.T) {
	h := newHarness(t)
	h.mark(t0, "committed", 60_000)
	h.mark(t0, "expired", 1_000)
	h.one(t0, Op{Kind: OpClaim, DurationMs: 30_000, Items: []Item{{ID: []byte("leased")}}})
	r := h.one(t0, Op{Kind: OpClaim, DurationMs: 30_000, Items: []Item{{ID: []byte("released")}}})
	h.one(t0, Op{Kind: OpRelease, Items: []Item{{ID: []byte("released"), Fence: r.Record.Fence}}})
	c, err := h.f.CountRecords(t0 + 2_000)
	if err != nil {
		t.Fatal(err)
	}
	if want := (RecordCounts{Committed: 1, Leased: 1, Released: 1, Expired: 1}); c != want || c.Live() != 2 {
		t.Fatalf("counts %+v, want %+v", c, want)
	}
	if e, err := h.f.SeedFenceEpoch(4); err != nil || e != 4 {
		t.Fatalf("seed epoch: %d %v", e, err)
	}
	if e, err := h.f.SeedFenceEpoch(2); err != nil || e != 4 {
		t.Fatalf("seed lower epoch: %d %v", e, err)
	}
	if _, err := h.f.SeedFenceEpoch(MaxFenceEpoch + 1); !errors.Is(err, ErrFenceRange) {
		t.Fatalf("seed past the maximum: %v", err)
	}
	h.reopen()
	if got := h.f.FenceEpoch(); got != 4 {
		t.Fatalf("seeded epoch after restart = %d", got)
	}
}
