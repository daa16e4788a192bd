// Package check judges a chaos history (package chaos/history) against the
// guarantees listed in the top-level README, section Guarantees (invariant N
// below is Guarantees (N)):
//
//   - at_most_one_winner (invariant 1): per ID, acknowledged NEW/ACQUIRED
//     answers with different request tokens never overlap in lifetime. A
//     winner's lifetime runs from the leader timestamp at which it was
//     applied (the returned record's first_seen) to the expiry the server
//     returned: the record's expiry for a Mark; for a Claim the lease expiry,
//     or the committed record's expiry after an acknowledged Commit, or the
//     moment a Release of that lease was sent.
//   - no_lost_writes (invariant 2): after the cluster healed and caught up,
//     every ID with an acknowledged write whose record has not expired reads
//     SEEN on every node (stale reads, node by node), recorded by the
//     acknowledged winner's token and fence.
//   - linearizable_check (invariant 3): per ID whose history holds only Mark
//     and linearizable Check, the history is linearizable against a
//     set-once register keyed by request token (porcupine).
//   - no_stale_read (invariant 3, direct): no linearizable Check answers
//     NOT_SEEN for an ID whose acknowledged write completed before the
//     Check started and had not expired when it ended.
//   - retry_first_answer (invariant 7): a Mark or Claim whose request token
//     is the one the record holds answers NEW/ACQUIRED, never DUPLICATE or
//     IN_PROGRESS.
//   - replicas_identical (invariant 5 over the wire): the final reads of
//     every ID agree on every node (result, state, token, fence, times).
//   - state_digests (invariant 5 at the storage level): after the final
//     reads, every node reports the same state digest (dedup.v1
//     Ops.Digest: SHA-256 over its whole state machine) at the same applied
//     index. The state machine is deterministic given the log, so replicas
//     at one index must hold byte-identical state; this catches divergence
//     the final reads cannot see (other keys, bucket counts, namespaces).
//   - converged: every node answered the final reads, reported its digest,
//     and the nodes reached one applied index to compare digests at.
//
// The checker is conservative where the history cannot decide: an
// operation whose outcome is unknown (Info) is assumed to have possibly
// taken effect at any time after it was sent, and a lifetime ends as early
// as any evidence allows. A reported violation is therefore a real one.
package check

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/chaos/history"
)

// Invariant names, as reported in Report.Violations.
const (
	AtMostOneWinner   = "at_most_one_winner"
	NoLostWrites      = "no_lost_writes"
	Linearizable      = "linearizable_check"
	NoStaleRead       = "no_stale_read"
	RetryFirstAnswer  = "retry_first_answer"
	ReplicasIdentical = "replicas_identical"
	StateDigests      = "state_digests"
	Converged         = "converged"
)

// Invariants lists every invariant in report order.
var Invariants = []string{AtMostOneWinner, NoLostWrites, Linearizable, NoStaleRead, RetryFirstAnswer, ReplicasIdentical, StateDigests, Converged}

// Violation is one breach of an invariant.
type Violation struct {
	Invariant string `json:"invariant"`
	Key       string `json:"key,omitempty"`
	Detail    string `json:"detail"`
	// Ops are the Seq numbers of the operations that show the breach.
	Ops []int64 `json:"ops,omitempty"`
}

// Report is the verdict on a history.
type Report struct {
	Operations int `json:"operations"`
	// OpsByKind counts operations per kind and per outcome: "ok:new",
	// "info", "fail".
	OpsByKind    map[string]map[string]int `json:"ops_by_kind"`
	Faults       int                       `json:"faults"`
	FaultsByKind map[string]int            `json:"faults_by_kind"`
	// FaultErrors counts faults that could not be injected or healed
	// fully (e.g. a node that did not restart at once).
	FaultErrors int `json:"faults_failed,omitempty"`
	Keys        int `json:"keys"`
	// Violations counts breaches per invariant; every invariant is present.
	Violations map[string]int `json:"violations"`
	// LinearizabilityUnknown counts keys porcupine could not decide in time.
	LinearizabilityUnknown int `json:"linearizability_unknown,omitempty"`
	// LinearizabilityChecked counts keys checked with porcupine.
	LinearizabilityChecked int         `json:"linearizability_checked"`
	Details                []Violation `json:"details,omitempty"`
}

