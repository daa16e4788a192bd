package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"path/filepath"
	"sort"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/chaos/check"
	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/chaos/netproxy"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/replicacheck"
)

// Modes of a run.
const (
	ModeProcess = "process"
	ModeDocker  = "docker"
)

// Config configures a chaos run. Zero values take the defaults named.
type Config struct {
	// Mode is ModeProcess (default) or ModeDocker.
	Mode string
	// Duration of the workload under faults (default 60 s). Healing,
	// convergence and checking come on top (usually well under a minute).
	Duration time.Duration
	// Nodes in the cluster (default 3): the voters.
	Nodes int
	// Replicas, Regions and WANDelay: read replicas, regions and the base
	// delay between regions (process mode; see ProcessConfig). With
	// regions, the region faults apply and every region-cut and
	// region-one-way is probed on the cut region's replicas (ProbeStats)
	// with ProbeDeadline (default 2 s) per check.
	Replicas      int
	Regions       int
	WANDelay      time.Duration
	ProbeDeadline time.Duration
	Workload      WorkloadConfig
	// Faults to draw from (default: every kind the mode supports). Empty
	// after filtering means a run without faults.
	Faults   []string
	NoFaults bool
	// Hold is how long a fault lasts, Rest the quiet time between faults
	// (defaults 3-8 s and 2-5 s).
	Hold, Rest [2]time.Duration
	// Seed makes fault and workload choices repeatable (default: time).
	Seed int64

	// Process mode.
	Binary    string
	Dir       string
	KeepDir   bool
	ServeArgs []string

	// Docker mode.
	Docker DockerConfig

	// HistoryFile receives the whole history ("" = only when a violation
	// is found, next to ViolationFile).
	HistoryFile string
	// ViolationFile receives the smallest offending history on a violation
	// (default chaos-violation-<time>.json in the working directory).
	ViolationFile string
	// Converge bounds the wait for the healed cluster to catch up
	// (default 2 min).
	Converge time.Duration
	Logger   *slog.Logger
	// Started, if set, is called once the cluster has a leader and the
	// workload begins (tests use it to know the run is under way).
	Started func(Cluster)
}

