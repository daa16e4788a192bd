package fsm

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestDigestStateMatchesDigestAndIndex(t *testing.T) {
	a, b := newHarness(t), newHarness(t)
	logs := randomLog(21, 400)
	ctx := context.Background()
	// Compare at several prefixes of the log: b applies in one batch what a
	// applied entry by entry, and a third replica restores a's snapshot.
	for _, n := range []int{1, 57, 200, len(logs)} {
		for _, l := range logs[a.f.AppliedIndex():n] {
			a.f.Apply(l)
		}
		b.f.ApplyBatch(logs[b.f.AppliedIndex():n])
		da, err := a.f.DigestState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		db, err := b.f.DigestState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if da.AppliedIndex != uint64(n) || db.AppliedIndex != uint64(n) {
			t.Fatalf("applied index %d / %d, want %d", da.AppliedIndex, db.AppliedIndex, n)
		}
		if !bytes.Equal(da.Digest, db.Digest) || da.Records != db.Records || da.Keys != db.Keys || da.LastTsMs != db.LastTsMs {
			t.Fatalf("at %d: replicas differ: %+v vs %+v", n, da, db)
		}
		if st := a.f.Stats(); da.Records != st.IDsStored {
			t.Fatalf("at %d: %d records hashed, stats say %d stored", n, da.Records, st.IDsStored)
		}
		c := newHarness(t)
		restoreFrom(t, a.f, c.f)
		dc, err := c.f.DigestState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dc.Digest, da.Digest) || dc.AppliedIndex != da.AppliedIndex {
			t.Fatalf("at %d: restored replica differs: %+v vs %+v", n, dc, da)
		}
	}
	// One more entry changes the digest.
	before, _ := a.f.DigestState(ctx)
	a.index = a.f.AppliedIndex()
	a.mark(t0+10_000_000, "one-more", 60_000)
	after, _ := a.f.DigestState(ctx)
	if bytes.Equal(before.Digest, after.Digest) || after.AppliedIndex == before.AppliedIndex {
		t.Fatal("a new record left the digest or the index unchanged")
	}
}

func TestDigestStateCanceledAndClosed(t *testing.T) {
	h := newHarness(t)
	h.mark(t0, "x", 60_000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.f.DigestState(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: err = %v", err)
	}
	h.f.Close()
	if _, err := h.f.DigestState(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: err = %v", err)
	}
}
