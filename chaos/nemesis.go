package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/client"
)

// Fault kinds the nemesis knows.
const (
	FaultKillLeader    = "kill-leader"    // SIGKILL the leader, restart it after the hold
	FaultKillRandom    = "kill-random"    // SIGKILL any node
	FaultRestart       = "restart"        // graceful stop (SIGTERM) and start
	FaultPauseLeader   = "pause-leader"   // SIGSTOP the leader: it wakes up believing it leads
	FaultPauseRandom   = "pause-random"   // SIGSTOP any node
	FaultIsolateLeader = "isolate-leader" // cut the leader from every peer, both ways
	FaultSplit         = "split"          // minority/majority partition
	FaultOneWay        = "one-way"        // the leader's messages to its peers are lost; theirs reach it
	FaultAsymmetric    = "asymmetric"     // a random node hears nobody but is heard
	FaultSlow          = "slow"           // delay + jitter + resets/loss on every link
	FaultDisconnect    = "disconnect"     // docker network disconnect of a random node
	FaultKillAll       = "kill-all"       // SIGKILL every node at once, then restart all
	// Region faults (process mode with --regions 2 or more).
	FaultRegionCut        = "region-cut"         // one region cut off from the others, both ways
	FaultRegionOneWay     = "region-one-way"     // one region's messages to the others are lost; theirs arrive
	FaultRegionDelay      = "region-delay"       // a delay spike on every link between regions
	FaultKillLeaderRegion = "kill-leader-region" // SIGKILL every node of the leader's region, restart after the hold
)

// AllFaults lists every fault kind, in the order the help text shows them.
var AllFaults = []string{FaultKillLeader, FaultKillRandom, FaultRestart, FaultPauseLeader, FaultPauseRandom,
	FaultIsolateLeader, FaultSplit, FaultOneWay, FaultAsymmetric, FaultSlow, FaultDisconnect, FaultKillAll,
	FaultRegionCut, FaultRegionOneWay, FaultRegionDelay, FaultKillLeaderRegion}

// RegionFaults are the faults of runs across regions.
var RegionFaults = []string{FaultRegionCut, FaultRegionOneWay, FaultRegionDelay, FaultKillLeaderRegion}

// needs says which capability a fault kind requires.
func supported(kind string, caps Caps) bool {
	switch kind {
	case FaultIsolateLeader, FaultSplit, FaultOneWay, FaultAsymmetric:
		return caps.Cut
	case FaultSlow:
		return caps.Slow
	case FaultDisconnect:
		return caps.Disconnect
	case FaultRegionCut, FaultRegionOneWay, FaultRegionDelay, FaultKillLeaderRegion:
		return caps.Regions && caps.Cut
	}
	return true
}

// nemesis injects one fault at a time: inject, hold while the workload
// runs, heal, wait for a leader, rest.
type nemesis struct {
	c     Cluster
	cs    *conns
	rec   *history.Recorder
	log   *slog.Logger
	kinds []string
	hold  [2]time.Duration
	rest  [2]time.Duration
	rng   *mrand.Rand
	// regions groups the nodes (region faults); probe checks a cut-off
	// region's replicas during region cuts (nil: no probes).
	regions [][]string
	probe   *regionProber
}

func (n *nemesis) between(r [2]time.Duration) time.Duration {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + time.Duration(n.rng.Int64N(int64(r[1]-r[0])))
}

// wait sleeps d or until ctx ends; it reports whether ctx is still live.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run injects faults until ctx ends. Each fault is healed before the next
// and before run returns, whatever happens.
func (n *nemesis) run(ctx context.Context) {
	if len(n.kinds) == 0 {
		<-ctx.Done()
		return
	}
	// Let the workload get going first.
	if !wait(ctx, n.between(n.rest)) {
		return
	}
	for i := 0; ctx.Err() == nil; i++ {
		kind := n.kinds[n.rng.IntN(len(n.kinds))]
		n.one(ctx, kind)
		// Recover: a leader known to every running node, then rest.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		if _, err := waitLeader(rctx, n.c, n.cs); err != nil {
			n.log.Warn("no leader after healing", "fault", kind, "err", err)
		}
		cancel()
		if !wait(ctx, n.between(n.rest)) {
			return
		}
	}
}

