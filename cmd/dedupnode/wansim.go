package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/dedupnode/dedupnode/bench"
	"github.com/dedupnode/dedupnode/chaos/netproxy"
	"github.com/dedupnode/dedupnode/client"
)

const wanSimLong = `Wan-sim starts, on loopback, 3 voters in three regions (us, eu, ap) and
(with --replicas) one read replica in each, as 'dedupnode serve' processes
of this binary with --raft-timing wan and --preferred-leader-regions us.
Chaos's fault-injecting proxy adds one-way delays between regions on every
Raft link and on every client connection that crosses regions (a client
in a region reaches another region's nodes through a proxy with that
delay). It then runs the bench workloads from each region (mark-new,
claim-commit, check-miss at each consistency), 50 callers x 16 IDs through
the Go client's Batcher from the farthest region and from the leader's,
forces leadership out of the preferred region and times its return, and
repeats the local reads and the Batcher run with every delay removed (the
one-region figures). It writes a Markdown report with the physical floors
next to the measured latencies and the number of elections.

Not simulated: the gRPC calls between nodes (a follower's read-index
request, a forwarded write) go direct; the bench sends linearizable checks
and writes to the leader through the caller's region proxy instead.`

type wanSim struct {
	dir      string
	bin      string
	net      *netproxy.Net
	delay    map[[2]string]time.Duration
	region   map[string]string // node → region
	grpc     map[string]string // node → real gRPC address
	raft     map[string]string
	proxRaft map[string]string
	via      map[string]map[string]string // region → real gRPC addr → proxied addr
	procs    []*exec.Cmd
	log      io.Writer
}

var wanRegions = []string{"us", "eu", "ap"}

