package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/atomicfile"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/server"
	"github.com/spf13/cobra"
)

// Dev cluster port layout: node i (0-based) serves gRPC on base+i and Raft
// on base+devRaftOffset+i.
const (
	devDefaultBasePort = 7070
	devRaftOffset      = 100
	devMaxNodes        = 9
	devPortsFile       = "dev-ports.json"
	// devStartWithin bounds the nodes' start and the first election.
	devStartWithin = 60 * time.Second
)

type devFlags struct {
	nodes      int
	dataDir    string
	basePort   int
	maxBatch   int
	logLevel   string
	logFormat  string
	adminAddr  string
	cpuProfile string
	logStore   string
	// basePortSet: --base-port (or DEDUPNODE_BASE_PORT) was given.
	basePortSet bool
}

const devLong = `Dev runs a local N-node cluster inside this one process, on loopback, with
namespaces created by the first write to them (a check of one that does
not exist is an error, as on 'serve'), and prints the nodes' addresses: one
line starts with "addrs: " followed by the comma-separated gRPC addresses,
ready for --addr. Ctrl-C, SIGTERM or SIGHUP stops every node cleanly (and
so does losing the reader of its output), deleting a temporary data dir.

Ports: node i (counting from 0) serves gRPC on BASE+i and Raft on
BASE+100+i, so the default cluster is 127.0.0.1:7070-7072 (gRPC) and
127.0.0.1:7170-7172 (Raft). --base-port 0 takes free ports from the OS.
The ports are kept in DIR/dev-ports.json: a cluster's nodes know each other
by them, so a later run with the same --data-dir reuses them when
--base-port is 0 or not given, and refuses another --base-port.

Without --data-dir the data lives in a fresh temporary folder, deleted on
exit. With --data-dir it is kept and a later run with the same folder starts
from it (node i in DIR/n<i+1>).

--admin-addr HOST:PORT serves each node's admin HTTP listener (Prometheus
/metrics, the status page at /, /healthz) as 'serve --admin-addr' does: node
i on PORT+i, or on free ports with PORT 0; the addresses are printed.

Dev has no TLS or token flags: it is a loopback playground in one process,
with namespaces created by their first write. To try TLS (--tls-cert,
--tls-key, --tls-ca, --tls-client-ca) or access tokens (--auth-file), run
'serve' nodes: docs/OPERATIONS.md sets up a TLS cluster in five commands.`