// one injects, holds and heals one fault.
func (n *nemesis) one(ctx context.Context, kind string) {
	hctx := context.WithoutCancel(ctx) // healing must happen even after the end
	nodes := n.c.Nodes()
	leader, _ := currentLeader(hctx, n.cs, nodes)
	pick := func() string { return nodes[n.rng.IntN(len(nodes))] }
	pickLeader := func() string {
		if leader != "" {
			return leader
		}
		return pick()
	}
	var targets []string
	var inject, heal func() error
	detail := ""
	switch kind {
	case FaultKillLeader, FaultKillRandom:
		t := pick()
		if kind == FaultKillLeader {
			t = pickLeader()
		}
		targets = []string{t}
		inject = func() error { return n.c.Kill(hctx, t) }
		heal = func() error { return n.c.Start(hctx, t) }
	case FaultRestart:
		t := pick()
		targets = []string{t}
		inject = func() error { return n.c.Stop(hctx, t) }
		heal = func() error { return n.c.Start(hctx, t) }
	case FaultPauseLeader, FaultPauseRandom:
		t := pick()
		if kind == FaultPauseLeader {
			t = pickLeader()
		}
		targets = []string{t}
		inject = func() error { return n.c.Pause(hctx, t) }
		heal = func() error { return n.c.Resume(hctx, t) }
	case FaultIsolateLeader:
		t := pickLeader()
		targets = []string{t}
		inject = func() error { return n.partition(hctx, []string{t}, others(nodes, t)) }
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultSplit:
		perm := n.rng.Perm(len(nodes))
		minority := make([]string, 0, len(nodes))
		for _, i := range perm[:(len(nodes)-1)/2] {
			minority = append(minority, nodes[i])
		}
		sort.Strings(minority)
		targets = minority
		detail = fmt.Sprintf("minority %s | majority %s", strings.Join(minority, ","), strings.Join(others(nodes, minority...), ","))
		inject = func() error { return n.partition(hctx, minority, others(nodes, minority...)) }
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultOneWay:
		t := pickLeader()
		targets = []string{t}
		detail = t + " → peers lost; peers → " + t + " delivered"
		inject = func() error {
			var errs []error
			for _, o := range others(nodes, t) {
				errs = append(errs, n.c.Cut(hctx, t, o))
			}
			return errors.Join(errs...)
		}
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultAsymmetric:
		t := pick()
		targets = []string{t}
		detail = "peers → " + t + " lost; " + t + " → peers delivered"
		inject = func() error {
			var errs []error
			for _, o := range others(nodes, t) {
				errs = append(errs, n.c.Cut(hctx, o, t))
			}
			return errors.Join(errs...)
		}
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultSlow:
		delay := time.Duration(20+n.rng.IntN(180)) * time.Millisecond
		loss := 0.01 + n.rng.Float64()*0.04
		targets = nodes
		detail = fmt.Sprintf("delay %v ± %v, loss/reset %.1f%%", delay, delay/2, loss*100)
		inject = func() error { return n.c.Slow(hctx, delay, delay/2, loss) }
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultDisconnect:
		t := pick()
		targets = []string{t}
		inject = func() error { return n.c.Disconnect(hctx, t) }
		heal = func() error { return n.c.HealNet(hctx) }
	case FaultKillAll:
		targets = nodes
		inject = func() error {
			var errs []error
			for _, t := range nodes {
				errs = append(errs, n.c.Kill(hctx, t))
			}
			return errors.Join(errs...)
		}
		heal = func() error {
			var errs []error
			for _, t := range nodes {
				errs = append(errs, n.c.Start(hctx, t))
			}
			return errors.Join(errs...)
		}
	case FaultRegionCut, FaultRegionOneWay, FaultKillLeaderRegion:
		if len(n.regions) < 2 {
			return
		}
		g := n.regions[n.rng.IntN(len(n.regions))]
		if kind == FaultKillLeaderRegion && leader != "" {
			g = regionOf(n.regions, leader)
		}
		targets = g
		rest := others(nodes, g...)
		switch kind {
		case FaultRegionCut:
			detail = strings.Join(g, ",") + " cut off from " + strings.Join(rest, ",") + " both ways"
			inject = func() error { return n.partition(hctx, g, rest) }
			heal = func() error { return n.c.HealNet(hctx) }
		case FaultRegionOneWay:
			detail = strings.Join(g, ",") + " → others lost; others → " + strings.Join(g, ",") + " delivered"
			inject = func() error {
				var errs []error
				for _, x := range g {
					for _, y := range rest {
						errs = append(errs, n.c.Cut(hctx, x, y))
					}
				}
				return errors.Join(errs...)
			}
			heal = func() error { return n.c.HealNet(hctx) }
		default:
			inject = func() error {
				var errs []error
				for _, t := range g {
					errs = append(errs, n.c.Kill(hctx, t))
				}
				return errors.Join(errs...)
			}
			heal = func() error {
				var errs []error
				for _, t := range g {
					errs = append(errs, n.c.Start(hctx, t))
				}
				return errors.Join(errs...)
			}
		}
	case FaultRegionDelay:
		d, ok := n.c.(interface{ Delay(time.Duration) })
		if !ok || len(n.regions) < 2 {
			return
		}
		delay := time.Duration(200+n.rng.IntN(600)) * time.Millisecond
		targets = nodes
		detail = fmt.Sprintf("%v one way on every link between regions", delay)
		inject = func() error { d.Delay(delay); return nil }
		heal = func() error { return n.c.HealNet(hctx) }
	default:
		n.log.Warn("unknown fault kind", "kind", kind)
		return
	}
	if leader != "" && detail == "" {
		detail = "leader was " + leader
	}
	f := n.rec.FaultStart(kind, targets, detail)
	n.log.Info("fault", "kind", kind, "targets", targets, "detail", detail)
	f0 := time.Now()
	err := inject()
	if err == nil {
		hold := n.between(n.hold)
		if n.probe != nil && (kind == FaultRegionCut || kind == FaultRegionOneWay) {
			n.probe.run(ctx, time.Now().Add(hold), targets, others(nodes, targets...), kind)
		}
		wait(ctx, time.Until(f0.Add(hold)))
	}
	herr := heal()
	if err != nil || herr != nil {
		n.log.Warn("fault injection or healing failed", "kind", kind, "inject_err", err, "heal_err", herr)
	}
	n.rec.FaultEnd(f, errors.Join(err, herr))
}

