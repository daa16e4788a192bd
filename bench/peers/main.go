// Command peers runs the same deduplication workloads against dedupnode and
// its peers (Redis, PostgreSQL, etcd, NATS JetStream) on this machine, over
// loopback, and writes one comparison table. scripts/bench-peers.sh builds
// and runs it; see `peers run -h`.
//
// It lives in its own Go module so the peers' dependencies (etcd, NATS
// server, Redis and PostgreSQL clients) stay out of dedupnode's go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dedupnode/dedupnode/bench"
)

type config struct {
	Quick         bool
	Out           string
	Systems       string
	Concurrency   int
	Duration      time.Duration
	Warmup        time.Duration
	IDSize        int
	TTL           time.Duration
	Timeout       time.Duration
	DedupnodeBin  string
	DedupnodeMode string
	GRPCConns     int
	Tmp           string
	Keep          bool
	Command       string
	NoProgress    bool
	Label         string
	Repeat        int
}

type env struct {
	cfg  *config
	base string
	self string
}

// dir makes a fresh directory for one server under the run's temp dir,
// readable by other users (PostgreSQL runs as the postgres user).
func (e *env) dir(name string) (string, error) {
	d := filepath.Join(e.base, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", err
	}
	return d, os.Chmod(d, 0o755)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peers run [flags] | peers etcd-node ... | peers nats-node ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runMain(os.Args[2:])
	case "etcd-node":
		err = etcdNodeMain(os.Args[2:])
	case "nats-node":
		err = natsNodeMain(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "peers: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// Case sets. The quick set measures 25 cases of 2 s (50 s of measuring).
var (
	mark1, mark16, mark100 = Case{bench.MarkNew, 1}, Case{bench.MarkNew, 16}, Case{bench.MarkNew, 100}
	miss1, miss16          = Case{bench.CheckMiss, 1}, Case{bench.CheckMiss, 16}
	mixed16, hit16, cc16   = Case{bench.MarkMixed, 16}, Case{bench.CheckHit, 16}, Case{bench.ClaimCommit, 16}
)

func systems() []system {
	return []system{
		dedupnodeSystem(3, defaultLogStore, []Case{mark16, mark1, miss16}, []Case{mark16, mark1, miss16, miss1, mixed16, hit16, cc16}),
		dedupnodeSystem(1, defaultLogStore, []Case{mark16, mark1, miss16}, []Case{mark16, mark1, miss16, miss1, mixed16, hit16, cc16}),
		// Streamed calls: in the quick set only the batch-16 rows, which
		// keep --quick under a minute of measuring.
		dedupnodeStreamSystem(3, []Case{mark16, miss16}, []Case{mark16, mark1, miss16, miss1}),
		dedupnodeStreamSystem(1, []Case{mark16}, []Case{mark16, mark1, miss16, miss1}),
		// The other log store: the write rows, where the log's fsyncs are
		// (full runs only: the quick set keeps under a minute).
		dedupnodeSystem(3, otherLogStore, nil, []Case{mark16, mark1}),
		dedupnodeSystem(1, otherLogStore, nil, []Case{mark16, mark1}),
		dedupnodeBatcherSystem(3, []Case{mark1, miss1, miss16}, []Case{mark16, mark1, miss16, miss1}),
		redisSystem("always", []Case{mark16, mark1, miss16}, []Case{mark16, mark1, miss16, miss1}),
		redisSystem("everysec", []Case{mark16, mark1}, []Case{mark16, mark1}),
		redisSystem("none", nil, []Case{mark16, mark1, miss16}),
		postgresSystem([]Case{mark1, mark100, miss16}, []Case{mark1, mark16, mark100, miss1, miss16}),
		etcdSystem(1, []Case{mark1, mark16}, []Case{mark1, mark16, miss1, miss16}),
		etcdSystem(3, []Case{mark1, mark16}, []Case{mark1, mark16, miss1, miss16}),
		natsSystem(1, false, []Case{mark16}, []Case{mark16, mark1}),
		natsSystem(1, true, nil, []Case{mark16, mark1}),
		natsSystem(3, false, []Case{mark16}, []Case{mark16, mark1}),
		natsSystem(3, true, []Case{mark16, mark1}, []Case{mark16, mark1}),
	}
}

func runMain(args []string) error {
	cfg := &config{}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.BoolVar(&cfg.Quick, "quick", false, "reduced set: 2 s per case, under a minute of measuring")
	fs.StringVar(&cfg.Out, "out", "bench/results", "directory for <date>.md and <date>.json")
	fs.StringVar(&cfg.Systems, "systems", "", "comma-separated system keys or prefixes to run (default: all), e.g. redis,etcd-3")
	fs.IntVar(&cfg.Concurrency, "concurrency", 50, "concurrent callers")
	fs.DurationVar(&cfg.Duration, "duration", 0, "measured time per case (default 10s, 2s with --quick)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "warm-up per case (default 2s, 0.5s with --quick)")
	fs.IntVar(&cfg.IDSize, "id-size", 16, "bytes per random ID")
	fs.DurationVar(&cfg.TTL, "ttl", 24*time.Hour, "TTL of every mark")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "deadline of one call")
	fs.StringVar(&cfg.DedupnodeBin, "dedupnode-bin", "", "path to a built dedupnode binary (dedupnode rows are skipped without it)")
	fs.StringVar(&cfg.DedupnodeMode, "dedupnode-mode", "serve", "serve (one process per node) or dev (one `dedupnode dev` process)")
	fs.IntVar(&cfg.GRPCConns, "grpc-conns", 2, "gRPC connections per address for dedupnode and in total for etcd")
	fs.StringVar(&cfg.Tmp, "tmp", "", "parent of the run's data directory (default $TMPDIR)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the data directories and server logs")
	fs.StringVar(&cfg.Command, "command", "", "command line to record in the report")
	fs.BoolVar(&cfg.NoProgress, "no-progress", false, "no progress bars")
	fs.IntVar(&cfg.Repeat, "repeat", 1, "measure each case this many times and report the median run (the range goes in the notes)")
	fs.StringVar(&cfg.Label, "label", "", "suffix of the result file names (default: quick for --quick)")
	_ = fs.Parse(args)
	if cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
		if cfg.Quick {
			cfg.Duration = 2 * time.Second
		}
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 2 * time.Second
		if cfg.Quick {
			cfg.Warmup = 500 * time.Millisecond
		}
	}
	if cfg.Label == "" && cfg.Quick {
		cfg.Label = "quick"
	}
	if cfg.Command == "" {
		cfg.Command = strings.Join(os.Args, " ")
	}
	if cfg.DedupnodeMode != "serve" && cfg.DedupnodeMode != "dev" {
		return fmt.Errorf("--dedupnode-mode %q: serve or dev", cfg.DedupnodeMode)
	}
	if cfg.GRPCConns < 1 {
		cfg.GRPCConns = 1
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	base, err := os.MkdirTemp(cfg.Tmp, "dedupnode-bench-")
	if err != nil {
		return err
	}
	if err := os.Chmod(base, 0o755); err != nil {
		return err
	}
	e := &env{cfg: cfg, base: base, self: self}
	defer func() {
		stopAll()
		if cfg.Keep {
			logf2("kept data and logs in %s", base)
		} else {
			os.RemoveAll(base)
		}
	}()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	rep := newReport(cfg)
	rc := runCfg{
		Concurrency: cfg.Concurrency,
		Duration:    cfg.Duration,
		Warmup:      cfg.Warmup,
		IDSize:      cfg.IDSize,
		TTL:         cfg.TTL,
		Timeout:     cfg.Timeout,
	}
	if !cfg.NoProgress {
		rc.Progress = os.Stderr
	}
	started := time.Now()
	for _, s := range systems() {
		if !selected(cfg.Systems, s.Key) {
			continue
		}
		cases := s.Full
		if cfg.Quick {
			cases = s.Quick
		}
		if len(cases) == 0 {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		rep.addSystem(s)
		logf2("starting %s", s.Name)
		inst, err := s.Start(ctx, e)
		if err != nil {
			why := err.Error()
			if errors.Is(err, errSkip) {
				logf2("skipping %s: %s", s.Name, why)
			} else {
				logf2("could not start %s: %s", s.Name, why)
			}
			for _, c := range cases {
				rep.addFailure(s, c, "not started: "+firstLine(why))
			}
			continue
		}
		for _, c := range cases {
			if ctx.Err() != nil {
				break
			}
			if !inst.Supports(c.Workload) {
				continue
			}
			res, err := runRepeated(ctx, inst, c, rc, cfg.Repeat)
			if err != nil {
				logf2("%s %s: %v", s.Key, c, err)
				rep.addFailure(s, c, firstLine(err.Error()))
				continue
			}
			res.System = s.Key
			logf2("%-16s %-12s b%-3d %10s IDs/s  p50 %7.3f ms  p99 %8.3f ms  cpu %6.1f µs/ID  errors %d  other load %.2f%s",
				s.Key, c.Workload, c.Batch, bench.Human(res.IDsPerSec), res.P50Ms, res.P99Ms, res.CPUUsPerID, res.Errors,
				res.OtherCPUSec/max(res.DurationSec, 0.001), noteSuffix(res))
			rep.addResult(s, res)
		}
		inst.Close()
		logf2("stopped %s", s.Name)
		if !cfg.Keep {
			cleanSystemDirs(base)
		}
	}
	rep.Elapsed = time.Since(started).Round(time.Second).String()
	if ctx.Err() != nil {
		rep.Interrupted = true
	}
	md, js, err := rep.write(cfg.Out)
	if err != nil {
		return err
	}
	logf2("wrote %s and %s", md, js)
	fmt.Println(md)
	if rep.Interrupted {
		return errors.New("interrupted; partial results written")
	}
	return nil
}

func noteSuffix(r *bench.Result) string {
	var s string
	if r.Unexpected > 0 {
		s += fmt.Sprintf("  UNEXPECTED %d", r.Unexpected)
	}
	if r.Note != "" {
		s += "  (" + r.Note + ")"
	}
	return s
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// selected reports whether key matches the --systems filter (names or
// prefixes, e.g. "redis" matches every Redis variant).
func selected(filter, key string) bool {
	if filter == "" {
		return true
	}
	for _, f := range strings.Split(filter, ",") {
		f = strings.TrimSpace(f)
		if f != "" && (key == f || strings.HasPrefix(key, f)) {
			return true
		}
	}
	return false
}

// cleanSystemDirs removes the data of stopped servers (logs go with it).
func cleanSystemDirs(base string) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(base, e.Name()))
	}
}

// runRepeated measures a case n times and returns the run with the median
// throughput, noting the range of all runs.
func runRepeated(ctx context.Context, inst Instance, c Case, rc runCfg, n int) (*bench.Result, error) {
	if n <= 1 {
		return inst.Run(ctx, c, rc)
	}
	var runs []*bench.Result
	for i := 0; i < n && ctx.Err() == nil; i++ {
		res, err := inst.Run(ctx, c, rc)
		if err != nil {
			return nil, err
		}
		runs = append(runs, res)
	}
	if len(runs) == 0 {
		return nil, ctx.Err()
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].IDsPerSec < runs[j].IDsPerSec })
	med := runs[len(runs)/2]
	rng := fmt.Sprintf("median of %d runs, range %s–%s IDs/s", len(runs), fmtRate(runs[0].IDsPerSec), fmtRate(runs[len(runs)-1].IDsPerSec))
	if med.Note != "" {
		med.Note = rng + "; " + med.Note
	} else {
		med.Note = rng
	}
	return med, nil
}
