package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/bench"
)

type sysInfo struct {
	Key    string `json:"key"`
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Nodes  int    `json:"nodes"`
	Detail string `json:"detail"`
}

type failure struct {
	System   string `json:"system"`
	Workload string `json:"workload"`
	Batch    int    `json:"batch"`
	Error    string `json:"error"`
}

type target struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Status   string `json:"status"` // met, not met, not measured
}

type report struct {
	Date        string            `json:"date"`
	Command     string            `json:"command"`
	Quick       bool              `json:"quick"`
	Elapsed     string            `json:"elapsed"`
	Interrupted bool              `json:"interrupted,omitempty"`
	Machine     map[string]string `json:"machine"`
	Versions    map[string]string `json:"versions"`
	Settings    map[string]string `json:"settings"`
	Systems     []sysInfo         `json:"systems"`
	Results     []*bench.Result   `json:"results"`
	Failures    []failure         `json:"failures,omitempty"`
	Targets     []target          `json:"targets"`

	started time.Time
	cfg     *config
}

func newReport(cfg *config) *report {
	r := &report{
		started:  time.Now(),
		cfg:      cfg,
		Date:     time.Now().UTC().Format(time.RFC3339),
		Command:  cfg.Command,
		Quick:    cfg.Quick,
		Machine:  machineInfo(),
		Versions: versions(cfg),
		Settings: map[string]string{
			"concurrency":       fmt.Sprint(cfg.Concurrency),
			"measured per case": cfg.Duration.String(),
			"warm-up per case":  cfg.Warmup.String(),
			"id size":           fmt.Sprintf("%d bytes, random", cfg.IDSize),
			"ttl":               fmtTTL(cfg.TTL),
			"dedupnode mode":    cfg.DedupnodeMode,
			"grpc conns":        fmt.Sprint(cfg.GRPCConns),
			"addresses":         "loopback only (127.0.0.1), ports from the OS",
			"repeat":            fmt.Sprint(max(cfg.Repeat, 1)),
		},
	}
	return r
}

func (r *report) addSystem(s system) {
	r.Systems = append(r.Systems, sysInfo{Key: s.Key, Name: s.Name, Kind: s.Kind, Nodes: s.Nodes, Detail: s.Detail})
}

func (r *report) addResult(s system, res *bench.Result) { r.Results = append(r.Results, res) }

func (r *report) addFailure(s system, c Case, msg string) {
	r.Failures = append(r.Failures, failure{System: s.Key, Workload: c.Workload, Batch: c.Batch, Error: msg})
}

func (r *report) find(sys, workload string, batch int) *bench.Result {
	for _, x := range r.Results {
		if x.System == sys && x.Workload == workload && x.Batch == batch {
			return x
		}
	}
	return nil
}

// counterpart is the dedupnode row a peer row is compared with: same
// workload and batch; PostgreSQL's 100-row statements compare with batch 16.
func (r *report) counterpart(nodes int, res *bench.Result) *bench.Result {
	b := res.Batch
	if b > 16 {
		b = 16
	}
	return r.find(fmt.Sprintf("dedupnode-%d", nodes), res.Workload, b)
}

func ratio(a, b *bench.Result) string {
	if a == nil || b == nil || b.IDsPerSec == 0 || a.IDsPerSec == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a.IDsPerSec/b.IDsPerSec)
}

func (r *report) kindOf(key string) string {
	for _, s := range r.Systems {
		if s.Key == key {
			return s.Kind
		}
	}
	return ""
}