// OK reports whether no invariant was violated.
func (r *Report) OK() bool {
	for _, n := range r.Violations {
		if n > 0 {
			return false
		}
	}
	return true
}

// Total returns the number of violations.
func (r *Report) Total() int {
	t := 0
	for _, n := range r.Violations {
		t += n
	}
	return t
}

// Options tune the checker. Zero values take the defaults.
type Options struct {
	// Margin absorbs the difference between the leader's clock (record
	// times) and the recording client's clock when an expiry is compared
	// with a wall time (default 1 s). Same host, so it only has to cover
	// scheduling delays.
	Margin time.Duration
	// PorcupineTimeout bounds the linearizability search per key (default
	// 10 s); a key not decided in time counts in LinearizabilityUnknown.
	PorcupineTimeout time.Duration
	// MaxDetails caps Report.Details (default 200).
	MaxDetails int
}

func (o Options) withDefaults() Options {
	if o.Margin <= 0 {
		o.Margin = time.Second
	}
	if o.PorcupineTimeout <= 0 {
		o.PorcupineTimeout = 10 * time.Second
	}
	if o.MaxDetails <= 0 {
		o.MaxDetails = 200
	}
	return o
}

// keyHist is the part of a history about one ID.
type keyHist struct {
	key   string
	ops   []*history.Op
	final []*history.FinalRead
}

type checker struct {
	h    *history.History
	opt  Options
	rep  *Report
	keys map[string]*keyHist
	all  []Violation
}

// Run checks h and returns the report. It never fails: a history it cannot
// judge (no final reads) is reported as a "converged" violation.
func Run(h *history.History, opt Options) *Report {
	c := &checker{
		h:   h,
		opt: opt.withDefaults(),
		rep: &Report{
			OpsByKind:    map[string]map[string]int{},
			FaultsByKind: map[string]int{},
			Violations:   map[string]int{},
		},
		keys: map[string]*keyHist{},
	}
	for _, inv := range Invariants {
		c.rep.Violations[inv] = 0
	}
	c.index()
	c.converged()
	c.digests()
	names := make([]string, 0, len(c.keys))
	for k := range c.keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		kh := c.keys[k]
		c.winners(kh)
		c.lostWrites(kh)
		c.staleReads(kh)
		c.retries(kh)
		c.replicas(kh)
		c.linearizable(kh)
	}
	for _, v := range c.all {
		c.rep.Violations[v.Invariant]++
	}
	c.rep.Details = c.all
	if len(c.rep.Details) > c.opt.MaxDetails {
		c.rep.Details = c.rep.Details[:c.opt.MaxDetails]
	}
	return c.rep
}

func (c *checker) violate(inv, key string, ops []*history.Op, format string, args ...any) {
	v := Violation{Invariant: inv, Key: key, Detail: fmt.Sprintf(format, args...)}
	for _, o := range ops {
		v.Ops = append(v.Ops, o.Seq)
	}
	c.all = append(c.all, v)
}

func (c *checker) key(k string) *keyHist {
	kh := c.keys[k]
	if kh == nil {
		kh = &keyHist{key: k}
		c.keys[k] = kh
	}
	return kh
}

func (c *checker) index() {
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		c.rep.Operations++
		m := c.rep.OpsByKind[string(o.Kind)]
		if m == nil {
			m = map[string]int{}
			c.rep.OpsByKind[string(o.Kind)] = m
		}
		if o.Outcome == history.OK {
			m["ok:"+o.Result]++
		} else {
			m[string(o.Outcome)]++
		}
		kh := c.key(o.Key)
		kh.ops = append(kh.ops, o)
	}
	for _, f := range c.h.Faults {
		c.rep.Faults++
		c.rep.FaultsByKind[f.Kind]++
		if f.Error != "" {
			c.rep.FaultErrors++
		}
	}
	for i := range c.h.Final {
		r := &c.h.Final[i]
		kh := c.key(r.Key)
		kh.final = append(kh.final, r)
	}
	c.rep.Keys = len(c.keys)
}

// end returns an op's end time, +inf while unknown.
func end(o *history.Op) int64 {
	if o.End == 0 || o.Outcome == history.Info {
		return math.MaxInt64
	}
	return o.End
}

