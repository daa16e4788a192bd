package fsm

import (
	"testing"

	"github.com/hashicorp/raft"
)

// Every way a lease is lost answers CodeLeaseLost with the reason apply can
// tell from the record, the fence and the command's time: the same on a
// retry and after a restart (lost is a function of those alone, so every
// replica gives the same).
func TestLeaseLostReasons(t *testing.T) {
	h := newHarness(t)
	claim := func(ts int64, id string) ItemResult {
		return h.one(ts, Op{Kind: OpClaim, DurationMs: 5_000, Items: []Item{{ID: []byte(id)}}})
	}
	lease := func(ts int64, kind OpKind, id string, fence uint64) ItemResult {
		op := Op{Kind: kind, Items: []Item{{ID: []byte(id), Fence: fence}}}
		if kind == OpRenew {
			op.DurationMs = 5_000
		}
		return h.one(ts, op)
	}
	type probe struct {
		what  string
		ts    int64
		kind  OpKind
		id    string
		fence uint64
		want  LostReason
	}
	var probes []probe
	all := func(what string, ts int64, id string, fence uint64, want LostReason) {
		for _, k := range []OpKind{OpCommit, OpRenew, OpRelease} {
			probes = append(probes, probe{what, ts, k, id, fence, want})
		}
	}

	// never claimed
	all("never claimed", t0, "none", 7, LostNotClaimed)
	// a live lease held by another token; a token never granted
	held := claim(t0, "held")
	all("another token", t0+1, "held", held.Record.Fence+1, LostTokenMismatch)
	all("made-up token", t0+1, "held", held.Record.Fence+1000, LostTokenMismatch)
	// expired, nothing replaced it
	exp := claim(t0, "exp")
	all("expired", t0+6_000, "exp", exp.Record.Fence, LostExpired)
	// expired, then a newer claim took it
	old := claim(t0, "old")
	wantCode(t, "newer claim", claim(t0+6_000, "old"), CodeAcquired)
	all("newer claim after expiry", t0+6_001, "old", old.Record.Fence, LostTokenMismatch)
	// released by its holder
	rel := claim(t0, "rel")
	wantCode(t, "release", lease(t0+1, OpRelease, "rel", rel.Record.Fence), CodeOK)
	probes = append(probes,
		probe{"commit after release", t0 + 2, OpCommit, "rel", rel.Record.Fence, LostNotClaimed},
		probe{"renew after release", t0 + 2, OpRenew, "rel", rel.Record.Fence, LostNotClaimed})
	// committed: by this lease (renew/release after commit), another
	// holder, or a mark
	com := claim(t0, "com")
	wantCode(t, "commit", lease(t0+1, OpCommit, "com", com.Record.Fence), CodeOK)
	probes = append(probes,
		probe{"renew after own commit", t0 + 2, OpRenew, "com", com.Record.Fence, LostAlreadyCommitted},
		probe{"release after own commit", t0 + 2, OpRelease, "com", com.Record.Fence, LostAlreadyCommitted})
	wantCode(t, "mark", h.mark(t0, "marked", 0), CodeNew)
	all("marked", t0+1, "marked", 5, LostAlreadyCommitted)
	// forgotten
	fg := claim(t0, "forgot")
	wantCode(t, "forget", h.one(t0+1, Op{Kind: OpForget, Items: []Item{{ID: []byte("forgot")}}}), CodeOK)
	all("forgotten", t0+2, "forgot", fg.Record.Fence, LostNotClaimed)

	check := func(h *harness, round string) {
		t.Helper()
		for _, p := range probes {
			op := Op{Kind: p.kind, Items: []Item{{ID: []byte(p.id), Fence: p.fence}}}
			if p.kind == OpRenew {
				op.DurationMs = 5_000
			}
			r := h.one(p.ts, op)
			if r.Code != CodeLeaseLost || r.Reason != p.want {
				t.Errorf("%s: %s of %q: %s %q, want lease_lost %q", round, p.kind, p.what, r.Code, r.Reason, p.want)
			}
		}
	}
	check(h, "first")
	check(h, "retry") // a lost lease's answer changes nothing: the same again
	h.reopen()
	check(h, "after restart")

}

