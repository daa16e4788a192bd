package chaos

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/chaos/check"
	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/internal/longtest"
	"github.com/dedupnode/dedupnode/internal/testbin"
)

// These tests start real `dedupnode serve` processes (and a deliberately
// broken build of the server) and run the chaos runner against them. They
// assert on what the checker finds, never on timing.

// binaries returns dedupnode and the unsafe test server, built once per
// test run (testbin).
func binaries(t *testing.T) (dedupnode, unsafeServe string) {
	t.Helper()
	return testbin.Build(t, testbin.Module+"/cmd/dedupnode"),
		testbin.Build(t, testbin.Module+"/chaos/internal/unsafeserve")
}

func TestMain(m *testing.M) { os.Exit(testbin.Main(m)) }

func testConfig(t *testing.T, binary string, d time.Duration, faults ...string) Config {
	dir := t.TempDir()
	return Config{
		Mode:          ModeProcess,
		Duration:      d,
		Nodes:         3,
		Binary:        binary,
		Dir:           filepath.Join(dir, "cluster"),
		Faults:        faults,
		NoFaults:      len(faults) == 0,
		Hold:          [2]time.Duration{2 * time.Second, 4 * time.Second},
		Rest:          [2]time.Duration{time.Second, 2 * time.Second},
		Workload:      WorkloadConfig{Clients: 6},
		ViolationFile: filepath.Join(dir, "violation.json"),
		HistoryFile:   filepath.Join(dir, "history.json"),
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// Run closes the cluster itself; this also covers a test that
		// stops half-way.
		Started: func(c Cluster) { t.Cleanup(func() { _ = c.Close(context.Background()) }) },
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s", b)
	return len(b), nil
}

func runChaos(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	return res
}

// A correct server keeps every invariant while its leader is killed,
// frozen (it wakes up believing it leads) and cut off from a majority.
func TestChaosProcessRunKeepsEveryInvariant(t *testing.T) {
	dn, _ := binaries(t)
	keepsEveryInvariant(t, testConfig(t, dn, 12*time.Second, FaultKillLeader, FaultPauseLeader, FaultSplit))
}

// The same for longer, under every process-mode fault (longtest).
func TestChaosLongProcessRunKeepsEveryInvariant(t *testing.T) {
	longtest.Need(t)
	dn, _ := binaries(t)
	keepsEveryInvariant(t, testConfig(t, dn, 30*time.Second,
		FaultKillLeader, FaultPauseLeader, FaultSplit, FaultOneWay, FaultAsymmetric, FaultKillAll, FaultSlow))
}

func keepsEveryInvariant(t *testing.T, cfg Config) {
	t.Helper()
	res := runChaos(t, cfg)
	rep := res.Report
	if !rep.OK() {
		t.Fatalf("violations on a correct server: %s\n%+v\nhistory in %s", rep.Summary(), rep.Details, res.HistoryFile)
	}
	if rep.Operations == 0 || rep.Faults == 0 || rep.OpsByKind[string(history.Mark)]["ok:new"] == 0 ||
		rep.OpsByKind[string(history.Claim)]["ok:acquired"] == 0 {
		t.Fatalf("the run did too little to mean anything: %+v", rep)
	}
	// A sender killed or frozen between dialling and writing leaves a
	// connection without a header now and then; most must be named.
	if res.Proxy == nil || res.Proxy.Conns == 0 || res.Proxy.Unknown*2 >= res.Proxy.Conns {
		t.Fatalf("the Raft proxy could not name the senders: %+v", res.Proxy)
	}
	h, err := history.ReadFile(res.HistoryFile)
	if err != nil {
		t.Fatal(err)
	}
	// Every node reported its state digest, all at one applied index.
	if len(h.Digests) != 3 || h.Digests[0].Digest == "" || h.Digests[0].AppliedIndex == 0 {
		t.Fatalf("final state digests missing: %+v", h.Digests)
	}
	if again := check.Run(h, check.Options{}); again.Summary() != rep.Summary() || again.Operations != rep.Operations {
		t.Fatalf("re-checking the written history gave %s (%d ops), the run %s (%d ops)",
			again.Summary(), again.Operations, rep.Summary(), rep.Operations)
	}
}

// caught runs the unsafe server with knob until the checker reports one of
// the invariants in want (at most 3 runs: each run is random).
func caught(t *testing.T, knob string, d time.Duration, faults []string, want ...string) *Result {
	t.Helper()
	_, unsafeServe := binaries(t)
	for try := 1; try <= 3; try++ {
		cfg := testConfig(t, unsafeServe, d, faults...)
		cfg.ServeArgs = []string{knob}
		res := runChaos(t, cfg)
		for _, inv := range want {
			if res.Report.Violations[inv] > 0 {
				t.Logf("run %d: %s caught: %s", try, knob, res.Report.Summary())
				return res
			}
		}
		t.Logf("run %d: %s not caught yet: %s", try, knob, res.Report.Summary())
	}
	t.Fatalf("the checker did not catch %s in 3 runs", knob)
	return nil
}

func TestChaosCatchesStaleLinearizableReads(t *testing.T) {
	res := caught(t, "--unsafe-stale-reads", 20*time.Second, []string{FaultSplit, FaultIsolateLeader},
		check.NoStaleRead, check.Linearizable)
	// The smallest offending history is written and shows the violation
	// again on its own.
	sub, err := history.ReadFile(res.ViolationFile)
	if err != nil {
		t.Fatalf("smallest offending history: %v", err)
	}
	if len(sub.Ops) == 0 || len(sub.Ops) >= len(res.History.Ops) {
		t.Fatalf("offending history has %d of %d operations", len(sub.Ops), len(res.History.Ops))
	}
	if rep := check.Run(sub, check.Options{}); rep.OK() {
		t.Fatalf("the offending history passes on its own: %s", sub.Meta.Note)
	}
	if len(sub.Meta.Unsafe) == 0 {
		t.Fatal("the history does not record the unsafe server flag")
	}
}

func TestChaosCatchesAcknowledgingBeforeCommit(t *testing.T) {
	caught(t, "--unsafe-ack-before-commit", 10*time.Second, nil, check.AtMostOneWinner, check.NoLostWrites)
}

// TestChaosCatchesDivergentDigests: a node that reports another state
// digest than its peers at the same applied index fails the run with a
// state_digests violation, and nothing else.
func TestChaosCatchesDivergentDigests(t *testing.T) {
	res := caught(t, "--unsafe-corrupt-digest", 5*time.Second, nil, check.StateDigests)
	if n := res.Report.Violations[check.StateDigests]; n != 1 || res.Report.Total() != 1 || !res.Failed() {
		t.Fatalf("want exactly one state_digests violation: %s", res.Report.Summary())
	}
	sub, err := history.ReadFile(res.ViolationFile)
	if err != nil {
		t.Fatalf("smallest offending history: %v", err)
	}
	if len(sub.Digests) != 3 || check.Run(sub, check.Options{}).Violations[check.StateDigests] != 1 {
		t.Fatalf("the offending history does not show the divergence: %+v", sub.Digests)
	}
}

// Across regions: 3 voters and 3 read replicas in 3 regions under the
// region faults. No invariant breaks, and the replicas of a cut-off
// region keep answering stale checks while their bounded and
// linearizable checks answer seen or fail within the deadline.
func TestChaosAcrossRegionsWithReplicas(t *testing.T) {
	longtest.Need(t)
	dn, _ := binaries(t)
	cfg := testConfig(t, dn, 30*time.Second, FaultRegionCut, FaultRegionOneWay, FaultKillLeaderRegion, FaultRegionDelay)
	cfg.Replicas, cfg.Regions, cfg.WANDelay = 3, 3, 10*time.Millisecond
	cfg.Hold = [2]time.Duration{5 * time.Second, 7 * time.Second}
	res := runChaos(t, cfg)
	if !res.Report.OK() {
		t.Fatalf("violations on a correct server: %s\n%+v\nhistory in %s", res.Report.Summary(), res.Report.Details, res.HistoryFile)
	}
	if res.Probes == nil || !res.Probes.OK() {
		t.Fatalf("cut-off replicas misbehaved: %v", res.Probes)
	}
	t.Logf("cut-off replicas: %v", res.Probes)
	if res.Report.OpsByKind[string(history.Mark)]["ok:new"] == 0 || res.Report.Faults == 0 {
		t.Fatalf("the run did too little to mean anything: %+v", res.Report)
	}
	h, err := history.ReadFile(res.HistoryFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Digests) != 6 || len(h.Meta.Replicas) != 3 {
		t.Fatalf("want digests from 3 voters and 3 replicas, got %d (replicas %v)", len(h.Digests), h.Meta.Replicas)
	}
}
