package check

import (
	"bytes"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/chaos/history"
)

// t0 is the start of every test history, in leader milliseconds.
const t0 = int64(1_700_000_000_000)

// at converts an offset in milliseconds from t0 to history nanoseconds.
func at(offMs int64) int64 { return (t0 + offMs) * int64(time.Millisecond) }

const hour = int64(time.Hour / time.Millisecond)

type builder struct {
	h   history.History
	seq int64
}

func newBuilder() *builder {
	return &builder{h: history.History{Meta: history.Meta{Nodes: []string{"n1", "n2", "n3"}, Finished: true}}}
}

func (b *builder) add(o history.Op) *builder {
	b.seq++
	o.Seq = b.seq
	if o.Outcome == "" {
		o.Outcome = history.OK
	}
	b.h.Ops = append(b.h.Ops, o)
	return b
}

// mark adds an acknowledged Mark of key by token over [s, e] ms, applied at
// leader time applied with a 1 h TTL, answering result for the record of
// recTok.
func (b *builder) mark(client int, key, token string, s, e int64, result, recTok string, applied int64) *builder {
	return b.add(history.Op{Client: client, Kind: history.Mark, Key: key, Token: token, Start: at(s), End: at(e), Result: result,
		Record: &history.Record{State: "committed", FirstSeenMs: t0 + applied, ExpiresMs: t0 + applied + hour, Token: recTok}})
}

func (b *builder) markInfo(client int, key, token string, s int64) *builder {
	return b.add(history.Op{Client: client, Kind: history.Mark, Key: key, Token: token, Start: at(s), End: at(s + 5000), Outcome: history.Info, Error: "Unavailable"})
}

func (b *builder) check(client int, key string, s, e int64, result string) *builder {
	return b.add(history.Op{Client: client, Kind: history.Check, Key: key, Consistency: history.Linearizable, Start: at(s), End: at(e), Result: result})
}

// claim adds an acknowledged Claim; for ACQUIRED the lease runs leaseMs from
// applied and its fence is fence.
func (b *builder) claim(client int, key, token string, s, e int64, result string, applied, leaseMs int64, fence uint64) *builder {
	return b.add(history.Op{Client: client, Kind: history.Claim, Key: key, Token: token, Start: at(s), End: at(e), Result: result,
		Record: &history.Record{State: "leased", FirstSeenMs: t0 + applied, ExpiresMs: t0 + applied + leaseMs, Token: token, Fence: fence}})
}

// busy sets the record token of the last op (a claim answered
// IN_PROGRESS or DUPLICATE) to the holder's.
func (b *builder) busy(holder string) *builder {
	b.h.Ops[len(b.h.Ops)-1].Record.Token = holder
	return b
}

func (b *builder) commit(client int, key string, fence uint64, s, e int64, result, claimTok string, claimApplied int64) *builder {
	o := history.Op{Client: client, Kind: history.Commit, Key: key, Fence: fence, Start: at(s), End: at(e), Result: result}
	if result == history.ResultOK {
		o.Record = &history.Record{State: "committed", FirstSeenMs: t0 + claimApplied, ExpiresMs: t0 + e + hour, Token: claimTok, Fence: fence}
	}
	return b.add(o)
}

func (b *builder) release(client int, key string, fence uint64, s, e int64, result string) *builder {
	return b.add(history.Op{Client: client, Kind: history.Release, Key: key, Fence: fence, Start: at(s), End: at(e), Result: result})
}

// final adds the same final read on every node unless per-node results
// are given.
func (b *builder) final(key string, atMs int64, rec *history.Record, results ...string) *builder {
	for i, n := range b.h.Meta.Nodes {
		res := history.Seen
		if rec == nil {
			res = history.NotSeen
		}
		if i < len(results) {
			res = results[i]
		}
		r := history.FinalRead{Node: n, Key: key, At: at(atMs), Result: res}
		if res == history.Seen {
			r.Record = rec
		}
		b.h.Final = append(b.h.Final, r)
	}
	return b
}

func committed(token string, applied int64) *history.Record {
	return &history.Record{State: "committed", FirstSeenMs: t0 + applied, ExpiresMs: t0 + applied + hour, Token: token}
}

func run(t *testing.T, b *builder) *Report {
	t.Helper()
	// Every history must survive a JSON round trip unchanged in verdict.
	var buf bytes.Buffer
	if err := b.h.Write(&buf); err != nil {
		t.Fatal(err)
	}
	h, err := history.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	rep := Run(h, Options{})
	direct := Run(&b.h, Options{})
	if rep.Summary() != direct.Summary() {
		t.Fatalf("verdict changed over a JSON round trip: %s vs %s", rep.Summary(), direct.Summary())
	}
	return rep
}

