package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dedupnode/dedupnode/bench"
)

const benchLong = `Bench drives a running cluster with one workload and reports throughput
(IDs/s and calls/s) and call latency (p50, p90, p99, p99.9 from an HDR
histogram). Every loop is bounded: by --duration (default 10s) or by
--count IDs, and never longer than --max-time.

Workloads:
  mark-new      Mark fresh random IDs; every answer should be NEW
  mark-mixed    Mark IDs of which --duplicate-ratio repeat earlier ones
  check-hit     Check IDs marked in a preload phase (--preload); all SEEN
  check-miss    Check fresh random IDs; every answer should be NOT_SEEN
  claim-commit  Claim fresh IDs, then Commit the leases (2 calls per batch)

Answers that contradict the workload (a DUPLICATE for a fresh ID, a
NOT_SEEN for a marked one) are counted as "unexpected" and make the command
exit with status 1 after printing the results.

The namespace (default "bench") is created when missing, with --ttl as its
default TTL. For the side-by-side comparison with Redis, PostgreSQL, etcd
and NATS see scripts/bench-peers.sh.`

const benchExample = `  dedupnode dev &    # prints "addrs: a,b,c"
  dedupnode bench --addr 127.0.0.1:7070 --workload mark-new --duration 10s
  dedupnode bench --addr 127.0.0.1:7070 --workload check-miss --batch 1 --concurrency 50 --output json
  dedupnode bench --addr 127.0.0.1:7070 --workload mark-mixed --duplicate-ratio 0.2 --count 1000000`

