package fsm

import "testing"

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
