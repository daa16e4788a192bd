package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/bench"
)

func TestSelected(t *testing.T) {
	for _, tc := range []struct {
		filter, key string
		want        bool
	}{
		{"", "redis-always", true},
		{"redis", "redis-always", true},
		{"redis-always", "redis-everysec", false},
		{"etcd-3,nats", "nats-r3-sync", true},
		{"etcd-3,nats", "etcd-1", false},
	} {
		if got := selected(tc.filter, tc.key); got != tc.want {
			t.Errorf("selected(%q, %q) = %v", tc.filter, tc.key, got)
		}
	}
}

func TestCaseSetsAreSupported(t *testing.T) {
	quick := 0
	for _, s := range systems() {
		quick += len(s.Quick)
		for _, c := range append(append([]Case{}, s.Quick...), s.Full...) {
			if c.Batch < 1 {
				t.Errorf("%s: batch %d", s.Key, c.Batch)
			}
		}
	}
	// --quick promises under a minute of measuring at 2 s per case.
	if time.Duration(quick)*2*time.Second >= time.Minute {
		t.Errorf("quick set has %d cases: %s of measuring", quick, time.Duration(quick)*2*time.Second)
	}
}

func TestReportRatiosAndTargets(t *testing.T) {
	r := newReport(&config{Concurrency: 50, Duration: time.Second, IDSize: 16, TTL: 24 * time.Hour, DedupnodeMode: "serve"})
	add := func(sys string, kind string, wl string, batch int, rate float64) {
		r.Systems = append(r.Systems, sysInfo{Key: sys, Kind: kind})
		r.Results = append(r.Results, &bench.Result{System: sys, Workload: wl, Batch: batch, IDsPerSec: rate, DurationSec: 1, IDs: int64(rate)})
	}
	add("dedupnode-1", "dedupnode", bench.MarkNew, 16, 300000)
	add("dedupnode-3", "dedupnode", bench.MarkNew, 16, 90000)
	add("redis-always", "single", bench.MarkNew, 16, 150000)
	add("postgres", "single", bench.MarkNew, 100, 60000)
	r.computeTargets()
	md := r.markdown()
	if !strings.Contains(md, "| redis-always | mark-new | 16 | 150.0k |") || !strings.Contains(md, "| 2.00× | 0.60× |") {
		t.Errorf("redis row or ratios missing:\n%s", md)
	}
	// PostgreSQL's 100-row statements compare with dedupnode batch 16.
	if !strings.Contains(md, "| postgres | mark-new | 100 | 60.0k |") || !strings.Contains(md, "| 5.00× | 1.50× |") {
		t.Errorf("postgres ratios missing:\n%s", md)
	}
	st := map[string]string{}
	for _, tg := range r.Targets {
		st[tg.Target] = tg.Status
	}
	if st["1 node, mark-new 50×16 ≥ 1.0× Redis appendfsync always pipelined 16"] != "met" ||
		st["3 nodes, mark-new 50×16 ≥ 60k IDs/s"] != "met" ||
		st["3 nodes, mark-new 50×16 ≥ 1.0× PostgreSQL 100-row statements"] != "met" ||
		st["3 nodes, mark-new 50×1 ≥ 8k IDs/s"] != "not measured" {
		t.Errorf("targets: %v", st)
	}
}

func TestCPUSampling(t *testing.T) {
	// Burn a little CPU, then our own process tree must show some.
	x := 0
	for i := 0; i < 20_000_000; i++ {
		x += i % 7
	}
	_ = x
	if s := cpuSeconds([]int{os.Getpid()}); s <= 0 {
		t.Errorf("cpuSeconds(self) = %v", s)
	}
	if machineBusySeconds() <= 0 || selfCPUSeconds() <= 0 {
		t.Error("machine or self CPU clock is zero")
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ps, err := freePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v", ps)
		}
		seen[p] = true
	}
}