// newBenchCmd returns `dedupnode bench`.
func newBenchCmd() *cobra.Command {
	var (
		cfg        bench.Config
		cf         clientFlags // the connection flags every cluster command shares
		output     string
		noProgress bool
		cpuProfile string
		ttl        = 24 * time.Hour
	)
	cmd := &cobra.Command{
		Use:     "bench [--workload] WORKLOAD [flags]",
		Short:   "Measure a cluster's throughput and latency with a synthetic workload",
		Long:    benchLong,
		Example: benchExample,
		Args:    cobra.MaximumNArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := cf.validateConn(cmd); err != nil {
				return err
			}
			if cf.timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			conn, err := cf.connOptions()
			if err != nil {
				return err
			}
			if err := cf.resolve(cmd.Context()); err != nil {
				return err
			}
			cfg.Addrs, cfg.Timeout, cfg.ClientOptions = cf.addrs, cf.timeout, conn
			if len(args) == 1 {
				if cmd.Flags().Changed("workload") && args[0] != cfg.Workload {
					return usagef("workload given twice: %q and --workload %q", args[0], cfg.Workload)
				}
				cfg.Workload = args[0]
			}
			if output != "text" && output != "json" {
				return usagef("--output %q: want text or json", output)
			}
			if cmd.Flags().Changed("duration") && cmd.Flags().Changed("count") {
				return usagef("give --duration or --count, not both")
			}
			if cfg.Count > 0 {
				cfg.Duration = 0
			}
			for _, c := range []struct {
				name string
				v    int
			}{{"concurrency", cfg.Concurrency}, {"batch", cfg.Batch}, {"id-size", cfg.IDSize}} {
				if c.v < 1 {
					return usagef("--%s %d: must be at least 1", c.name, c.v)
				}
			}
			switch {
			case cfg.Count < 0:
				return usagef("--count %d: must not be negative", cfg.Count)
			case cfg.Duration < 0:
				return usagef("--duration %v: must not be negative", cfg.Duration)
			case cfg.Warmup < 0:
				return usagef("--warmup %v: must not be negative", cfg.Warmup)
			}
			cfg.TTL = ttl
			if !noProgress {
				cfg.Progress = cmd.ErrOrStderr()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stopProfile, err := startCPUProfile(cpuProfile)
			if err != nil {
				return err
			}
			res, err := bench.Run(ctx, cfg)
			if perr := stopProfile(); perr != nil && err == nil {
				err = perr
			}
			if err != nil {
				var ce *bench.ConfigError
				if errors.As(err, &ce) {
					return usagef("%v", err)
				}
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				err = res.WriteJSON(out)
			} else {
				err = res.WriteTable(out)
			}
			if err != nil {
				return err
			}
			switch {
			case res.IDs == 0 && res.Errors > 0:
				return fmt.Errorf("every call failed (%d errors); %s", res.Errors, res.Note)
			case res.IDs == 0:
				return fmt.Errorf("no call completed in the measured window")
			case res.Unexpected > 0:
				return fmt.Errorf("%d answers contradict the %s workload", res.Unexpected, res.Workload)
			}
			return nil
		}),
	}
	cf.registerConn(cmd)
	// No retries here: a request is one call.
	cf.registerTimeout(cmd, 5*time.Second)
	fs := cmd.Flags()
	fs.StringVarP(&cfg.Namespace, "namespace", "n", "bench", "`NAMESPACE` to write into (created when missing, see --create-namespace)")
	fs.StringVarP(&cfg.Workload, "workload", "w", bench.MarkNew, "`WORKLOAD`: "+strings.Join(bench.Workloads, ", "))
	fs.IntVarP(&cfg.Concurrency, "concurrency", "c", 50, "concurrent callers (`N`), each with one call in flight")
	fs.IntVarP(&cfg.Batch, "batch", "b", 16, "IDs per call (`N`)")
	fs.IntVar(&cfg.IDSize, "id-size", 16, "bytes per random ID (`N`)")
	fs.DurationVarP(&cfg.Duration, "duration", "d", 10*time.Second, "measure for this `DURATION`")
	fs.Int64Var(&cfg.Count, "count", 0, "measure until `N` IDs were sent (instead of --duration)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "run this `DURATION` of load before measuring")
	fs.DurationVar(&cfg.MaxTime, "max-time", 0, "hard limit (`DURATION`) on the whole run (default: warm-up + duration + 30s, or 10m with --count)")
	fs.Float64Var(&cfg.DuplicateRatio, "duplicate-ratio", 0.5, "mark-mixed: share (`0..1`) of IDs that repeat earlier ones")
	fs.StringVar(&cfg.Consistency, "consistency", "linearizable", "check-*: `CONSISTENCY` linearizable, stale or bounded (with --max-staleness)")
	fs.DurationVar(&cfg.MaxStaleness, "max-staleness", 0, "check-* with --consistency bounded: the largest staleness (`DURATION`, e.g. 5s) a node may answer with from its own state")
	fs.Var(durationValue{&ttl}, "ttl", "TTL of marked IDs (`DURATION`, e.g. 1d, 90m)")
	fs.IntVar(&cfg.Conns, "conns", 1, "gRPC connections per address (`N`)")
	fs.IntVar(&cfg.Preload, "preload", 100000, "check-hit: IDs marked before measuring (`N`)")
	fs.StringVar(&cfg.Target, "target", "leader", "`TARGET` of writes and linearizable checks: leader (as the client package does) or any (any of --addr; stale checks always go to any)")
	fs.BoolVar(&cfg.CreateNamespace, "create-namespace", true, "create --namespace when the cluster does not know it")
	fs.StringVarP(&output, "output", "o", "text", "output `FORMAT`: text (a table) or json (one object)")
	fs.BoolVar(&cfg.Coalesce, "coalesce", false, "send every ID as its own call through the Go client's Batcher, which merges concurrent calls into few RPCs (mark-new, mark-mixed, check-hit, check-miss)")
	fs.StringVar(&cfg.Transport, "transport", "unary", "`TRANSPORT` of the calls: unary (one RPC each) or stream (messages on one Dedup.Stream per connection, shared by the callers; with --coalesce, the Batcher's)")
	fs.IntVar(&cfg.Window, "window", 0, "stream transport: calls in flight per stream (`N`, 0: the client's default of 64)")
	fs.BoolVar(&noProgress, "no-progress", false, "no progress bar on stderr")
	fs.StringVar(&cpuProfile, "cpu-profile", "", "write a Go CPU profile of the load generator to `FILE` (read with 'go tool pprof FILE')")
	return cmd
}