func ms(ns int64) int64 { return ns / int64(time.Millisecond) }

func shortTok(t string) string {
	if len(t) > 8 {
		return t[:8]
	}
	return t
}

func wall(ns int64) string {
	if ns == math.MaxInt64 || ns == 0 {
		return "never"
	}
	return time.Unix(0, ns).UTC().Format("15:04:05.000")
}

func wallMs(m int64) string { return wall(m * int64(time.Millisecond)) }

// converged reports nodes that did not answer the final reads.
func (c *checker) converged() {
	if !c.h.Meta.Finished {
		c.violate(Converged, "", nil, "the run ended without final reads (the cluster did not heal and catch up in time)")
		return
	}
	failed := map[string]string{}
	answered := map[string]bool{}
	for _, r := range c.h.Final {
		if r.Error != "" {
			if _, ok := failed[r.Node]; !ok {
				failed[r.Node] = r.Error
			}
			continue
		}
		answered[r.Node] = true
	}
	for _, n := range c.h.Meta.Nodes {
		if msg, ok := failed[n]; ok {
			c.violate(Converged, "", nil, "node %s failed its final reads: %s", n, msg)
		} else if !answered[n] && len(c.h.Final) > 0 {
			c.violate(Converged, "", nil, "node %s has no final reads", n)
		}
	}
}

// digests compares the nodes' final state digests: every node must report
// one, all at one applied index, all equal. Histories without digests
// (written before they were taken) are not judged on them.
func (c *checker) digests() {
	if !c.h.Meta.Finished || c.h.Digests == nil {
		return
	}
	by := map[string]*history.NodeDigest{}
	for i := range c.h.Digests {
		by[c.h.Digests[i].Node] = &c.h.Digests[i]
	}
	var got []*history.NodeDigest
	for _, n := range c.h.Meta.Nodes {
		d := by[n]
		switch {
		case d == nil:
			c.violate(Converged, "", nil, "node %s reported no state digest", n)
		case d.Error != "":
			c.violate(Converged, "", nil, "node %s did not report its state digest: %s", n, d.Error)
		default:
			got = append(got, d)
		}
	}
	if len(got) < 2 {
		return
	}
	ref := got[0]
	for _, d := range got[1:] {
		if d.AppliedIndex != ref.AppliedIndex {
			var at []string
			for _, d := range got {
				at = append(at, fmt.Sprintf("%s at %d", d.Node, d.AppliedIndex))
			}
			c.violate(Converged, "", nil, "the nodes never reported one applied index to compare state digests at: %s", strings.Join(at, ", "))
			return
		}
	}
	for _, d := range got[1:] {
		if d.Digest != ref.Digest {
			c.violate(StateDigests, "", nil, "at applied index %d node %s's state digest %s (%d records) differs from node %s's %s (%d records)",
				ref.AppliedIndex, d.Node, shortTok(d.Digest), d.Records, ref.Node, shortTok(ref.Digest), ref.Records)
		}
	}
}

// winner is one distinct NEW/ACQUIRED: all acknowledged answers that name
// the same record (same token, apply time and fence).
type winner struct {
	ops   []*history.Op
	kind  history.Kind
	token string
	fence uint64
	ts    int64 // leader ms when applied
	endMs int64 // leader ms when its lifetime ended (exclusive)
	// releasedAt is the earliest wall time (ns) a Release of this lease
	// was sent (acknowledged OK or unknown); the lease may end then.
	releasedAt int64
}

func (w *winner) String() string {
	s := fmt.Sprintf("%s token %s applied %s", w.kind, shortTok(w.token), wallMs(w.ts))
	if w.kind == history.Claim {
		s += fmt.Sprintf(" fence %d", w.fence)
	}
	s += fmt.Sprintf(" lifetime to %s", wallMs(w.endMs))
	if w.releasedAt != math.MaxInt64 {
		s += fmt.Sprintf(" (release sent %s)", wall(w.releasedAt))
	}
	return s
}