func (r *report) write(dir string) (string, string, error) {
	r.computeTargets()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	name := time.Now().UTC().Format("2006-01-02")
	if r.cfg.Label != "" {
		name += "-" + r.cfg.Label
	}
	mdPath := filepath.Join(dir, name+".md")
	jsPath := filepath.Join(dir, name+".json")
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(jsPath, append(js, '\n'), 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(mdPath, []byte(r.markdown()), 0o644); err != nil {
		return "", "", err
	}
	return mdPath, jsPath, nil
}

func (r *report) markdown() string {
	var b strings.Builder
	title := "dedupnode vs peers"
	if r.Quick {
		title += " (quick run)"
	}
	fmt.Fprintf(&b, "# %s — %s\n\n", title, r.Date)
	fmt.Fprintf(&b, "Command: `%s` (took %s)", r.Command, r.Elapsed)
	if r.Interrupted {
		b.WriteString(" — **interrupted, partial results**")
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "Machine: %s, %s cores, %s RAM, kernel %s, %s. Every server and the load generator share it; "+
		"figures vary ±25%% run to run on shared machines.\n\n",
		r.Machine["cpu"], r.Machine["cores"], r.Machine["memory"], r.Machine["kernel"], r.Machine["go"])
	fmt.Fprintf(&b, "Load: %s callers, each with one call (or pipeline, or statement) in flight; %s; TTL %s; "+
		"%s measured per case after %s of warm-up%s. Every mark is durable before its answer unless the system says otherwise below.\n\n",
		r.Settings["concurrency"], r.Settings["id size"], r.Settings["ttl"], r.Settings["measured per case"], r.Settings["warm-up per case"], repeatNote(r.cfg.Repeat))

	b.WriteString("## Results\n\n")
	b.WriteString("Throughput in IDs/s; latency of one call (a whole pipeline or batch) in ms; server CPU summed over the system's processes. " +
		"The ratio columns divide dedupnode's throughput (same workload and batch; batch 16 for PostgreSQL's 100-row statements) by the row's.\n\n")
	b.WriteString("\"Other load\" is the CPU that processes outside the test (other work on this shared machine) used during the case, in cores out of " +
		r.Machine["cores"] + ": a row with much of it is understated.\n\n")
	b.WriteString("| system | workload | batch | IDs/s | calls/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/ID | dedupnode 1 node ÷ row | dedupnode 3 nodes ÷ row | errors | other load |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Results {
		r1, r3 := "—", "—"
		if r.kindOf(x.System) != "dedupnode" {
			r1, r3 = ratio(r.counterpart(1, x), x), ratio(r.counterpart(3, x), x)
		}
		cpu := "—"
		if x.CPUUsPerID > 0 {
			cpu = fmt.Sprintf("%.1f", x.CPUUsPerID)
		}
		errs := fmt.Sprint(x.Errors)
		if x.Unexpected > 0 {
			errs += fmt.Sprintf(" (+%d unexpected answers)", x.Unexpected)
		}
		other := "—"
		if x.DurationSec > 0 {
			other = fmt.Sprintf("%.2f", x.OtherCPUSec/x.DurationSec)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |\n",
			x.System, x.Workload, x.Batch, fmtRate(x.IDsPerSec), fmtRate(x.CallsPerSec), x.P50Ms, x.P99Ms, x.P999Ms, cpu, r1, r3, errs, other)
	}
	b.WriteString("\n")
	if len(r.Failures) > 0 {
		b.WriteString("Not measured:\n\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "- %s %s batch %d: %s\n", f.System, f.Workload, f.Batch, f.Error)
		}
		b.WriteString("\n")
	}
	var notes []string
	for _, x := range r.Results {
		if x.Note != "" {
			notes = append(notes, fmt.Sprintf("- %s %s batch %d: %s", x.System, x.Workload, x.Batch, x.Note))
		}
	}
	if len(notes) > 0 {
		b.WriteString("Notes:\n\n" + strings.Join(notes, "\n") + "\n\n")
	}

	b.WriteString("## Targets (issue 6)\n\n| target | measured | status |\n| --- | --- | --- |\n")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Target, t.Measured, t.Status)
	}
	b.WriteString("\n## Systems\n\n")
	for _, s := range r.Systems {
		fmt.Fprintf(&b, "- **%s** (`%s`): %s\n", s.Name, s.Key, s.Detail)
	}
	b.WriteString("\n## Versions\n\n")
	for _, k := range sortedKeys(r.Versions) {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Versions[k])
	}
	b.WriteString("\nThe same figures, with p90, max, answers and CPU seconds, are in the .json file beside this one.\n")
	return b.String()
}

func fmtRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// computeTargets checks the targets against this run.
func (r *report) computeTargets() {
	r.Targets = nil
	d1m16 := r.find("dedupnode-1", bench.MarkNew, 16)
	d1m1 := r.find("dedupnode-1", bench.MarkNew, 1)
	d3m16 := r.find("dedupnode-3", bench.MarkNew, 16)
	d3m1 := r.find("dedupnode-3", bench.MarkNew, 1)
	d3c16 := r.find("dedupnode-3", bench.CheckMiss, 16)
	redisA16 := r.find("redis-always", bench.MarkNew, 16)
	redisA1 := r.find("redis-always", bench.MarkNew, 1)
	redisE16 := r.find("redis-always", bench.CheckMiss, 16)
	pg100 := r.find("postgres", bench.MarkNew, 100)

	vsPeer := func(name string, d, p *bench.Result, want float64, dname, pname string) {
		t := target{Target: name}
		switch {
		case d == nil || p == nil:
			t.Measured, t.Status = "not in this run", "not measured"
		default:
			got := d.IDsPerSec / p.IDsPerSec
			t.Measured = fmt.Sprintf("%s %s vs %s %s IDs/s = %.2f×", dname, fmtRate(d.IDsPerSec), pname, fmtRate(p.IDsPerSec), got)
			t.Status = status(got >= want)
		}
		r.Targets = append(r.Targets, t)
	}
	// The targets of issue 13 (Performance II).
	vsPeer("1 node, mark-new 50×16 ≥ 1.0× Redis appendfsync always pipelined 16", d1m16, redisA16, 1.0, "dedupnode", "Redis")
	vsPeer("1 node, mark-new 50×1 ≥ 0.6× Redis appendfsync always unpipelined", d1m1, redisA1, 0.6, "dedupnode", "Redis")
	abs := func(name string, d *bench.Result, want float64) {
		t := target{Target: name}
		if d == nil {
			t.Measured, t.Status = "not in this run", "not measured"
		} else {
			t.Measured = fmt.Sprintf("%s IDs/s", fmtRate(d.IDsPerSec))
			t.Status = status(d.IDsPerSec >= want)
		}
		r.Targets = append(r.Targets, t)
	}
	abs("3 nodes, mark-new 50×16 ≥ 60k IDs/s", d3m16, 60000)
	vsPeer("3 nodes, mark-new 50×16 ≥ 1.0× PostgreSQL 100-row statements", d3m16, pg100, 1.0, "dedupnode", "PostgreSQL")
	abs("3 nodes, mark-new 50×1 ≥ 8k IDs/s", d3m1, 8000)
	{
		t := target{Target: "3 nodes, mark latency at 50×1: p99 ≤ 15 ms"}
		if d3m1 == nil {
			t.Measured, t.Status = "not in this run", "not measured"
		} else {
			t.Measured = fmt.Sprintf("p99 %.2f ms", d3m1.P99Ms)
			t.Status = status(d3m1.P99Ms <= 15)
		}
		r.Targets = append(r.Targets, t)
	}
	{
		t := target{Target: "3 nodes, server CPU per acknowledged ID (all nodes summed, mark-new 50×16) ≤ 15 µs"}
		if d3m16 == nil || d3m16.CPUUsPerID == 0 {
			t.Measured, t.Status = "not in this run", "not measured"
		} else {
			t.Measured = fmt.Sprintf("%.1f µs", d3m16.CPUUsPerID)
			t.Status = status(d3m16.CPUUsPerID <= 15)
		}
		r.Targets = append(r.Targets, t)
	}
	vsPeer("3 nodes, check-miss linearizable 50×16 ≥ 0.8× Redis EXISTS pipelined 16", d3c16, redisE16, 0.8, "dedupnode", "Redis")
	r.Targets = append(r.Targets,
		target{Target: "Raft log directory after 10M IDs + snapshot ≤ 2× the entries kept", Measured: "not measured by this script (scripts/scale.sh)", Status: "not measured"},
	)
}

func status(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func machineInfo() map[string]string {
	m := map[string]string{
		"cores": fmt.Sprint(runtime.NumCPU()),
		"go":    runtime.Version(),
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					m["cpu"] = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		m["memory"] = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	return m
}

func versions(cfg *config) map[string]string {
	v := map[string]string{}
	if s := redisVersion(); s != "" {
		v["redis-server"] = s
	}
	if s := postgresVersion(); s != "" {
		v["postgres"] = s
	}
	if s := dedupnodeVersion(cfg.DedupnodeBin); s != "" {
		v["dedupnode"] = s
	}
	if c := os.Getenv("DEDUPNODE_COMMIT"); c != "" {
		v["dedupnode commit"] = c
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "go.etcd.io/etcd/server/v3", "github.com/nats-io/nats-server/v2", "github.com/nats-io/nats.go",
				"github.com/redis/go-redis/v9", "github.com/jackc/pgx/v5", "google.golang.org/grpc":
				v[d.Path] = d.Version
			}
		}
	}
	return v
}

func fmtTTL(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d day(s)", d/(24*time.Hour))
	}
	return d.String()
}

func repeatNote(n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(", each case run %d times and the median run reported (range in the notes)", n)
}