// A lease is proved by its fencing token and its claim's request token:
// a Commit, Renew or Release that names the live lease's fence with
// another token (a second consumer that read the fence, or guessed it: it
// is a Raft index) answers lease_lost token_mismatch and changes nothing;
// the holder's own calls, and retries of its claim, go on as before.
func TestLeaseOpsNeedTheClaimsRequestToken(t *testing.T) {
	h := newHarness(t)
	claim := func(ts int64, id, tok string) ItemResult {
		return h.one(ts, Op{Kind: OpClaim, DurationMs: 5_000, Items: []Item{{ID: []byte(id), Token: []byte(tok)}}})
	}
	lease := func(ts int64, kind OpKind, id string, fence uint64, tok string) ItemResult {
		op := Op{Kind: kind, Items: []Item{{ID: []byte(id), Fence: fence, Token: []byte(tok)}}}
		if kind == OpRenew {
			op.DurationMs = 5_000
		}
		return h.one(ts, op)
	}
	held := claim(t0, "job", "holder")
	wantCode(t, "claim", held, CodeAcquired)
	fence := held.Record.Fence
	for _, k := range []OpKind{OpCommit, OpRenew, OpRelease} {
		for _, tok := range []string{"intruder", "holde", "holder2"} {
			r := lease(t0+1, k, "job", fence, tok)
			if r.Code != CodeLeaseLost || r.Reason != LostTokenMismatch {
				t.Fatalf("%s with the holder's fence and token %q: %s %s, want lease_lost token_mismatch", k, tok, r.Code, r.Reason)
			}
		}
	}
	// Nothing changed: the lease is the holder's, live until its expiry.
	if r := h.check(t0+2, "job"); r.Code != CodeSeen || r.Record.State != StateLeased || r.Record.ExpiresMs != held.Record.ExpiresMs {
		t.Fatalf("after the intruder's calls: %s %+v, want the holder's lease unchanged (%+v)", r.Code, r.Record, held.Record)
	}
	if r := claim(t0+2, "job", "holder"); r.Code != CodeAcquired || r.Record.Fence != fence || string(r.Record.Token) != "holder" {
		t.Fatalf("the holder's claim retried: %s %+v, want acquired with fence %d", r.Code, r.Record, fence)
	}
	wantCode(t, "another claim", claim(t0+2, "job", "intruder"), CodeInProgress)
	wantCode(t, "holder renews", lease(t0+3, OpRenew, "job", fence, "holder"), CodeOK)
	wantCode(t, "holder commits", lease(t0+4, OpCommit, "job", fence, "holder"), CodeOK)
	wantCode(t, "holder's commit retried", lease(t0+5, OpCommit, "job", fence, "holder"), CodeOK)
	if r := lease(t0+5, OpCommit, "job", fence, "intruder"); r.Code != CodeLeaseLost || r.Reason != LostAlreadyCommitted {
		t.Fatalf("commit of the committed ID by another: %s %s, want lease_lost already_committed", r.Code, r.Reason)
	}

	// Release likewise: only the holder's frees the ID.
	rel := claim(t0, "rel", "holder")
	if r := lease(t0+1, OpRelease, "rel", rel.Record.Fence, "intruder"); r.Code != CodeLeaseLost {
		t.Fatalf("release by another: %s, want lease_lost", r.Code)
	}
	wantCode(t, "claim while held", claim(t0+2, "rel", "other"), CodeInProgress)
	wantCode(t, "holder releases", lease(t0+3, OpRelease, "rel", rel.Record.Fence, "holder"), CodeOK)
	wantCode(t, "claim after release", claim(t0+4, "rel", "other"), CodeAcquired)
}

// Entries written before lease items carried the holder's request token
// apply as their build applied them: a version 2 item without a token by
// its fence alone, and a version 1 item by its fence whatever token it
// carries (the decoder drops it).
func TestLeaseOpsOfOlderEntriesApplyByFence(t *testing.T) {
	h := newHarness(t)
	claim := func(id string) uint64 {
		r := h.one(t0, Op{Kind: OpClaim, DurationMs: 5_000, Items: []Item{{ID: []byte(id), Token: []byte("claim-call")}}})
		wantCode(t, "claim "+id, r, CodeAcquired)
		return r.Record.Fence
	}
	v2 := claim("v2")
	wantCode(t, "tokenless commit", h.one(t0+1, Op{Kind: OpCommit, Items: []Item{{ID: []byte("v2"), Fence: v2}}}), CodeOK)

	v1 := claim("v1")
	h.index++
	data := appendCommandV1(nil, &Command{TimestampMs: t0 + 1, Ops: []Op{{Kind: OpCommit, Items: []Item{{ID: []byte("v1"), Token: []byte("commit-call"), Fence: v1}}}}})
	res, ok := h.f.Apply(&raft.Log{Index: h.index, Term: 1, Type: raft.LogCommand, Data: data}).(*ApplyResult)
	if !ok || res.Ops[0].Err != nil || res.Ops[0].Items[0].Code != CodeOK {
		t.Fatalf("version 1 commit with the call's own token: %+v, want ok (applied by fence, as its build did)", res)
	}
}
