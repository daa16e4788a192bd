package fsm

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

// codes returns the codes of an op's item results.
func codes(t *testing.T, r OpResult) []Code {
	t.Helper()
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	out := make([]Code, len(r.Items))
	for i, it := range r.Items {
		out[i] = it.Code
	}
	return out
}

func wantCodes(t *testing.T, what string, r OpResult, want ...Code) {
	t.Helper()
	got := codes(t, r)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func items(tok string, ids ...string) []Item {
	out := make([]Item, len(ids))
	for i, id := range ids {
		out[i] = Item{ID: []byte(id), Token: []byte(tok)}
	}
	return out
}

// Within one request the first occurrence of an ID wins and a repeat
// answers as a second request would; the whole request retried (same
// token) answers exactly as its first attempt, repeats included.
func TestRepeatWithinRequest_MarkFirstWinsAndRetryAnswersAlike(t *testing.T) {
	for _, mode := range []ExpiryMode{ExpiryFixed, ExpirySliding} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			h := newHarness(t)
			ns := FillNamespaceDefaults(NamespaceConfig{Name: "n", MaxTTLMs: 3_600_000, DefaultTTLMs: 60_000, Mode: mode})
			if err := h.apply(t0, Op{Kind: OpCreateNamespace, Config: ns}).Ops[0].Err; err != nil {
				t.Fatal(err)
			}
			op := Op{Kind: OpMark, Namespace: "n", Items: items("tok", "x", "x", "y", "x")}
			first := h.apply(t0, op).Ops[0]
			wantCodes(t, "mark x x y x", first, CodeNew, CodeDuplicate, CodeNew, CodeDuplicate)
			for _, i := range []int{1, 3} {
				if r := first.Items[i].Record; r.FirstSeenMs != t0 || r.ExpiresMs != t0+60_000 || string(r.Token) != "tok" {
					t.Fatalf("repeat %d: record %+v, want the first occurrence's", i, r)
				}
			}
			// The retry, later: alike, and it moves no expiry (sliding
			// either: a retry is not a new sighting).
			retry := h.apply(t0+5_000, op).Ops[0]
			wantCodes(t, "retried mark x x y x", retry, CodeNew, CodeDuplicate, CodeNew, CodeDuplicate)
			r, err := h.f.Check("n", [][]byte{[]byte("x")}, t0+5_000)
			if err != nil {
				t.Fatal(err)
			}
			if r[0].Record.ExpiresMs != t0+60_000 {
				t.Fatalf("retry moved x's expiry to %d, want %d", r[0].Record.ExpiresMs, t0+60_000)
			}
			// Another call's request: duplicates throughout.
			op.Items = items("other", "x", "x")
			wantCodes(t, "other call", h.apply(t0+6_000, op).Ops[0], CodeDuplicate, CodeDuplicate)
		})
	}
}

// A repeat with another digest conflicts, as a second request would, and
// the retry says so again.
func TestRepeatWithinRequest_MarkOtherDigestConflicts(t *testing.T) {
	h := newHarness(t)
	op := Op{Kind: OpMark, Items: []Item{
		{ID: []byte("x"), Token: []byte("t"), Digest: []byte("d1")},
		{ID: []byte("x"), Token: []byte("t"), Digest: []byte("d2")},
		{ID: []byte("x"), Token: []byte("t"), Digest: []byte("d1")},
	}}
	wantCodes(t, "first", h.apply(t0, op).Ops[0], CodeNew, CodeConflict, CodeDuplicate)
	wantCodes(t, "retry", h.apply(t0+1, op).Ops[0], CodeNew, CodeConflict, CodeDuplicate)
}

// A repeat is the same ID with the same token: in a request carrying many
// callers' items (the client's Batcher), a caller's retry that shares a
// request with another caller's first try of its ID still gets its own
// first answer, and two callers' first tries get one new, one duplicate.
func TestRepeatWithinRequest_KeyedByIDAndToken(t *testing.T) {
	h := newHarness(t)
	wantCodes(t, "A alone", h.apply(t0, Op{Kind: OpMark, Items: items("A", "x")}).Ops[0], CodeNew)
	both := Op{Kind: OpMark, Items: []Item{
		{ID: []byte("x"), Token: []byte("B")}, // B's first try
		{ID: []byte("x"), Token: []byte("A")}, // A's retry
		{ID: []byte("y"), Token: []byte("A")},
		{ID: []byte("y"), Token: []byte("B")},
	}}
	wantCodes(t, "B first, A retried; then two callers", h.apply(t0+1, both).Ops[0], CodeDuplicate, CodeNew, CodeNew, CodeDuplicate)

	claim := Op{Kind: OpClaim, Items: []Item{{ID: []byte("c"), Token: []byte("A")}, {ID: []byte("c"), Token: []byte("B")}}}
	wantCodes(t, "two callers claim", h.apply(t0+2, claim).Ops[0], CodeAcquired, CodeInProgress)
}

// Separate requests stay separate although Raft groups them into one
// entry: a request retried while its first attempt is in flight can land
// in the same entry, and answers alike.
func TestRepeatWithinRequest_ScopeIsTheRequestNotTheEntry(t *testing.T) {
	h := newHarness(t)
	op := Op{Kind: OpMark, Items: items("t", "x", "x")}
	res := h.apply(t0, op, op)
	wantCodes(t, "attempt", res.Ops[0], CodeNew, CodeDuplicate)
	wantCodes(t, "retry in the same entry", res.Ops[1], CodeNew, CodeDuplicate)
}

