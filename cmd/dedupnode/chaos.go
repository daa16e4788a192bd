package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dedupnode/dedupnode/chaos"
	"github.com/dedupnode/dedupnode/chaos/check"
	"github.com/dedupnode/dedupnode/chaos/history"
)

const chaosLong = `Chaos starts a dedupnode cluster, runs many consumers against it while
injecting faults, heals everything, waits for the cluster to catch up, reads
every ID back from every node and checks the recorded history against the
guarantees of dedupnode (README, section Guarantees, numbers in parentheses):

  at_most_one_winner   (1) one NEW/ACQUIRED per ID and lifetime (a retry with
                       the same request token is the same winner)
  no_lost_writes       (2) every acknowledged mark/commit reads SEEN on every
                       node
  linearizable_check   (3) per-ID linearizability of marks and checks
                       (porcupine)
  no_stale_read        (3) no linearizable check answers not_seen after an
                       acknowledged write completed
  retry_first_answer   (7) a retried write gets its first answer back
  replicas_identical   (5) every node ends with the same record for every ID
  state_digests        (5) every node reports the same state digest at the
                       same applied index (as 'dedupnode digest' checks)
  converged            every node caught up, answered and reported its
                       digest

Modes:
  process  N local 'dedupnode serve' processes (this binary) on loopback, with
           a fault-injecting proxy on every Raft link (fast; what CI runs)
  docker   the docker-compose cluster (image from scripts/cluster-up.sh),
           recreated with empty volumes as project dedupnode-chaos; faults
           through the Docker engine, partitions with iptables inside the
           containers' network namespaces (needs root and nsenter)

Faults (--faults, default all the mode supports): kill-leader, kill-random,
restart, pause-leader, pause-random, isolate-leader, split, one-way,
asymmetric, slow, disconnect (docker), kill-all; with --regions 2 or more
also region-cut, region-one-way, region-delay, kill-leader-region.

Across regions (process mode): --replicas N adds N read replicas (r1..rN)
that join with --read-replica; --regions K groups voter n_i and replica
r_i into region ((i-1) mod K)+1; --wan-delay D adds D one way on Raft links
between regions. A third of the linearizable checks become bounded ones
(--max-staleness, default 2s). During every region-cut and region-one-way
the runner marks a fresh ID elsewhere, waits past the max staleness and
asks each replica of the cut region a stale, a bounded and a linearizable
check (--probe-deadline each): stale must answer, the others must answer
seen or fail within the deadline; 'cut-off replicas' reports the counts.

It prints a table (or --output json with operations, faults and violations)
and exits 1 when an invariant was violated, after writing the smallest
offending history to --violation-file and the whole history next to it.
'dedupnode chaos check FILE' checks a written history again.`

const chaosExample = `  dedupnode chaos --mode process --duration 60s
  dedupnode chaos --mode process --duration 2m --nodes 5 --clients 16 --output json
  scripts/cluster-up.sh --build-only && dedupnode chaos --mode docker --duration 10m
  dedupnode chaos check chaos-violation-20260101-120000.json`