func wantOnly(t *testing.T, rep *Report, invs ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, inv := range invs {
		want[inv] = true
		if rep.Violations[inv] == 0 {
			t.Errorf("%s not caught; report: %s", inv, rep.Summary())
		}
	}
	for inv, n := range rep.Violations {
		if n > 0 && !want[inv] {
			t.Errorf("unexpected %s violation(s): %+v", inv, rep.Details)
		}
	}
	if len(invs) == 0 && !rep.OK() {
		t.Errorf("a correct history was judged wrong: %+v", rep.Details)
	}
}

func TestGoodHistoryPasses(t *testing.T) {
	b := newBuilder().
		// Planned duplicates: three clients mark m1 at once; one wins.
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		mark(1, "m1", "bb", 1, 32, history.Duplicate, "aa", 12).
		mark(2, "m1", "cc", 2, 31, history.Duplicate, "aa", 11).
		// A check concurrent with the first mark may see either answer.
		check(3, "m1", 5, 8, history.NotSeen).
		check(3, "m1", 40, 45, history.Seen).
		// A lost reply, then the retry with the same token gets NEW again.
		markInfo(0, "m2", "dd", 100).
		mark(0, "m2", "dd", 6000, 6010, history.New, "dd", 150).
		mark(1, "m2", "ee", 6020, 6030, history.Duplicate, "dd", 6025).
		// An unknown mark that never happened; a later one wins.
		markInfo(2, "m3", "ff", 200).
		mark(1, "m3", "gg", 7000, 7010, history.New, "gg", 7005).
		// Claim, lease expires unused, a redelivery claims and commits.
		claim(0, "c1", "c0", 0, 20, history.Acquired, 10, 2000, 5).
		claim(1, "c1", "c1tok", 30, 40, history.InProgress, 35, 2000, 5).busy("c0").
		claim(1, "c1", "c1tok", 2500, 2520, history.Acquired, 2510, 2000, 9).
		commit(1, "c1", 9, 2600, 2620, history.ResultOK, "c1tok", 2510).
		commit(0, "c1", 5, 2700, 2720, history.LeaseLost, "", 0).
		// Claim, release, immediate reclaim by another consumer.
		claim(0, "c2", "r0", 0, 20, history.Acquired, 10, 30000, 6).
		release(0, "c2", 6, 100, 120, history.ResultOK).
		claim(1, "c2", "r1", 130, 150, history.Acquired, 140, 30000, 11).
		commit(1, "c2", 11, 200, 220, history.ResultOK, "r1", 140).
		check(2, "c2", 300, 310, history.Seen).
		final("m1", 10000, committed("aa", 10)).
		final("m2", 10000, committed("dd", 150)).
		final("m3", 10000, committed("gg", 7005)).
		final("c1", 10000, &history.Record{State: "committed", FirstSeenMs: t0 + 2510, ExpiresMs: t0 + 2620 + hour, Token: "c1tok", Fence: 9}).
		final("c2", 10000, &history.Record{State: "committed", FirstSeenMs: t0 + 140, ExpiresMs: t0 + 220 + hour, Token: "r1", Fence: 11})
	rep := run(t, b)
	wantOnly(t, rep)
	if rep.Operations != len(b.h.Ops) || rep.LinearizabilityChecked != 3 {
		t.Errorf("operations %d (want %d), porcupine keys %d (want 3)", rep.Operations, len(b.h.Ops), rep.LinearizabilityChecked)
	}
}

func TestTwoMarkWinnersAreCaught(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		mark(1, "m1", "bb", 40, 60, history.New, "bb", 50).
		final("m1", 10000, committed("bb", 50))
	rep := run(t, b)
	// The second NEW also breaks linearizability, and the final state lost
	// the first acknowledged winner's record.
	wantOnly(t, rep, AtMostOneWinner, Linearizable, NoLostWrites)
	if sub := Smallest(&b.h, rep); sub == nil || len(sub.Ops) != 2 || sub.Meta.Note == "" {
		t.Fatalf("smallest offending history: %+v", sub)
	}
}

func TestTwoClaimWinnersInOneLeaseAreCaught(t *testing.T) {
	b := newBuilder().
		claim(0, "c1", "aa", 0, 20, history.Acquired, 10, 5000, 4).
		claim(1, "c1", "bb", 100, 120, history.Acquired, 110, 5000, 7).
		final("c1", 10000, nil)
	wantOnly(t, run(t, b), AtMostOneWinner)
}