func (n *nemesis) partition(ctx context.Context, a, b []string) error {
	var errs []error
	for _, x := range a {
		for _, y := range b {
			errs = append(errs, n.c.Cut(ctx, x, y), n.c.Cut(ctx, y, x))
		}
	}
	return errors.Join(errs...)
}

func regionOf(regions [][]string, id string) []string {
	for _, g := range regions {
		for _, x := range g {
			if x == id {
				return g
			}
		}
	}
	return nil
}

func others(nodes []string, except ...string) []string {
	var out []string
	for _, n := range nodes {
		skip := false
		for _, e := range except {
			skip = skip || n == e
		}
		if !skip {
			out = append(out, n)
		}
	}
	return out
}

// currentLeader asks every node for its status and returns the node that
// says it leads with the highest term.
func currentLeader(ctx context.Context, cs *conns, nodes []string) (string, uint64) {
	best, term := "", uint64(0)
	for _, id := range nodes {
		st, err := statusOf(ctx, cs, id, 2*time.Second)
		if err != nil {
			continue
		}
		if st.State == "leader" && st.Term >= term {
			best, term = id, st.Term
		}
	}
	return best, term
}

func statusOf(ctx context.Context, cs *conns, id string, timeout time.Duration) (client.Status, error) {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return cs.cl[id].StatusOf(sctx, cs.addr[id])
}

// waitLeader waits until some node leads and every running node names it.
func waitLeader(ctx context.Context, c Cluster, cs *conns) (string, error) {
	var last error
	for {
		leader, term := currentLeader(ctx, cs, c.Nodes())
		if leader != "" {
			agree := true
			for _, id := range c.Nodes() {
				if !c.Running(id) {
					continue
				}
				st, err := statusOf(ctx, cs, id, 2*time.Second)
				if err != nil || st.LeaderID != leader || st.Term != term {
					agree = false
					if err != nil {
						last = fmt.Errorf("%s: %w", id, err)
					} else {
						last = fmt.Errorf("%s names leader %q in term %d, %s leads term %d", id, st.LeaderID, st.Term, leader, term)
					}
					break
				}
			}
			if agree {
				return leader, nil
			}
		} else {
			last = errors.New("no node says it leads")
		}
		if !wait(ctx, 200*time.Millisecond) {
			return "", fmt.Errorf("waiting for a leader: %w (last: %v)", ctx.Err(), last)
		}
	}
}