// newChaosCmd is `dedupnode chaos`: the chaos runner and history checker.
func newChaosCmd() *cobra.Command {
	var (
		cfg         chaos.Config
		output      string
		faults      []string
		hold, rest  time.Duration
		logLevel    string
		dockerDir   string
		dockerImage string
		dockerProj  string
		keep        bool
	)
	cmd := &cobra.Command{
		Use:     "chaos [--mode process|docker] [--duration D] [flags]",
		Short:   "Run a cluster under faults and check that no guarantee broke",
		Long:    chaosLong,
		Example: chaosExample,
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return usagef("--output %q: want text or json", output)
			}
			if cfg.Mode != chaos.ModeProcess && cfg.Mode != chaos.ModeDocker {
				return usagef("--mode %q: want process or docker", cfg.Mode)
			}
			if cfg.Nodes < 1 || (cfg.Mode == chaos.ModeDocker && cfg.Nodes != 3 && cfg.Nodes != 5) {
				return usagef("--nodes %d: want at least 1 (process) or 3 or 5 (docker)", cfg.Nodes)
			}
			if err := chaosRegionFlagsValid(&cfg); err != nil {
				return err
			}
			if cfg.Duration <= 0 || cfg.Workload.Clients < 1 {
				return usagef("--duration and --clients must be positive")
			}
			for _, f := range faults {
				if !knownFault(f) {
					return usagef("--faults: unknown fault %q; known: %s", f, strings.Join(chaos.AllFaults, ", "))
				}
			}
			cfg.Faults = faults
			if hold > 0 {
				cfg.Hold = [2]time.Duration{hold / 2, hold * 3 / 2}
			}
			if rest > 0 {
				cfg.Rest = [2]time.Duration{rest / 2, rest * 3 / 2}
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(logLevel)); err != nil {
				return usagef("--log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lv}))
			cfg.KeepDir, cfg.Docker.Keep = keep, keep
			cfg.Docker.Dir, cfg.Docker.Image, cfg.Docker.Project = dockerDir, dockerImage, dockerProj
			if cfg.Mode == chaos.ModeProcess && cfg.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the dedupnode binary to run: %w", err)
				}
				cfg.Binary = exe
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := chaos.Run(ctx, cfg)
			if err != nil {
				return err
			}
			if output == "json" {
				err = res.WriteJSON(cmd.OutOrStdout())
			} else {
				err = res.WriteTable(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if res.Failed() {
				if res.Report.OK() && res.Probes != nil {
					return &opError{err: fmt.Errorf("cut-off replicas misbehaved: %s", res.Probes), hint: "see the WARN lines above"}
				}
				return violationsError(res.Report, res.ViolationFile)
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.Mode, "mode", chaos.ModeProcess, "`MODE`: process (local processes) or docker (the compose cluster)")
	cfg.Duration = time.Minute
	fs.Var(durationValue{&cfg.Duration}, "duration", "how long (`DURATION`) the workload runs under faults (healing, catching up and checking come on top)")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "cluster size `N` (docker: 3 or 5)")
	registerChaosRegionFlags(fs, &cfg)
	fs.IntVar(&cfg.Workload.Clients, "clients", 8, "concurrent clients `N`")
	fs.StringVarP(&output, "output", "o", "text", "output `FORMAT`: text (table) or json")
	fs.StringSliceVar(&faults, "faults", nil, "fault `KINDS` to draw from, comma-separated (default: all the mode supports)")
	fs.BoolVar(&cfg.NoFaults, "no-faults", false, "run the workload without faults (a baseline)")
	fs.DurationVar(&hold, "hold", 0, "mean `DURATION` a fault lasts (default 5.5s: 3-8s)")
	fs.DurationVar(&rest, "rest", 0, "mean quiet `DURATION` between faults (default 3.5s: 2-5s)")
	fs.DurationVar(&cfg.Workload.Lease, "lease", 2*time.Second, "lease `DURATION` of the workload's claims (short, so that leases expire during the run)")
	fs.Int64Var(&cfg.Seed, "seed", 0, "random `SEED` for faults and workload (default: the time)")
	fs.StringVar(&cfg.HistoryFile, "history", "", "write the whole history to `FILE` (always written, next to the violation file, on a violation)")
	fs.StringVar(&cfg.ViolationFile, "violation-file", "", "write the smallest offending history to `FILE` (default chaos-violation-<time>.json)")
	fs.StringVar(&cfg.Dir, "dir", "", "process mode: `DIR` for the nodes' data and logs (default a temporary folder, removed afterwards)")
	fs.BoolVar(&keep, "keep", false, "keep the nodes' data and logs (process) or leave the cluster running (docker)")
	fs.StringVar(&cfg.Binary, "serve-binary", "", "process mode: run `PATH` serve instead of this binary (e.g. a test build)")
	fs.StringArrayVar(&cfg.ServeArgs, "serve-arg", nil, "process mode: extra `FLAG` for every 'serve' (repeat the option for more)")
	fs.StringVar(&dockerDir, "compose-dir", ".", "docker mode: `DIR` holding docker-compose.yml and docker-compose.5nodes.yml")
	fs.StringVar(&dockerImage, "docker-image", "dedupnode:local", "docker mode: `IMAGE` to run")
	fs.StringVar(&dockerProj, "docker-project", "dedupnode-chaos", "docker mode: compose `PROJECT` name (recreated with empty volumes)")
	fs.StringVar(&logLevel, "log-level", "info", "runner log `LEVEL` on stderr: debug, info, warn or error")
	cmd.AddCommand(newChaosCheckCmd())
	return cmd
}

func knownFault(f string) bool {
	for _, k := range chaos.AllFaults {
		if k == f {
			return true
		}
	}
	return false
}

// violationsError is the error of a run or check that found violations
// (exit code 1).
func violationsError(rep *check.Report, file string) error {
	msg := fmt.Sprintf("%d invariant violations (%s)", rep.Total(), rep.Summary())
	if file != "" {
		msg += "; smallest offending history in " + file
	}
	return &opError{err: fmt.Errorf("%s", msg), hint: "see the VIOLATION lines above"}
}

func newChaosCheckCmd() *cobra.Command {
	var output, violationFile string
	cmd := &cobra.Command{
		Use:   "check HISTORY.json",
		Short: "Check a history written by a chaos run again",
		Long: `Check reads a history written by 'dedupnode chaos' (--history, or the files
written on a violation) and checks it against the guarantees again (README,
section Guarantees). It exits 1 when a violation is found, after writing the
smallest offending history to --violation-file when given.`,
		Example: `  dedupnode chaos --duration 30s --history run.json && dedupnode chaos check run.json
  dedupnode chaos check .chaos/violation.json            # the smallest offending history of a failed CI run
  dedupnode chaos check --output json chaos-violation-20260101-120000.json`,
		Args: cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return usagef("--output %q: want text or json", output)
			}
			h, err := history.ReadFile(args[0])
			if err != nil {
				return err
			}
			rep := check.Run(h, check.Options{})
			res := &chaos.Result{Mode: h.Meta.Mode, Nodes: len(h.Meta.Nodes), Clients: h.Meta.Clients, Seed: h.Meta.Seed,
				Cluster: "history " + args[0], Report: rep, History: h}
			if h.Meta.End > h.Meta.Start {
				res.WorkloadSeconds = time.Duration(h.Meta.End - h.Meta.Start).Seconds()
			}
			if !rep.OK() && violationFile != "" {
				if sub := check.Smallest(h, rep); sub != nil {
					if err := sub.WriteFile(violationFile); err != nil {
						return err
					}
					res.ViolationFile = violationFile
				}
			}
			if output == "json" {
				err = res.WriteJSON(cmd.OutOrStdout())
			} else {
				err = rep.WriteTable(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return violationsError(rep, res.ViolationFile)
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output `FORMAT`: text (table) or json")
	cmd.Flags().StringVar(&violationFile, "violation-file", "", "write the smallest offending history to `FILE`")
	return cmd
}