func (c *Config) withDefaults() Config {
	d := *c
	if d.Mode == "" {
		d.Mode = ModeProcess
	}
	if d.Duration <= 0 {
		d.Duration = 60 * time.Second
	}
	if d.Nodes <= 0 {
		d.Nodes = 3
	}
	if d.Hold[1] <= 0 {
		d.Hold = [2]time.Duration{3 * time.Second, 8 * time.Second}
	}
	if d.Rest[1] <= 0 {
		d.Rest = [2]time.Duration{2 * time.Second, 5 * time.Second}
	}
	if d.Seed == 0 {
		d.Seed = time.Now().UnixNano()
	}
	if d.ProbeDeadline <= 0 {
		d.ProbeDeadline = 2 * time.Second
	}
	if d.Replicas > 0 && d.Workload.MaxStaleness == 0 {
		d.Workload.MaxStaleness = 2 * time.Second
	}
	if d.Converge <= 0 {
		d.Converge = 2 * time.Minute
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.ViolationFile == "" {
		d.ViolationFile = fmt.Sprintf("chaos-violation-%s.json", time.Now().UTC().Format("20060102-150405"))
	}
	return d
}

// Result is what a run found.
type Result struct {
	Mode     string        `json:"mode"`
	Nodes    int           `json:"nodes"`
	Clients  int           `json:"clients"`
	Seed     int64         `json:"seed"`
	Duration time.Duration `json:"-"`
	// Workload is the time under faults; Total includes start, healing,
	// convergence and checking.
	WorkloadSeconds float64 `json:"duration_s"`
	TotalSeconds    float64 `json:"total_s"`
	Cluster         string  `json:"cluster"`
	// Faults kinds that were eligible.
	FaultKinds []string `json:"fault_kinds"`
	Notes      []string `json:"notes,omitempty"`
	// Report is the checker's verdict; its operations, faults and
	// violations are repeated at the top level of the JSON output.
	Report        *check.Report    `json:"report"`
	Proxy         *netproxy.Stats  `json:"proxy,omitempty"`
	Probes        *ProbeStats      `json:"region_probes,omitempty"`
	HistoryFile   string           `json:"history_file,omitempty"`
	ViolationFile string           `json:"violation_file,omitempty"`
	History       *history.History `json:"-"`
}

// Run starts a cluster, runs the workload under faults for cfg.Duration,
// heals everything, waits for the cluster to catch up, reads every ID from
// every node and checks the history. It returns an error only when the run
// itself could not be carried out; violations are in Result.Report.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	log := cfg.Logger
	began := time.Now()
	var (
		cl  Cluster
		err error
	)
	switch cfg.Mode {
	case ModeProcess:
		cl, err = StartProcessCluster(ctx, ProcessConfig{Binary: cfg.Binary, Nodes: cfg.Nodes, Dir: cfg.Dir,
			KeepDir: cfg.KeepDir, ServeArgs: cfg.ServeArgs, Logger: log,
			Replicas: cfg.Replicas, Regions: cfg.Regions, WANDelay: cfg.WANDelay})
	case ModeDocker:
		if cfg.Replicas > 0 || cfg.Regions > 1 {
			return nil, errors.New("read replicas and regions run in process mode only")
		}
		dc := cfg.Docker
		dc.Nodes = cfg.Nodes
		dc.Logger = log
		cl, err = StartDockerCluster(ctx, dc)
	default:
		return nil, fmt.Errorf("unknown mode %q: want process or docker", cfg.Mode)
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := cl.Close(cctx); err != nil {
			log.Warn("closing the cluster", "err", err)
		}
	}()
	cs, err := dialAll(cl)
	if err != nil {
		return nil, err
	}
	defer cs.close()

	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	leader, err := waitLeader(wctx, cl, cs)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("cluster did not elect a leader (logs: %s): %w", cl.Describe(), err)
	}
	log.Info("cluster up", "leader", leader, "cluster", cl.Describe())

	caps := cl.Caps()
	kinds := cfg.Faults
	if len(kinds) == 0 && !cfg.NoFaults {
		kinds = AllFaults
	}
	var eligible []string
	for _, k := range kinds {
		if supported(k, caps) {
			eligible = append(eligible, k)
		} else if len(cfg.Faults) > 0 {
			return nil, fmt.Errorf("fault %q is not available in %s mode", k, cfg.Mode)
		}
	}
	if cfg.NoFaults {
		eligible = nil
	}

	clock := history.NewClock()
	wl := cfg.Workload.withDefaults()
	rec := history.NewRecorder(clock, history.Meta{Mode: cfg.Mode, Nodes: cl.Nodes(), Clients: wl.Clients,
		TTLMs: wl.TTL.Milliseconds(), LeaseMs: wl.Lease.Milliseconds(), Seed: cfg.Seed, Unsafe: unsafeArgs(cfg.ServeArgs)})
	rec.SetMeta(func(m *history.Meta) { m.Start = clock.Now() })
	w := newWorkload(wl, cs, rec, cfg.Seed)
	nem := &nemesis{c: cl, cs: cs, rec: rec, log: log, kinds: eligible, hold: cfg.Hold, rest: cfg.Rest,
		rng: mrand.New(mrand.NewPCG(uint64(cfg.Seed), 7))}
	if pc, ok := cl.(*processCluster); ok && (cfg.Replicas > 0 || cfg.Regions > 1) {
		nem.regions = pc.Regions()
		replicas := map[string]bool{}
		for _, id := range pc.ids {
			if pc.isReplica(id) {
				replicas[id] = true
			}
		}
		rec.SetMeta(func(m *history.Meta) {
			m.Regions = pc.region
			for id := range replicas {
				m.Replicas = append(m.Replicas, id)
			}
			sort.Strings(m.Replicas)
		})
		if len(replicas) > 0 && nem.regions != nil {
			nem.probe = &regionProber{w: w, replicas: replicas, maxStaleness: wl.MaxStaleness, log: log,
				stats: ProbeStats{Deadline: cfg.ProbeDeadline}}
		}
	}
	if cfg.Started != nil {
		cfg.Started(cl)
	}

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	nemDone := make(chan struct{})
	go func() {
		defer close(nemDone)
		nem.run(runCtx)
	}()
	w.run(runCtx) // returns once in-flight operations finished
	workloadEnd := time.Now()
	<-nemDone
	rec.SetMeta(func(m *history.Meta) { m.End = clock.Now() })
	if ctx.Err() != nil {
		return nil, fmt.Errorf("chaos run interrupted: %w", ctx.Err())
	}

	// Heal everything, then wait for the cluster to catch up.
	hctx := context.WithoutCancel(ctx)
	_ = cl.HealNet(hctx)
	for _, id := range cl.Nodes() {
		_ = cl.Resume(hctx, id)
		if !cl.Running(id) {
			if err := cl.Start(hctx, id); err != nil {
				log.Warn("restart for the final reads", "node", id, "err", err)
			}
		}
	}
	// Leases taken near the end must expire on every node before the
	// final reads, so that the replicas are compared at rest.
	wait(ctx, time.Until(workloadEnd.Add(wl.Lease+time.Second)))
	cctx, ccancel := context.WithTimeout(ctx, cfg.Converge)
	finished := true
	if err := converge(cctx, cl, cs); err != nil {
		log.Warn("cluster did not converge", "err", err)
		if pc, ok := cl.(*processCluster); ok {
			pc.logTails(log, 4000)
		}
		finished = false
	}
	if finished {
		finalReads(cctx, cl, cs, rec, w.Keys(), wl.Namespace)
		finalDigests(cctx, cl, cs, rec, log)
	}
	ccancel()
	rec.SetMeta(func(m *history.Meta) { m.Finished = finished })

	h := rec.History()
	rep := check.Run(h, check.Options{})
	res := &Result{Mode: cfg.Mode, Nodes: cfg.Nodes, Clients: wl.Clients, Seed: cfg.Seed,
		Duration: cfg.Duration, WorkloadSeconds: cfg.Duration.Seconds(), Cluster: cl.Describe(),
		FaultKinds: eligible, Notes: caps.Notes, Report: rep, History: h}
	if pc, ok := cl.(*processCluster); ok {
		st := pc.ProxyStats()
		res.Proxy = &st
	}
	if nem.probe != nil {
		ps := nem.probe.Stats()
		res.Probes = &ps
	}
	if !rep.OK() {
		if sub := check.Smallest(h, rep); sub != nil {
			if err := sub.WriteFile(cfg.ViolationFile); err != nil {
				log.Error("writing the offending history", "err", err)
			} else {
				res.ViolationFile = cfg.ViolationFile
			}
		}
		if cfg.HistoryFile == "" {
			cfg.HistoryFile = filepath.Join(filepath.Dir(cfg.ViolationFile),
				"chaos-history-"+time.Now().UTC().Format("20060102-150405")+".json")
		}
	}
	if cfg.HistoryFile != "" {
		if err := h.WriteFile(cfg.HistoryFile); err != nil {
			log.Error("writing the history", "err", err)
		} else {
			res.HistoryFile = cfg.HistoryFile
		}
	}
	res.TotalSeconds = time.Since(began).Seconds()
	return res, nil
}