func newDevCmd(e *env) *cobra.Command {
	f := &devFlags{}
	cmd := &cobra.Command{
		Use:   "dev [--nodes 3] [--data-dir DIR] [--base-port 7070] [--admin-addr HOST:PORT]",
		Short: "Run a local N-node cluster in one process (for trying dedupnode out and for tests)",
		Long:  devLong,
		Example: strings.ReplaceAll(`  dedupnode dev
  dedupnode dev --nodes 5 --base-port 8070
  dedupnode dev --data-dir /tmp/dd --base-port 0`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags(), "nodes", "data-dir", "base-port", "log-level", "log-format", "admin-addr", "raft-log-store"); err != nil {
				return err
			}
			f.basePortSet = cmd.Flags().Changed("base-port")
			return runDev(e, f)
		}),
	}
	fs := cmd.Flags()
	fs.IntVar(&f.nodes, "nodes", 3, fmt.Sprintf("number of nodes `N`, 1 to %d", devMaxNodes))
	fs.StringVar(&f.dataDir, "data-dir", "", "keep the nodes' data in `DIR` (default: a temporary folder deleted on exit)")
	fs.IntVar(&f.basePort, "base-port", devDefaultBasePort, "gRPC `PORT` of the first node; node i uses PORT+i (gRPC) and PORT+100+i (Raft); 0 = free ports from the OS")
	fs.IntVar(&f.maxBatch, "max-batch", 10000, "most IDs (`N`) accepted in one request")
	fs.StringVar(&f.logLevel, "log-level", "error", "node log `LEVEL` on stderr: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "node log `FORMAT`: text or json")
	fs.StringVar(&f.adminAddr, "admin-addr", "", "admin HTTP listener (/metrics, status page, /healthz) of the first node at `HOST:PORT`; node i uses PORT+i; PORT 0 = free ports; off when empty")
	fs.StringVar(&f.logStore, "raft-log-store", string(cluster.DefaultLogStore), "Raft log `STORE` of every node: wal or boltdb (as serve --raft-log-store; env DEDUPNODE_RAFT_LOG_STORE)")
	fs.StringVar(&f.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the whole cluster process to `FILE` until it stops (read with 'go tool pprof FILE')")
	return cmd
}

// devNode is one node's addresses, with its admin HTTP address this run.
type devNode struct {
	devcluster.Node
	Admin string
}

// devAdminAddrs spreads --admin-addr HOST:PORT over n nodes: PORT+i, or
// port 0 for every node. Nil when the flag is empty.
func devAdminAddrs(flag string, n int) ([]string, error) {
	if flag == "" {
		return nil, nil
	}
	host, portS, err := net.SplitHostPort(flag)
	if err != nil {
		return nil, usagef("--admin-addr %q: want HOST:PORT (%v)", flag, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 0 || port > 65535-n+1 {
		return nil, usagef("--admin-addr %q: want a port from 0 (free ports) to %d", flag, 65535-n+1)
	}
	out := make([]string, n)
	for i := range out {
		p := port
		if p != 0 {
			p += i
		}
		out[i] = net.JoinHostPort(host, strconv.Itoa(p))
	}
	return out, nil
}

func runDev(e *env, f *devFlags) (err error) {
	if f.nodes < 1 || f.nodes > devMaxNodes {
		return usagef("--nodes %d: want 1 to %d", f.nodes, devMaxNodes)
	}
	logStore, perr := cluster.ParseLogStore(f.logStore)
	if perr != nil || f.logStore == "" {
		return usagef("--raft-log-store %q: want wal or boltdb", f.logStore)
	}
	if f.basePort < 0 || f.basePort > 65535-devRaftOffset-devMaxNodes {
		return usagef("--base-port %d: want 0 (any free ports) or 1 to %d", f.basePort, 65535-devRaftOffset-devMaxNodes)
	}
	if f.maxBatch < 1 {
		return usagef("--max-batch must be at least 1")
	}
	adminAddrs, err := devAdminAddrs(f.adminAddr, f.nodes)
	if err != nil {
		return err
	}
	// Stop as on Ctrl-C when the terminal goes away (SIGHUP), or when a
	// write to stdout or stderr finds its reader gone ('dedupnode dev 2>&1
	// | tee log' and a Ctrl-C that stops tee too), rather than die with the
	// temporary data dir left behind. SIGPIPE is ignored for that: Go
	// would end the process at such a write, and a handler (Notify) would
	// also get the SIGPIPEs of the nodes' sockets whose peer went away,
	// which are no reason to stop; the failed write itself says which.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stopSignals := signal.NotifyContext(e.ctx, syscall.SIGHUP)
	defer stopSignals()
	ctx, readerGone := context.WithCancel(ctx)
	defer readerGone()
	stdout, stderr := stopOnEPIPE{e.stdout, readerGone}, stopOnEPIPE{e.stderr, readerGone}
	logger, level, err := newLeveledLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(f.cpuProfile)
	if err != nil {
		return err
	}
	defer func() {
		if perr := stopProfile(); perr != nil && err == nil {
			err = perr
		}
	}()

	dir, temp := f.dataDir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "dedupnode-dev-"); err != nil {
			return &opError{err: err, hint: "check that the temporary folder ($TMPDIR) is writable, or pass --data-dir"}
		}
		temp = true
		defer func() {
			if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
				err = &opError{err: rerr, hint: "delete " + dir + " by hand"}
			}
		}()
	} else if err = os.MkdirAll(dir, 0o755); err != nil {
		return &opError{err: err, hint: "pass a --data-dir you can write to"}
	}

	addrs, reused, err := devLayout(dir, f.nodes, f.basePort, f.basePortSet)
	if err != nil {
		return err
	}
	if reused {
		fmt.Fprintf(stderr, "dedupnode dev: %s was created %s: reusing its ports\n", dir, devCreatedWith(addrs))
	}
	// Every node starts at once: with a static peer list each waits for
	// the others to elect a leader.
	sctx, cancel := context.WithTimeout(ctx, devStartWithin)
	defer cancel()
	c, err := devcluster.Start(sctx, devcluster.Config{
		Nodes:                f.nodes,
		Dir:                  dir,
		Addrs:                addrs,
		Logger:               logger,
		LogStore:             logStore,
		AutoCreateNamespaces: true,
		Tune: func(i int, cfg *server.Config) {
			cfg.MaxBatch, cfg.Version = f.maxBatch, version
			if adminAddrs != nil {
				cfg.AdminAddr = adminAddrs[i]
			}
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return devStartError(err, f, dir)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(cctx); err != nil {
			logger.Warn("dev: node shutdown", "err", err)
		}
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "dedupnode dev: stopped")
		}
	}()
	// Keep the ports for the next run (devLayout): the nodes' Raft
	// configuration records them.
	if err := saveDevPorts(dir, c.Nodes()); err != nil {
		return err
	}
	nodes := make([]devNode, c.Size())
	for i, n := range c.Nodes() {
		nodes[i] = devNode{Node: n, Admin: c.Server(i).AdminAddr()}
	}
	leader := c.NodeID(c.Leader())
	printDev(stdout, e.progName, dir, temp, nodes, leader)

	<-ctx.Done()
	fmt.Fprintln(stderr, "dedupnode dev: stopping")
	// Every node stops at once: their complaints about each other going
	// away are expected, so only errors at debug level get through.
	if level.Level() > slog.LevelDebug {
		level.Set(slog.LevelError + 4)
	}
	return nil
}