func newWanSimCmd(e *env) *cobra.Command {
	var (
		usEU, usAP, euAP time.Duration
		replicas         bool
		per, healthy     time.Duration
		maxTime          time.Duration
		out              string
		staleness        time.Duration
		keep             bool
	)
	cmd := &cobra.Command{
		Use:   "wan-sim [flags]",
		Short: "Simulate three regions on loopback (delaying proxy) and benchmark them",
		Long:  wanSimLong,
		Example: `  dedupnode wan-sim --replicas --duration 5s --out /tmp/wan.md
  dedupnode wan-sim --replicas --healthy 10m     # a 10-minute healthy run: 0 elections expected`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			for name, d := range map[string]time.Duration{"--us-eu": usEU, "--us-ap": usAP, "--eu-ap": euAP} {
				if d < 0 {
					return usagef("%s %v: want a one-way delay of 0 or more", name, d)
				}
			}
			if per <= 0 || maxTime <= 0 || healthy < 0 || staleness <= 0 {
				return usagef("--duration, --max-time and --max-staleness must be positive, --healthy not negative")
			}
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, maxTime)
			defer cancel()
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			s := &wanSim{bin: bin, log: e.stderr, net: netproxy.New(nil),
				delay:  map[[2]string]time.Duration{{"us", "eu"}: usEU, {"us", "ap"}: usAP, {"eu", "ap"}: euAP},
				region: map[string]string{}, grpc: map[string]string{}, raft: map[string]string{}, proxRaft: map[string]string{},
				via: map[string]map[string]string{}}
			if s.dir, err = os.MkdirTemp("", "dedupnode-wansim-*"); err != nil {
				return err
			}
			defer func() {
				s.stop()
				s.net.Close()
				if !keep {
					os.RemoveAll(s.dir)
				}
			}()
			rep, err := s.run(ctx, replicas, per, healthy, staleness)
			if err != nil {
				return err
			}
			if out == "" {
				_, err = io.WriteString(e.stdout, rep)
				return err
			}
			if err := os.WriteFile(out, []byte(rep), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s\n", out)
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.DurationVar(&usEU, "us-eu", 35*time.Millisecond, "one-way `DELAY` between us and eu")
	fs.DurationVar(&usAP, "us-ap", 100*time.Millisecond, "one-way `DELAY` between us and ap")
	fs.DurationVar(&euAP, "eu-ap", 80*time.Millisecond, "one-way `DELAY` between eu and ap")
	fs.BoolVar(&replicas, "replicas", true, "add one read replica per region")
	fs.DurationVar(&per, "duration", 4*time.Second, "measure each workload for this `DURATION`")
	fs.DurationVar(&healthy, "healthy", 0, "instead of the workloads: keep a light load for this `DURATION` (e.g. 10m) and count elections")
	fs.DurationVar(&maxTime, "max-time", 6*time.Minute, "hard limit (`DURATION`) on the whole run (raise it with --healthy)")
	fs.DurationVar(&staleness, "max-staleness", 5*time.Second, "max staleness (`DURATION`) of the bounded checks")
	fs.StringVar(&out, "out", "", "write the Markdown report to `FILE` (default: stdout)")
	fs.BoolVar(&keep, "keep", false, "keep the data directories and node logs")
	return cmd
}

func (s *wanSim) oneWay(a, b string) time.Duration {
	if a == b {
		return 0
	}
	if d, ok := s.delay[[2]string{a, b}]; ok {
		return d
	}
	return s.delay[[2]string{b, a}]
}

func wanPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *wanSim) start(ctx context.Context, id string, args ...string) error {
	logf, err := os.Create(filepath.Join(s.dir, id+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, append([]string{"serve", "--node-id", id, "--data-dir", filepath.Join(s.dir, id),
		"--raft-addr", s.raft[id], "--grpc-addr", s.grpc[id], "--region", s.region[id], "--raft-timing", "wan",
		"--preferred-leader-regions", "us", "--auto-create-namespaces", "--log-level", "warn"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	s.procs = append(s.procs, cmd)
	return nil
}

func (s *wanSim) stop() {
	for _, p := range s.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.procs {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
}

// rules (re)sets every delay: Raft links between nodes of two regions,
// and the client proxies.
func (s *wanSim) rules() {
	for a, ra := range s.region {
		for b, rb := range s.region {
			if d := s.oneWay(ra, rb); d > 0 {
				s.net.Set(a, b, netproxy.Rule{Delay: d})
			}
		}
	}
	for r, m := range s.via {
		for real := range m {
			for id, addr := range s.grpc {
				if addr == real {
					d := s.oneWay(r, s.region[id])
					s.net.Set(netproxy.Any, id+"@"+r, netproxy.Rule{Delay: d})
					s.net.Set(id+"@"+r, netproxy.Any, netproxy.Rule{Delay: d})
				}
			}
		}
	}
}

// dialFrom routes region r's connections to other regions' nodes through
// their proxies.
func (s *wanSim) dialFrom(r string) []grpc.DialOption {
	m := s.via[r]
	return []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if p, ok := m[addr]; ok {
			addr = p
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})}
}

// status is the view of the node at addr (one attempt, 3 s at most), through
// a client pinned to that node.
func (s *wanSim) status(ctx context.Context, addr string) (client.Status, error) {
	c, err := client.New(ctx, []string{addr}, client.WithPinnedNode(), client.WithTimeout(3*time.Second))
	if err != nil {
		return client.Status{}, err
	}
	defer c.Close()
	return c.StatusOf(ctx, addr)
}

// leader returns the leader's ID and term as n1 sees them once it is ready.
func (s *wanSim) leader(ctx context.Context) (string, uint64) {
	st, err := s.status(ctx, s.grpc["n1"])
	if err != nil || !st.Healthy {
		return "", 0
	}
	return st.LeaderID, st.Term
}

func (s *wanSim) waitFor(ctx context.Context, what string, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wan-sim: waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

type wanRow struct {
	region, workload, target string
	res                      *bench.Result
	err                      error
	floor                    time.Duration
	// quorumFloor, for a linearizable check: floor plus the leader's round
	// trip to its nearest voter, the confirmation a read index needs
	// without leader leases (cluster/DESIGN.md, Read index).
	quorumFloor time.Duration
	// outstanding is the IDs the callers keep in flight (callers × IDs
	// per call): closed-loop callers cannot exceed outstanding / latency.
	outstanding int
}

func (s *wanSim) run(ctx context.Context, replicas bool, per, healthy, staleness time.Duration) (string, error) {
	voters := []string{"n1", "n2", "n3"}
	var peers []string
	for i, id := range voters {
		s.region[id] = wanRegions[i]
	}
	if replicas {
		for i, r := range wanRegions {
			s.region[fmt.Sprintf("r%d", i+1)] = r
		}
	}
	var err error
	for id := range s.region {
		if s.raft[id], err = wanPort(); err != nil {
			return "", err
		}
		if s.grpc[id], err = wanPort(); err != nil {
			return "", err
		}
		if s.proxRaft[id], err = s.net.Add(id, "127.0.0.1:0", s.raft[id]); err != nil {
			return "", err
		}
	}
	for _, r := range wanRegions {
		s.via[r] = map[string]string{}
		for id, nr := range s.region {
			if nr == r {
				continue
			}
			p, err := s.net.Add(id+"@"+r, "127.0.0.1:0", s.grpc[id])
			if err != nil {
				return "", err
			}
			s.via[r][s.grpc[id]] = p
		}
	}
	s.rules()
	for _, id := range voters {
		peers = append(peers, fmt.Sprintf("%s=%s=%s", id, s.proxRaft[id], s.grpc[id]))
	}
	for _, id := range voters {
		if err := s.start(ctx, id, "--peers", strings.Join(peers, ",")); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(s.log, "wan-sim: voters started in %s\n", s.dir)
	if err := s.waitFor(ctx, "a leader in us", func() bool { l, _ := s.leader(ctx); return l == "n1" }); err != nil {
		return "", err
	}
	if replicas {
		for i := range wanRegions {
			id := fmt.Sprintf("r%d", i+1)
			if err := s.start(ctx, id, "--join", s.grpc[voters[i]], "--read-replica", "--raft-advertise", s.proxRaft[id]); err != nil {
				return "", err
			}
		}
		if err := s.waitFor(ctx, "every replica caught up", func() bool {
			for i := range wanRegions {
				st, err := s.status(ctx, s.grpc[fmt.Sprintf("r%d", i+1)])
				if err != nil || !st.Healthy || !st.ReadReplica {
					return false
				}
			}
			return true
		}); err != nil {
			return "", err
		}
	}
	local := func(r string) string { // the node reads of region r go to
		for id, nr := range s.region {
			if nr == r && strings.HasPrefix(id, "r") {
				return s.grpc[id]
			}
		}
		for id, nr := range s.region {
			if nr == r {
				return s.grpc[id]
			}
		}
		return ""
	}
	_, term0 := s.leader(ctx)
	start := time.Now()
	var rows []wanRow
	rtt := func(a, b string) time.Duration { return 2 * s.oneWay(a, b) }
	nearest := min(rtt("us", "eu"), rtt("us", "ap"))
	callers, batch := 50, 16
	runOne := func(r, workload, cons string, coalesce bool, addrs []string, target string, floor time.Duration) *wanRow {
		cfg := bench.Config{Addrs: addrs, Namespace: "wan", Workload: workload, Concurrency: callers, Batch: batch, IDSize: 16,
			Duration: per, Warmup: time.Second, Consistency: cons, MaxStaleness: staleness, TTL: time.Hour, Timeout: 10 * time.Second,
			Conns: 1, Target: target, CreateNamespace: true, Coalesce: coalesce, Transport: "unary", DialOptions: s.dialFrom(r)}
		if coalesce {
			cfg.Transport = "stream"
		}
		if cons != "bounded" {
			cfg.MaxStaleness = 0
		}
		res, err := bench.Run(ctx, cfg)
		name := workload
		if cons != "" {
			name += " " + cons
		}
		switch {
		case coalesce:
			name += fmt.Sprintf(" (Batcher, %d callers x %d single-ID calls)", callers, batch)
		case callers != 50 || batch != 16:
			name += fmt.Sprintf(" (%d caller x %d ID: latency)", callers, batch)
		}
		fmt.Fprintf(s.log, "wan-sim: %s %s done\n", r, name)
		rows = append(rows, wanRow{region: r, workload: name, target: target, res: res, err: err, floor: floor, outstanding: callers * batch})
		return &rows[len(rows)-1]
	}
	if healthy > 0 {
		cfg := bench.Config{Addrs: []string{s.grpc["n1"]}, Namespace: "wan", Workload: bench.MarkNew, Concurrency: 4, Batch: 16, IDSize: 16,
			Duration: healthy, TTL: time.Hour, Timeout: 10 * time.Second, Conns: 1, Target: "leader", CreateNamespace: true, DialOptions: s.dialFrom("ap")}
		res, err := bench.Run(ctx, cfg)
		rows = append(rows, wanRow{region: "ap", workload: "mark-new, 4 callers (healthy run)", target: "leader", res: res, err: err})
	} else {
		// A linearizable check needs the leader confirmed by a voter
		// majority; with read replicas that is a committed entry, without
		// them a heartbeat round: the leader's round trip to its nearest
		// voter either way.
		linear := func(r string) *wanRow {
			row := runOne(r, bench.CheckMiss, "linearizable", false, []string{local(r)}, "leader", rtt(r, "us"))
			row.quorumFloor = rtt(r, "us") + nearest
			return row
		}
		for _, r := range wanRegions {
			toLeader := rtt(r, "us")
			runOne(r, bench.MarkNew, "", false, []string{local(r)}, "leader", toLeader+nearest)
			runOne(r, bench.ClaimCommit, "", false, []string{local(r)}, "leader", toLeader+nearest)
			linear(r)
			runOne(r, bench.CheckMiss, "bounded", false, []string{local(r)}, "any", 0)
			runOne(r, bench.CheckMiss, "stale", false, []string{local(r)}, "any", 0)
		}
		// Latency without queueing: one caller, one ID per call.
		callers, batch = 1, 1
		for _, r := range wanRegions {
			runOne(r, bench.MarkNew, "", false, []string{local(r)}, "leader", rtt(r, "us")+nearest)
			linear(r)
		}
		callers, batch = 50, 16
		runOne("ap", bench.MarkNew, "", true, []string{local("ap")}, "leader", rtt("ap", "us")+nearest)
		runOne("us", bench.MarkNew, "", true, []string{local("us")}, "leader", nearest)
	}
	elapsed := time.Since(start)
	_, term1 := s.leader(ctx)
	elections := int64(term1) - int64(term0)

	// Leadership forced out of the preferred region, timed back.
	var back time.Duration
	var backErr error
	if healthy == 0 {
		// One attempt, sent to n1 (the leader, in the preferred region).
		c, err := client.New(ctx, []string{s.grpc["n1"]}, client.WithPinnedNode(), client.WithRetry(1, 0, 0), client.WithTimeout(20*time.Second))
		if err == nil {
			_, backErr = c.TransferLeadership(ctx, "n3")
			c.Close()
			t0 := time.Now()
			if backErr == nil {
				bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				backErr = s.waitFor(bctx, "leadership back in us", func() bool {
					st, err := s.status(ctx, s.grpc["n3"])
					return err == nil && st.LeaderID == "n1" && time.Since(t0) > time.Second
				})
				cancel()
				back = time.Since(t0)
			}
		} else {
			backErr = err
		}
		// One region: every delay removed.
		s.net.Heal()
		runOne("ap, no delays", bench.CheckMiss, "bounded", false, []string{local("ap")}, "any", 0)
		runOne("ap, no delays", bench.CheckMiss, "stale", false, []string{local("ap")}, "any", 0)
		runOne("us, no delays", bench.MarkNew, "", true, []string{local("us")}, "leader", 0)
	}
	return s.report(rows, elections, elapsed, back, backErr, replicas, per, healthy, staleness), nil
}

func (s *wanSim) report(rows []wanRow, elections int64, elapsed, back time.Duration, backErr error, replicas bool, per, healthy, staleness time.Duration) string {
	var b strings.Builder
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "# WAN simulation, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Command: `dedupnode wan-sim --replicas=%v --duration %v --max-staleness %v", replicas, per, staleness)
	if healthy > 0 {
		fmt.Fprintf(&b, " --healthy %v", healthy)
	}
	fmt.Fprintf(&b, " --us-eu %v --us-ap %v --eu-ap %v`  \n", s.oneWay("us", "eu"), s.oneWay("us", "ap"), s.oneWay("eu", "ap"))
	fmt.Fprintf(&b, "Machine: 2 shared cores, every process on loopback; load average at the end: %s  \n", strings.TrimSpace(string(load)))
	fmt.Fprintf(&b, "Layout: voters n1 (us), n2 (eu), n3 (ap)")
	if replicas {
		b.WriteString(", read replicas r1 (us), r2 (eu), r3 (ap)")
	}
	b.WriteString("; `--raft-timing wan`, `--preferred-leader-regions us` (hold 10 s). One-way delays on every Raft link between regions and on every client connection to another region's node (chaos's netproxy); node-to-node gRPC (read index from a follower, forwarded writes) is not delayed, so the bench sends writes and linearizable checks to the leader itself, through the caller's region proxy. Each workload: 50 callers × 16 IDs per call, 1 s warm-up, then measured.\n\n")
	b.WriteString("| from | workload | sent to | IDs/s | p50 ms | p99 ms | floor p50 ms | p50 / floor | quorum floor ms | p50 / quorum floor | errors |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	ratioTo := func(p50 float64, d time.Duration) (string, string) {
		if d <= 0 {
			return "-", "-"
		}
		return fmt.Sprintf("%.0f", ms(d)), fmt.Sprintf("%.2f", p50/ms(d))
	}
	var oneRegion float64
	for _, r := range rows {
		if r.region == "us, no delays" && r.res != nil {
			oneRegion = r.res.IDsPerSec
		}
	}
	var bounds []string
	for _, r := range rows {
		if r.err != nil || r.res == nil {
			fmt.Fprintf(&b, "| %s | %s | %s | - | - | - | - | - | - | - | %v |\n", r.region, r.workload, r.target, r.err)
			continue
		}
		floor, ratio := ratioTo(r.res.P50Ms, r.floor)
		qfloor, qratio := ratioTo(r.res.P50Ms, r.quorumFloor)
		target := map[string]string{"leader": "leader", "any": "local node"}[r.target]
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %.1f | %.1f | %s | %s | %s | %s | %d |\n", r.region, r.workload, target, r.res.IDsPerSec, r.res.P50Ms, r.res.P99Ms, floor, ratio, qfloor, qratio, r.res.Errors)
		if strings.Contains(r.workload, "Batcher") && r.floor > 0 && oneRegion > 0 {
			bound := float64(r.outstanding) / r.floor.Seconds()
			bounds = append(bounds, fmt.Sprintf("- %s, %s: %.0f IDs/s = %.0f%% of the one-region %.0f. %d IDs outstanding at a %.0f ms floor allow at most %.0f IDs/s (%d / %.3f s) = %.0f%% of the one-region figure, whatever the servers do.",
				r.region, r.workload, r.res.IDsPerSec, 100*r.res.IDsPerSec/oneRegion, oneRegion, r.outstanding, ms(r.floor), bound, r.outstanding, r.floor.Seconds(), 100*bound/oneRegion))
		}
	}
	if len(bounds) > 0 {
		b.WriteString("\nClosed-loop callers (each waits for its answer before sending the next ID) are bounded by Little's law, throughput ≤ IDs outstanding / latency:\n\n" + strings.Join(bounds, "\n") + "\n")
	}
	fmt.Fprintf(&b, "\nFloors: a linearizable check sent to the leader, one round trip to the leader (\"floor\"); a write, that plus the leader's round trip to its nearest voter (us–eu, %v). The quorum floor of a linearizable check adds the same %v: without leader leases the leader must have a voter majority confirm its term after reading the commit index (a committed entry when the cluster has read replicas, a heartbeat round otherwise), so that floor is the least a linearizable check can cost here.\n\n", 2*s.oneWay("us", "eu"), 2*s.oneWay("us", "eu"))
	fmt.Fprintf(&b, "Elections (Raft term changes seen by n1) during the %v of workloads: **%d**.\n\n", elapsed.Round(time.Second), elections)
	if healthy == 0 {
		if backErr != nil {
			fmt.Fprintf(&b, "Leadership forced from n1 (us) to n3 (ap): did not come back: %v.\n", backErr)
		} else {
			fmt.Fprintf(&b, "Leadership forced from n1 (us) to n3 (ap) with `Admin.TransferLeadership`: back on n1 (preferred region us) after **%.1f s** (hold 10 s, bar 30 s).\n", back.Seconds())
		}
	}
	return b.String()
}