func TestClaimAfterCommitThatStillWinsIsCaught(t *testing.T) {
	// The lease expired but had been committed: the record lives for an
	// hour, so a later ACQUIRED is a second winner.
	b := newBuilder().
		claim(0, "c1", "aa", 0, 20, history.Acquired, 10, 1000, 4).
		commit(0, "c1", 4, 100, 120, history.ResultOK, "aa", 10).
		claim(1, "c1", "bb", 3000, 3020, history.Acquired, 3010, 1000, 8).
		final("c1", 10000, &history.Record{State: "committed", FirstSeenMs: t0 + 10, ExpiresMs: t0 + 120 + hour, Token: "aa", Fence: 4})
	wantOnly(t, run(t, b), AtMostOneWinner)
}

func TestLostAcknowledgedMarkIsCaught(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		final("m1", 10000, committed("aa", 10), history.Seen, history.NotSeen, history.Seen)
	// One node lost it: a lost write, and the replicas disagree.
	wantOnly(t, run(t, b), NoLostWrites, ReplicasIdentical)
}

func TestLostAcknowledgedCommitIsCaught(t *testing.T) {
	b := newBuilder().
		claim(0, "c1", "aa", 0, 20, history.Acquired, 10, 5000, 4).
		commit(0, "c1", 4, 100, 120, history.ResultOK, "aa", 10).
		final("c1", 10000, nil)
	wantOnly(t, run(t, b), NoLostWrites)
}

func TestStaleReadIsCaught(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		check(1, "m1", 50, 60, history.NotSeen).
		final("m1", 10000, committed("aa", 10))
	wantOnly(t, run(t, b), NoStaleRead, Linearizable)
}

func TestStaleReadOfLiveLeaseIsCaught(t *testing.T) {
	b := newBuilder().
		claim(0, "c1", "aa", 0, 20, history.Acquired, 10, 30000, 4).
		check(1, "c1", 50, 60, history.NotSeen).
		final("c1", 40000, nil)
	wantOnly(t, run(t, b), NoStaleRead)
}

func TestStaleConsistencyMayMissWrites(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		add(history.Op{Client: 1, Kind: history.Check, Key: "m1", Consistency: history.Stale, Start: at(50), End: at(60), Result: history.NotSeen}).
		final("m1", 10000, committed("aa", 10))
	wantOnly(t, run(t, b))
}

func TestNonLinearizableCheckSequenceIsCaught(t *testing.T) {
	// SEEN then NOT_SEEN by later checks while only an unknown mark was in
	// flight: the direct rule has no acknowledged write, porcupine catches it.
	b := newBuilder().
		markInfo(0, "m1", "aa", 0).
		check(1, "m1", 10, 20, history.Seen).
		check(1, "m1", 30, 40, history.NotSeen).
		final("m1", 10000, committed("aa", 5))
	wantOnly(t, run(t, b), Linearizable)
}

func TestRetryThatLosesItsFirstAnswerIsCaught(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		mark(0, "m1", "aa", 40, 50, history.Duplicate, "aa", 10).
		final("m1", 10000, committed("aa", 10))
	// The DUPLICATE for the winner's own token also breaks the register model.
	wantOnly(t, run(t, b), RetryFirstAnswer, Linearizable)
}

func TestDivergentReplicasAreCaught(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10)
	b.final("m1", 10000, committed("aa", 10))
	b.h.Final[2].Record = &history.Record{State: "committed", FirstSeenMs: t0 + 10, ExpiresMs: t0 + 99, Token: "aa"}
	wantOnly(t, run(t, b), ReplicasIdentical)
}

func TestRunWithoutFinalReadsDidNotConverge(t *testing.T) {
	b := newBuilder().mark(0, "m1", "aa", 0, 30, history.New, "aa", 10)
	b.h.Meta.Finished = false
	wantOnly(t, run(t, b), Converged)
}

func TestReportTableNamesEveryInvariant(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		mark(1, "m1", "bb", 40, 60, history.New, "bb", 50)
	var buf bytes.Buffer
	if err := run(t, b).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, inv := range Invariants {
		if !bytes.Contains(buf.Bytes(), []byte(inv)) {
			t.Errorf("table lacks %s:\n%s", inv, buf.String())
		}
	}
	if !bytes.Contains(buf.Bytes(), []byte("VIOLATION at_most_one_winner id m1")) {
		t.Errorf("table lacks the violation detail:\n%s", buf.String())
	}
}