// stopOnEPIPE is w, whose reader going away (a write failing with EPIPE)
// calls stop.
type stopOnEPIPE struct {
	w    io.Writer
	stop func()
}

func (p stopOnEPIPE) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		p.stop()
	}
	return n, err
}

// devStartError explains why the cluster did not start: one line (the
// first node's error, the others are usually alike) and a hint.
func devStartError(err error, f *devFlags, dir string) error {
	var se *devcluster.StartError
	if !errors.As(err, &se) {
		return &opError{err: fmt.Errorf("dev cluster elected no leader within %v: %w", devStartWithin, err), hint: "re-run with --log-level info to see why"}
	}
	if moved := devMovedError(se, dir); moved != nil {
		return moved
	}
	first, failed := se.First()
	err = fmt.Errorf("start dev cluster: %w", first)
	if failed > 1 {
		err = fmt.Errorf("%w (%d of %d nodes failed to start)", err, failed, len(se.Errs))
	}
	hint := "another process may hold these ports: pick others with --base-port P, or --base-port 0 for any free ones"
	switch {
	case errors.Is(first, syscall.EADDRINUSE):
	case f.dataDir != "":
		hint = "is another 'dedupnode dev' using --data-dir " + f.dataDir + "? stop it or pick another --data-dir; else re-run with --log-level info to see why"
	default:
		hint = "re-run with --log-level info to see why"
	}
	return &opError{err: err, hint: hint}
}

// devLayout returns the nodes' addresses: those of an earlier run kept in
// dir/dev-ports.json, else fixed from basePort; nil when the OS is to pick
// free ports. reused reports that the kept ports differ from what the
// flags alone would give.
//
// A dev cluster cannot move: its nodes' Raft configuration records the
// ports they had, and nodes on other ports would dial the old ones forever
// (or reach whatever listens there now). With kept ports, --base-port 0 or
// none reuses them, as restarting a playground with the same --data-dir
// should; a --base-port naming other ports is refused, since silently
// ignoring an explicit flag would surprise as much as hanging did.
func devLayout(dir string, n, basePort int, basePortSet bool) (nodes []devcluster.Node, reused bool, err error) {
	path := filepath.Join(dir, devPortsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return devFixedLayout(n, basePort), false, nil
	}
	var saved []devcluster.Node
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, false, &opError{err: fmt.Errorf("read %s: %w", path, err), hint: "delete it, or use a fresh --data-dir"}
	}
	if len(saved) != n {
		return nil, false, usagef("%s holds a %d-node cluster: pass --nodes %d, or use a fresh --data-dir", dir, len(saved), len(saved))
	}
	base := devBaseOf(saved)
	switch {
	case basePortSet && basePort != 0 && basePort != base:
		rerun := fmt.Sprintf("--base-port %d", base)
		if base == 0 {
			rerun = "--base-port 0"
		}
		return nil, false, usagef("%s was created %s; rerun with %s (or without --base-port), or use a new --data-dir", dir, devCreatedWith(saved), rerun)
	case basePort == base:
		return saved, false, nil
	}
	return saved, true, nil
}

// devFixedLayout is node i on gRPC base+i and Raft base+devRaftOffset+i;
// nil for base 0 (free ports from the OS).
func devFixedLayout(n, base int) []devcluster.Node {
	if base == 0 {
		return nil
	}
	nodes := make([]devcluster.Node, n)
	for i := range nodes {
		nodes[i] = devcluster.Node{
			ID:   "n" + strconv.Itoa(i+1),
			GRPC: net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)),
			Raft: net.JoinHostPort("127.0.0.1", strconv.Itoa(base+devRaftOffset+i)),
		}
	}
	return nodes
}