func (c *checker) winners(kh *keyHist) {
	byID := map[string]*winner{}
	var ws []*winner
	for _, o := range kh.ops {
		if !o.Acked() || o.Record == nil {
			continue
		}
		if !(o.Kind == history.Mark && o.Result == history.New) && !(o.Kind == history.Claim && o.Result == history.Acquired) {
			continue
		}
		id := fmt.Sprintf("%s/%s/%d/%d", o.Kind, o.Record.Token, o.Record.FirstSeenMs, o.Record.Fence)
		w := byID[id]
		if w == nil {
			w = &winner{kind: o.Kind, token: o.Record.Token, fence: o.Record.Fence, ts: o.Record.FirstSeenMs,
				endMs: o.Record.ExpiresMs, releasedAt: math.MaxInt64}
			byID[id] = w
			ws = append(ws, w)
		}
		w.ops = append(w.ops, o)
	}
	if len(ws) < 2 {
		return
	}
	for _, w := range ws {
		if w.kind != history.Claim {
			continue
		}
		for _, o := range kh.ops {
			if o.Fence != w.fence {
				continue
			}
			switch {
			case o.Kind == history.Commit && o.Acked() && o.Result == history.ResultOK && o.Record != nil:
				w.endMs = max(w.endMs, o.Record.ExpiresMs)
				w.ops = append(w.ops, o)
			case o.Kind == history.Release && mayHaveReleased(o):
				w.releasedAt = min(w.releasedAt, o.Start)
				w.ops = append(w.ops, o)
			}
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].ts != ws[j].ts {
			return ws[i].ts < ws[j].ts
		}
		return ws[i].ops[0].Seq < ws[j].ops[0].Seq
	})
	for i := 1; i < len(ws); i++ {
		a, b := ws[i-1], ws[i]
		if b.ts >= a.endMs {
			continue // a's lifetime ended (expiry) before b was applied
		}
		if a.releasedAt != math.MaxInt64 && a.releasedAt <= latestEnd(b.ops) {
			continue // a released its lease, possibly before b was applied
		}
		c.violate(AtMostOneWinner, kh.key, append(append([]*history.Op(nil), a.ops...), b.ops...),
			"two winners in one lifetime: %s; then %s", a, b)
	}
}

func latestEnd(ops []*history.Op) int64 {
	var e int64
	for _, o := range ops {
		e = max(e, end(o))
	}
	return e
}

// lostWrites compares acknowledged writes with the final reads.
func (c *checker) lostWrites(kh *keyHist) {
	if !c.h.Meta.Finished {
		return
	}
	margin := c.opt.Margin.Nanoseconds()
	for _, r := range kh.final {
		if r.Error != "" {
			continue // reported by converged
		}
		for _, o := range kh.ops {
			if !o.Acked() || o.Record == nil || o.Record.ExpiresMs*int64(time.Millisecond) <= r.At+margin {
				continue
			}
			markDone := o.Kind == history.Mark && (o.Result == history.New || o.Result == history.Duplicate || o.Result == history.Conflict)
			commitDone := o.Kind == history.Commit && o.Result == history.ResultOK
			if !markDone && !commitDone {
				continue
			}
			if r.Result != history.Seen {
				c.violate(NoLostWrites, kh.key, []*history.Op{o},
					"acknowledged %s (%s, expires %s) reads %s on node %s at %s",
					o.Kind, o.Result, wallMs(o.Record.ExpiresMs), r.Result, r.Node, wall(r.At))
				return
			}
			if r.Record == nil {
				continue
			}
			// The winner's own record must be the one that survived.
			switch {
			case o.Kind == history.Mark && o.Result == history.New && r.Record.Token != o.Record.Token:
				c.violate(NoLostWrites, kh.key, []*history.Op{o},
					"acknowledged mark NEW by token %s (live until %s), but node %s holds a record by token %s",
					shortTok(o.Record.Token), wallMs(o.Record.ExpiresMs), r.Node, shortTok(r.Record.Token))
				return
			case commitDone && (r.Record.Fence != o.Fence || r.Record.State != "committed"):
				c.violate(NoLostWrites, kh.key, []*history.Op{o},
					"acknowledged commit of fence %d, but node %s holds a %s record with fence %d",
					o.Fence, r.Node, r.Record.State, r.Record.Fence)
				return
			}
		}
	}
}