func TestRepeatWithinRequest_ClaimAndLeaseOps(t *testing.T) {
	h := newHarness(t)
	claim := Op{Kind: OpClaim, DurationMs: 5_000, Items: items("t", "c", "c", "d")}
	first := h.apply(t0, claim).Ops[0]
	wantCodes(t, "claim c c d", first, CodeAcquired, CodeInProgress, CodeAcquired)
	fence := first.Items[0].Record.Fence
	retry := h.apply(t0+1, claim).Ops[0]
	wantCodes(t, "retried claim c c d", retry, CodeAcquired, CodeInProgress, CodeAcquired)
	if retry.Items[0].Record.Fence != fence {
		t.Fatalf("retry fence %d, first %d", retry.Items[0].Record.Fence, fence)
	}

	lease := func(kind OpKind, id string, n int) Op {
		op := Op{Kind: kind}
		if kind == OpRenew {
			op.DurationMs = 5_000
		}
		for range n {
			op.Items = append(op.Items, Item{ID: []byte(id), Fence: fence})
		}
		return op
	}
	// The same lease twice in one request: the second as a second request
	// would be answered (a retried renew, commit or release answers ok).
	wantCodes(t, "renew c c", h.apply(t0+2, lease(OpRenew, "c", 2)).Ops[0], CodeOK, CodeOK)
	wantCodes(t, "commit c c", h.apply(t0+3, lease(OpCommit, "c", 2)).Ops[0], CodeOK, CodeOK)
	wantCodes(t, "commit c c again", h.apply(t0+4, lease(OpCommit, "c", 2)).Ops[0], CodeOK, CodeOK)
	wantCodes(t, "claim after commit", h.apply(t0+5, claim).Ops[0], CodeDuplicate, CodeDuplicate, CodeAcquired)
	d := h.check(t0+5, "d").Record.Fence
	fence = d
	wantCodes(t, "release d d", h.apply(t0+6, lease(OpRelease, "d", 2)).Ops[0], CodeOK, CodeOK)
	wantCodes(t, "release d d again", h.apply(t0+7, lease(OpRelease, "d", 2)).Ops[0], CodeOK, CodeOK)
}

// repeatLogs is randomLog with repeats added to its Mark and Claim ops
// (copies of earlier items of the op: same ID and token, sometimes another
// digest), and the same log with every repeat taken out.
func repeatLogs(seed uint64, n int) (with, without []*raft.Log) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for _, l := range randomLog(seed, n) {
		cmd, err := DecodeCommand(l.Data)
		if err != nil {
			panic(err)
		}
		bare := Command{TimestampMs: cmd.TimestampMs, Ops: make([]Op, len(cmd.Ops))}
		for j := range cmd.Ops {
			op := &cmd.Ops[j]
			bare.Ops[j] = *op
			if op.Kind != OpMark && op.Kind != OpClaim {
				continue
			}
			for range rng.IntN(4) {
				it := op.Items[rng.IntN(len(op.Items))]
				if rng.IntN(3) == 0 {
					it.Digest = []byte("other")
				}
				op.Items = slices.Insert(op.Items, rng.IntN(len(op.Items))+1, it)
			}
			bare.Ops[j].Items = nil
			seen := map[string]bool{}
			for _, it := range op.Items {
				k := string(it.ID) + "\x00" + string(it.Token)
				if !seen[k] {
					seen[k] = true
					bare.Ops[j].Items = append(bare.Ops[j].Items, it)
				}
			}
		}
		with = append(with, logOf(l.Index, &cmd))
		without = append(without, logOf(l.Index, &bare))
	}
	return with, without
}

// A repeat writes nothing: a log whose requests repeat IDs reaches the
// state of the same log without the repeats, byte for byte, and its first
// occurrences answer as there. That is also why entries written before
// repeats were recognised replay to the state they reached then (the old
// answer to a repeat, a retry's new or acquired, wrote nothing either):
// only the answers to repeats changed.
func TestRepeatWithinRequest_WritesNothingAndFirstOccurrencesAnswerAsWithout(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			with, without := repeatLogs(seed, 200)
			a, b := newHarness(t), newHarness(t)
			repeats := 0
			for i := range with {
				ra, _ := a.f.Apply(with[i]).(*ApplyResult)
				rb, _ := b.f.Apply(without[i]).(*ApplyResult)
				if ra == nil || rb == nil {
					continue
				}
				cmd, _ := DecodeCommand(with[i].Data)
				for j, op := range cmd.Ops {
					oa, ob := ra.Ops[j], rb.Ops[j]
					if (oa.Err == nil) != (ob.Err == nil) {
						t.Fatalf("entry %d op %d: errors %v / %v", i+1, j, oa.Err, ob.Err)
					}
					if oa.Err != nil || (op.Kind != OpMark && op.Kind != OpClaim) {
						continue
					}
					seen := map[string]bool{}
					k := 0
					for n, it := range op.Items {
						key := string(it.ID) + "\x00" + string(it.Token)
						got := oa.Items[n]
						if seen[key] {
							repeats++
							if got.Code == CodeNew || got.Code == CodeAcquired {
								t.Fatalf("entry %d op %d item %d (%s, repeat): %s", i+1, j, n, it.ID, got.Code)
							}
							continue
						}
						seen[key] = true
						if want := ob.Items[k]; got.Code != want.Code || got.Record.Fence != want.Record.Fence || got.Record.ExpiresMs != want.Record.ExpiresMs {
							t.Fatalf("entry %d op %d item %d (%s): %s %+v, without repeats %s %+v", i+1, j, n, it.ID, got.Code, got.Record, want.Code, want.Record)
						}
						k++
					}
				}
			}
			if repeats == 0 {
				t.Fatal("the log holds no repeats")
			}
			da, err := a.f.DigestState(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			db, err := b.f.DigestState(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(da.Digest, db.Digest) || da.Records != db.Records {
				t.Fatalf("states differ: with repeats %+v, without %+v", da, db)
			}
		})
	}
}