// unsafeArgs picks the deliberately unsafe server flags out of args.
func unsafeArgs(args []string) []string {
	var out []string
	for _, a := range args {
		if len(a) > 9 && a[:9] == "--unsafe-" {
			out = append(out, a)
		}
	}
	return out
}

// converge waits until a leader is known to every node and every node has
// applied the leader's commit index (sampled once a leader is agreed).
func converge(ctx context.Context, cl Cluster, cs *conns) error {
	leader, err := waitLeader(ctx, cl, cs)
	if err != nil {
		return err
	}
	st, err := statusOf(ctx, cs, leader, 5*time.Second)
	if err != nil {
		return fmt.Errorf("status of leader %s: %w", leader, err)
	}
	target := st.CommitIndex
	for _, id := range cl.Nodes() {
		for {
			s, err := statusOf(ctx, cs, id, 2*time.Second)
			if err == nil && s.AppliedIndex >= target {
				break
			}
			if !wait(ctx, 200*time.Millisecond) {
				if err != nil {
					return fmt.Errorf("node %s did not catch up to index %d: %w", id, target, err)
				}
				return fmt.Errorf("node %s applied %d, not %d: %w", id, s.AppliedIndex, target, ctx.Err())
			}
		}
	}
	return nil
}

// finalReads reads every key from every node with stale consistency (the
// node's own state) and records the answers.
func finalReads(ctx context.Context, cl Cluster, cs *conns, rec *history.Recorder, keys []string, ns string) {
	sort.Strings(keys)
	clock := rec.Clock()
	for _, id := range cl.Nodes() {
		for i := 0; i < len(keys); i += 500 {
			batch := keys[i:min(i+500, len(keys))]
			ids := make([][]byte, len(batch))
			for j, k := range batch {
				ids[j] = []byte(k)
			}
			var resp []client.Result
			var err error
			for try := 0; try < 5; try++ {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err = cs.cl[id].Check(rctx, ns, ids, client.Stale)
				cancel()
				if err == nil {
					break
				}
				if !wait(ctx, time.Second) {
					break
				}
			}
			at := clock.Now()
			reads := make([]history.FinalRead, len(batch))
			for j, k := range batch {
				reads[j] = history.FinalRead{Node: id, Key: k, At: at}
				if err != nil {
					reads[j].Error = err.Error()
					continue
				}
				r := resp[j]
				reads[j].Result = r.Code.String()
				if r.Code == client.CodeSeen {
					reads[j].Record = recordOf(r.Record)
				}
			}
			rec.AddFinal(reads...)
		}
	}
}

// finalDigests asks every node for its state digest (Ops.Digest) until one
// round finds them all at the same applied index (or ctx ends, or 1 min
// passes) and records that round for the checker (state_digests).
func finalDigests(ctx context.Context, cl Cluster, cs *conns, rec *history.Recorder, log *slog.Logger) {
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ask := func(ctx context.Context, id string) (*dedupv1.DigestResponse, error) {
		return cs.cl[id].DigestOf(ctx, cs.addr[id])
	}
	res := replicacheck.Compare(dctx, cl.Nodes(), ask, replicacheck.Options{CallTimeout: 20 * time.Second})
	at := rec.Clock().Now()
	ds := make([]history.NodeDigest, len(res.Answers))
	for i, a := range res.Answers {
		ds[i] = history.NodeDigest{Node: a.Node, At: at}
		if a.Err != nil {
			ds[i].Error = a.Err.Error()
			continue
		}
		ds[i].AppliedIndex, ds[i].Records, ds[i].Digest = a.Resp.AppliedIndex, a.Resp.Records, replicacheck.Hex(a.Resp.Digest)
	}
	rec.SetDigests(ds...)
	log.Info("state digests", "result", res.Summary(), "rounds", res.Rounds)
}

// Failed reports whether the run found violations.
func (r *Result) Failed() bool {
	return (r.Report != nil && !r.Report.OK()) || (r.Probes != nil && !r.Probes.OK())
}