// devBaseOf returns the --base-port that gives exactly these nodes, 0 when
// none does (ports from the OS).
func devBaseOf(nodes []devcluster.Node) int {
	if len(nodes) == 0 {
		return 0
	}
	_, p, err := net.SplitHostPort(nodes[0].GRPC)
	if err != nil {
		return 0
	}
	base, err := strconv.Atoi(p)
	if err != nil || base < 1 || base > 65535-devRaftOffset-devMaxNodes {
		return 0
	}
	want := devFixedLayout(len(nodes), base)
	for i := range nodes {
		if nodes[i] != want[i] {
			return 0
		}
	}
	return base
}

// devCreatedWith describes a kept layout: "with --base-port 7070 (gRPC
// 127.0.0.1:7070-7072, Raft 127.0.0.1:7170-7172)", or "with --base-port 0
// (gRPC ..., Raft ...)" listing the ports the OS gave.
func devCreatedWith(nodes []devcluster.Node) string {
	base := devBaseOf(nodes)
	if base != 0 {
		last := len(nodes) - 1
		return fmt.Sprintf("with --base-port %d (gRPC 127.0.0.1:%d-%d, Raft 127.0.0.1:%d-%d)",
			base, base, base+last, base+devRaftOffset, base+devRaftOffset+last)
	}
	grpc, raft := make([]string, len(nodes)), make([]string, len(nodes))
	for i, n := range nodes {
		grpc[i], raft[i] = n.GRPC, n.Raft
	}
	return fmt.Sprintf("with --base-port 0 (gRPC %s, Raft %s)", strings.Join(grpc, " "), strings.Join(raft, " "))
}

// devMovedError explains nodes refused because their data dir's Raft
// configuration records other addresses (a data dir with no
// dev-ports.json: made by an earlier version, or by a first run that did
// not come up): it names the ports recorded and the --base-port that gives
// them, if one does. Nil when no node failed that way.
func devMovedError(se *devcluster.StartError, dir string) error {
	var recorded []string
	var nodes []devcluster.Node
	for i, err := range se.Errs {
		var moved *cluster.RaftAddrChangedError
		if !errors.As(err, &moved) {
			continue
		}
		recorded = append(recorded, fmt.Sprintf("%s's Raft on %s", moved.NodeID, moved.Recorded))
		if len(nodes) == i { // every node so far, in order: may give a base port
			_, p, _ := net.SplitHostPort(moved.Recorded)
			port, _ := strconv.Atoi(p)
			base := port - devRaftOffset - i
			nodes = append(nodes, devcluster.Node{ID: moved.NodeID,
				GRPC: net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)), Raft: moved.Recorded})
		}
	}
	if recorded == nil {
		return nil
	}
	rerun := "the --base-port it was created with"
	if len(nodes) == len(se.Errs) {
		if base := devBaseOf(nodes); base != 0 {
			rerun = fmt.Sprintf("--base-port %d", base)
		}
	}
	return usagef("%s was created with other ports (%s): its nodes know each other by them; rerun with %s, or use a new --data-dir",
		dir, strings.Join(recorded, ", "), rerun)
}

// saveDevPorts keeps the nodes' ports in dir/dev-ports.json (devLayout
// reads them), atomically: a torn file would refuse the next run.
func saveDevPorts(dir string, nodes []devcluster.Node) error {
	b, _ := json.MarshalIndent(nodes, "", "  ")
	if err := atomicfile.Write(filepath.Join(dir, devPortsFile), b, 0o644); err != nil {
		return &opError{err: err, hint: "pass a --data-dir you can write to"}
	}
	return nil
}

func printDev(w io.Writer, prog, dir string, temp bool, nodes []devNode, leader string) {
	kept := "kept"
	if temp {
		kept = "deleted on exit"
	}
	plural := "s"
	if len(nodes) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "dedupnode dev: %d node%s on loopback, data in %s (%s)\n", len(nodes), plural, dir, kept)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.GRPC
		role := ""
		if n.ID == leader {
			role = "  (leader)"
		}
		admin := ""
		if n.Admin != "" {
			admin = "  admin http://" + n.Admin + "/"
		}
		fmt.Fprintf(w, "  %s  grpc %s  raft %s%s%s\n", n.ID, n.GRPC, n.Raft, admin, role)
	}
	all := strings.Join(addrs, ",")
	fmt.Fprintf(w, "addrs: %s\n\n", all)
	fmt.Fprintf(w, "Try it from another terminal:\n")
	fmt.Fprintf(w, "  %s mark   --addr %s order-1 order-2\n", prog, all)
	fmt.Fprintf(w, "  %s mark   --addr %s order-1\n", prog, all)
	fmt.Fprintf(w, "  %s check  --addr %s order-1 order-3\n", prog, all)
	fmt.Fprintf(w, "  %s status --addr %s\n\n", prog, all)
	fmt.Fprintf(w, "Ctrl-C stops the cluster.\n")
}
