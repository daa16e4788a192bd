package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/client"
)

// ProbeStats counts what a cut-off region's read replicas answered while
// the region was cut (region-cut, region-one-way). Each probe marks a
// fresh ID through the rest of the cluster, waits until the mark is older
// than the max staleness, and asks every replica of the cut region one
// stale, one bounded and one linearizable check of it, each with
// Deadline. The checks are recorded in the history, so a not_seen from a
// bounded or linearizable check is also a no_stale_read violation.
type ProbeStats struct {
	Probes   int           `json:"probes"`
	Skipped  int           `json:"skipped"` // the mark was not acknowledged in time during the hold
	Deadline time.Duration `json:"deadline_ns"`
	// StaleAnswered/StaleFailed: stale checks on a cut-off replica (they
	// must answer from its own state).
	StaleAnswered int `json:"stale_answered"`
	StaleFailed   int `json:"stale_failed"`
	// Refused: failed (UNAVAILABLE, DEADLINE_EXCEEDED) within the deadline;
	// Seen: answered seen (the replica had the mark, e.g. one-way cut).
	BoundedRefused      int `json:"bounded_refused"`
	BoundedSeen         int `json:"bounded_seen"`
	LinearizableRefused int `json:"linearizable_refused"`
	LinearizableSeen    int `json:"linearizable_seen"`
	// Wrong: bounded or linearizable not_seen (a violation). Late: an
	// answer or failure more than 1 s past the deadline (a violation).
	Wrong int `json:"wrong"`
	Late  int `json:"late"`
	// MaxFailMs is the slowest refused bounded/linearizable check.
	MaxFailMs int64 `json:"max_fail_ms"`
}

// OK reports whether every probe behaved.
func (p *ProbeStats) OK() bool { return p.StaleFailed == 0 && p.Wrong == 0 && p.Late == 0 }

func (p *ProbeStats) String() string {
	return fmt.Sprintf("%d probes (%d skipped): stale answered %d, failed %d; bounded refused %d, seen %d; linearizable refused %d, seen %d; wrong %d; late %d; slowest refusal %d ms (deadline %v)",
		p.Probes, p.Skipped, p.StaleAnswered, p.StaleFailed, p.BoundedRefused, p.BoundedSeen,
		p.LinearizableRefused, p.LinearizableSeen, p.Wrong, p.Late, p.MaxFailMs, p.Deadline)
}

// probeClient is the history client number of the probes.
const probeClient = 1000

type regionProber struct {
	w            *workload
	replicas     map[string]bool
	maxStaleness time.Duration
	log          *slog.Logger

	mu    sync.Mutex
	seq   int
	stats ProbeStats
}

func (p *regionProber) Stats() ProbeStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// run probes the replicas among cut; the fault holds until it returns. The
// mark must be acknowledged before until (the planned end of the hold);
// the checks come D later, all at once, each bounded by the deadline.
func (p *regionProber) run(ctx context.Context, until time.Time, cut, rest []string, kind string) {
	var reps []string
	for _, id := range cut {
		if p.replicas[id] {
			reps = append(reps, id)
		}
	}
	if len(reps) == 0 || len(rest) == 0 {
		return
	}
	p.mu.Lock()
	p.seq++
	key := fmt.Sprintf("probe-%s-%d", p.w.runID, p.seq)
	deadline := p.stats.Deadline
	p.mu.Unlock()
	latest := until
	p.w.touch(key)
	node := rest[0]
	mctx, cancel := context.WithDeadline(ctx, latest)
	m := p.w.mark(mctx, probeClient, &node, key, newToken())
	cancel()
	if !m.Acked() || time.Now().After(latest) {
		p.mu.Lock()
		p.stats.Skipped++
		p.mu.Unlock()
		p.log.Info("region probe skipped: the mark was not acknowledged in time", "fault", kind, "outcome", m.Outcome)
		return
	}
	if !wait(ctx, p.maxStaleness+300*time.Millisecond) {
		return
	}
	var wg sync.WaitGroup
	for _, id := range reps {
		for _, cons := range []string{history.Stale, history.Bounded, history.Linearizable} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.one(ctx, id, key, cons, deadline)
			}()
		}
	}
	wg.Wait()
	p.mu.Lock()
	p.stats.Probes++
	p.mu.Unlock()
}

func (p *regionProber) one(ctx context.Context, id, key, cons string, deadline time.Duration) {
	op := history.Op{Client: probeClient, Kind: history.Check, Key: key, Consistency: cons, Node: id, Attempts: 1}
	if cons == history.Bounded {
		op.MaxStalenessMs = p.maxStaleness.Milliseconds()
	}
	o := p.w.rec.Invoke(op)
	cctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	res, path, err := checkOne(cctx, p.w.cs.cl[id], p.w.cfg.Namespace, key, cons, p.maxStaleness)
	took := time.Since(start)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if took > deadline+time.Second {
		p.stats.Late++
		p.log.Warn("region probe: a check on a cut-off replica ran past its deadline", "node", id, "consistency", cons, "took", took, "err", err)
	}
	if err != nil {
		p.w.rec.Complete(o, history.Fail, "", nil, err.Error())
		switch cons {
		case history.Stale:
			p.stats.StaleFailed++
			p.log.Warn("region probe: a stale check on a cut-off replica failed", "node", id, "err", err)
		case history.Bounded:
			p.stats.BoundedRefused++
		default:
			p.stats.LinearizableRefused++
		}
		if cons != history.Stale {
			p.stats.MaxFailMs = max(p.stats.MaxFailMs, took.Milliseconds())
		}
		return
	}
	p.w.rec.Complete(o, history.OK, res.Code.String(), recordOf(res.Record), "")
	seen := res.Code == client.CodeSeen
	switch {
	case cons == history.Stale:
		p.stats.StaleAnswered++
	case !seen:
		p.stats.Wrong++
		p.log.Warn("region probe: a cut-off replica answered not_seen", "node", id, "consistency", cons, "path", path)
	case cons == history.Bounded:
		p.stats.BoundedSeen++
	default:
		p.stats.LinearizableSeen++
	}
}