// staleReads finds linearizable NOT_SEEN answers after an acknowledged
// write that was still live, and bounded NOT_SEEN answers after one
// acknowledged more than the check's max staleness before it started.
func (c *checker) staleReads(kh *keyHist) {
	margin := c.opt.Margin.Nanoseconds()
	for _, chk := range kh.ops {
		if chk.Kind != history.Check || !chk.Acked() || chk.Result != history.NotSeen || chk.Consistency == history.Stale {
			continue
		}
		since := chk.Start
		if chk.Consistency == history.Bounded {
			since -= chk.MaxStalenessMs * int64(time.Millisecond)
		}
		for _, w := range kh.ops {
			if !w.Acked() || w.Record == nil || end(w) >= since {
				continue
			}
			if w.Record.ExpiresMs*int64(time.Millisecond) <= chk.End+margin {
				continue
			}
			switch {
			case w.Kind == history.Mark && (w.Result == history.New || w.Result == history.Duplicate || w.Result == history.Conflict):
			case w.Kind == history.Commit && w.Result == history.ResultOK:
			case w.Kind == history.Claim && w.Result == history.Acquired:
				if releasedBefore(kh.ops, w.Record.Fence, chk.End) {
					continue
				}
			default:
				continue
			}
			c.violate(NoStaleRead, kh.key, []*history.Op{w, chk},
				"%s check (op %d, %s..%s on %s) answered not_seen after %s %s (op %d) completed at %s, live until %s",
				chk.Consistency, chk.Seq, wall(chk.Start), wall(chk.End), chk.Node, w.Kind, w.Result, w.Seq, wall(w.End), wallMs(w.Record.ExpiresMs))
			break
		}
	}
}

// mayHaveReleased reports whether a Release may have dropped its lease: it
// answered ok, its outcome is unknown, or an earlier attempt of it may have
// applied (a retried Release answers lease_lost once the lease it released
// was claimed again).
func mayHaveReleased(o *history.Op) bool {
	return o.Outcome == history.Info || (o.Acked() && (o.Result == history.ResultOK || o.Uncertain))
}

func releasedBefore(ops []*history.Op, fence uint64, t int64) bool {
	for _, o := range ops {
		if o.Kind == history.Release && o.Fence == fence && o.Start <= t && mayHaveReleased(o) {
			return true
		}
	}
	return false
}

// retries finds a write told DUPLICATE/IN_PROGRESS by a record that carries
// its own request token: the server recognised the retry and still did not
// return the first answer.
func (c *checker) retries(kh *keyHist) {
	for _, o := range kh.ops {
		if !o.Acked() || o.Record == nil || o.Token == "" || o.Record.Token != o.Token {
			continue
		}
		switch {
		case o.Kind == history.Mark && o.Result != history.New && o.Record.State == "committed":
		case o.Kind == history.Claim && o.Result == history.InProgress:
		default:
			continue
		}
		first := []*history.Op{o}
		for _, p := range kh.ops {
			if p != o && p.Token == o.Token && p.Acked() && (p.Result == history.New || p.Result == history.Acquired) {
				first = append([]*history.Op{p}, first...)
				break
			}
		}
		c.violate(RetryFirstAnswer, kh.key, first,
			"%s with token %s answered %s although the record holds that same token (first answer must be returned)",
			o.Kind, shortTok(o.Token), o.Result)
	}
}

// replicas compares the final reads of one ID across nodes.
func (c *checker) replicas(kh *keyHist) {
	var ref *history.FinalRead
	refS := ""
	for _, r := range kh.final {
		if r.Error != "" {
			continue
		}
		s := finalString(r)
		if ref == nil {
			ref, refS = r, s
			continue
		}
		if s != refS {
			c.violate(ReplicasIdentical, kh.key, nil, "node %s reads %s but node %s reads %s", ref.Node, refS, r.Node, s)
			return
		}
	}
}

func finalString(r *history.FinalRead) string {
	if r.Record == nil || r.Result != history.Seen {
		return r.Result
	}
	x := r.Record
	return fmt.Sprintf("%s{%s token=%s fence=%d first=%d expires=%d}", r.Result, x.State, shortTok(x.Token), x.Fence, x.FirstSeenMs, x.ExpiresMs)
}

// Summary returns one line per invariant with its count, for logs.
func (r *Report) Summary() string {
	var b strings.Builder
	for _, inv := range Invariants {
		fmt.Fprintf(&b, "%s=%d ", inv, r.Violations[inv])
	}
	return strings.TrimSpace(b.String())
}