func TestNewWinnerAfterExpiryIsALegalNewLifetime(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		mark(1, "m1", "bb", 2000, 2030, history.New, "bb", 2010)
	// The first record had a 1 s TTL: it expired before the second mark.
	b.h.Ops[0].Record.ExpiresMs = t0 + 1010
	b.final("m1", 10000, committed("bb", 2010))
	rep := run(t, b)
	wantOnly(t, rep)
	if rep.LinearizabilityChecked != 0 {
		t.Errorf("an ID whose record expired inside the run was checked against the set-once model")
	}
}

func TestRetriedReleaseThatLostItsAnswerMayHaveReleased(t *testing.T) {
	// The first attempt of the release timed out but was applied; a second
	// claim won; the release's retry then answered lease_lost. The second
	// winner is legal.
	b := newBuilder().
		claim(0, "c1", "aa", 0, 20, history.Acquired, 10, 2000, 4).
		release(0, "c1", 4, 100, 3200, history.LeaseLost).
		claim(1, "c1", "bb", 900, 920, history.Acquired, 910, 2000, 9).
		commit(1, "c1", 9, 950, 970, history.ResultOK, "bb", 910)
	b.h.Ops[1].Uncertain = true
	b.final("c1", 10000, &history.Record{State: "committed", FirstSeenMs: t0 + 910, ExpiresMs: t0 + 970 + hour, Token: "bb", Fence: 9})
	wantOnly(t, run(t, b))
	// Without the uncertainty the same answers show two winners.
	b.h.Ops[1].Uncertain = false
	wantOnly(t, run(t, b), AtMostOneWinner)
}

// digests sets every node's final state digest: index and digest per node.
func (b *builder) digests(ds ...history.NodeDigest) *builder {
	b.h.Digests = ds
	return b
}

func nd(node string, index uint64, digest string) history.NodeDigest {
	return history.NodeDigest{Node: node, AppliedIndex: index, Digest: digest, Records: 1, At: at(20000)}
}

func TestStateDigests(t *testing.T) {
	base := func() *builder {
		return newBuilder().mark(0, "m1", "aa", 0, 20, history.New, "aa", 10).final("m1", 10000, committed("aa", 10))
	}
	t.Run("equal at one index", func(t *testing.T) {
		wantOnly(t, run(t, base().digests(nd("n1", 7, "d1"), nd("n2", 7, "d1"), nd("n3", 7, "d1"))))
	})
	t.Run("history without digests is not judged on them", func(t *testing.T) {
		wantOnly(t, run(t, base()))
	})
	t.Run("a divergent replica is caught", func(t *testing.T) {
		b := base().digests(nd("n1", 7, "d1"), nd("n2", 7, "d2"), nd("n3", 7, "d1"))
		rep := run(t, b)
		wantOnly(t, rep, StateDigests)
		if rep.Violations[StateDigests] != 1 {
			t.Fatalf("want one state_digests violation: %+v", rep.Details)
		}
		sub := Smallest(&b.h, rep)
		if sub == nil || len(sub.Digests) != 3 || sub.Meta.Note == "" {
			t.Fatalf("smallest offending history: %+v", sub)
		}
	})
	t.Run("no common index is a convergence failure, not a divergence", func(t *testing.T) {
		wantOnly(t, run(t, base().digests(nd("n1", 7, "d1"), nd("n2", 8, "d2"), nd("n3", 7, "d1"))), Converged)
	})
	t.Run("a node without a digest", func(t *testing.T) {
		failed := history.NodeDigest{Node: "n3", At: at(20000), Error: "Unavailable"}
		wantOnly(t, run(t, base().digests(nd("n1", 7, "d1"), nd("n2", 7, "d1"), failed)), Converged)
		wantOnly(t, run(t, base().digests(nd("n1", 7, "d1"), nd("n2", 7, "d1"))), Converged)
	})
}

// A bounded check may miss a write acknowledged within its max staleness
// before it started, never one acknowledged earlier.
func TestBoundedCheckMayMissOnlyRecentWrites(t *testing.T) {
	b := newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		add(history.Op{Client: 1, Kind: history.Check, Key: "m1", Consistency: history.Bounded, MaxStalenessMs: 1000, Start: at(500), End: at(510), Result: history.NotSeen}).
		final("m1", 10000, committed("aa", 10))
	wantOnly(t, run(t, b))

	b = newBuilder().
		mark(0, "m1", "aa", 0, 30, history.New, "aa", 10).
		add(history.Op{Client: 1, Kind: history.Check, Key: "m1", Consistency: history.Bounded, MaxStalenessMs: 1000, Start: at(1500), End: at(1510), Result: history.NotSeen}).
		final("m1", 10000, committed("aa", 10))
	wantOnly(t, run(t, b), NoStaleRead)
}
