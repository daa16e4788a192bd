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
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
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
}

const devLong = `Dev runs a local N-node cluster inside this one process, on loopback, with
namespaces created on first use, and prints the nodes' addresses: one line
starts with "addrs: " followed by the comma-separated gRPC addresses, ready
for --addr. Ctrl-C stops every node cleanly.

Ports: node i (counting from 0) serves gRPC on BASE+i and Raft on
BASE+100+i, so the default cluster is 127.0.0.1:7070-7072 (gRPC) and
127.0.0.1:7170-7172 (Raft). --base-port 0 takes free ports from the OS (kept
in DIR/dev-ports.json, so a restart with the same --data-dir reuses them).

Without --data-dir the data lives in a fresh temporary folder, deleted on
exit. With --data-dir it is kept and a later run with the same folder starts
from it (node i in DIR/n<i+1>).

--admin-addr HOST:PORT serves each node's admin HTTP listener (Prometheus
/metrics, the status page at /, /healthz) as 'serve --admin-addr' does: node
i on PORT+i, or on free ports with PORT 0; the addresses are printed.

Dev has no TLS or token flags: it is a loopback playground in one process,
with namespaces created on first use. To try TLS (--tls-cert, --tls-key,
--tls-ca, --tls-client-ca) or access tokens (--auth-file), run 'serve'
nodes: docs/OPERATIONS.md sets up a TLS cluster in five commands.`

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
	logger, level, err := newLeveledLogger(e.stderr, f.logLevel, f.logFormat)
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

	addrs, err := devLayout(dir, f.nodes, f.basePort)
	if err != nil {
		return err
	}
	// Every node starts at once: with a static peer list each waits for
	// the others to elect a leader.
	sctx, cancel := context.WithTimeout(e.ctx, devStartWithin)
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
		if e.ctx.Err() != nil {
			return nil
		}
		return devStartError(err, f)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			logger.Warn("dev: node shutdown", "err", err)
		}
		if e.ctx.Err() != nil {
			fmt.Fprintln(e.stderr, "dedupnode dev: stopped")
		}
	}()
	if addrs == nil { // free ports from the OS: keep them for the next run
		if err := saveDevPorts(dir, c.Nodes()); err != nil {
			return err
		}
	}
	nodes := make([]devNode, c.Size())
	for i, n := range c.Nodes() {
		nodes[i] = devNode{Node: n, Admin: c.Server(i).AdminAddr()}
	}
	leader := c.NodeID(c.Leader())
	printDev(e.stdout, e.progName, dir, temp, nodes, leader)

	<-e.ctx.Done()
	fmt.Fprintln(e.stderr, "dedupnode dev: stopping")
	// Every node stops at once: their complaints about each other going
	// away are expected, so only errors at debug level get through.
	if level.Level() > slog.LevelDebug {
		level.Set(slog.LevelError + 4)
	}
	return nil
}

// devStartError explains why the cluster did not start: one line (the
// first node's error, the others are usually alike) and a hint.
func devStartError(err error, f *devFlags) error {
	var se *devcluster.StartError
	if !errors.As(err, &se) {
		return &opError{err: fmt.Errorf("dev cluster elected no leader within %v: %w", devStartWithin, err), hint: "re-run with --log-level info to see why"}
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

// devLayout returns the nodes' addresses: fixed from basePort, or the free
// ports of an earlier run kept in dir/dev-ports.json; nil when the OS is to
// pick free ports (saveDevPorts keeps them then).
func devLayout(dir string, n, basePort int) ([]devcluster.Node, error) {
	if basePort != 0 {
		nodes := make([]devcluster.Node, n)
		for i := range nodes {
			nodes[i] = devcluster.Node{
				ID:   "n" + strconv.Itoa(i+1),
				GRPC: net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+i)),
				Raft: net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+devRaftOffset+i)),
			}
		}
		return nodes, nil
	}
	path := filepath.Join(dir, devPortsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil
	}
	var saved []devcluster.Node
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, &opError{err: fmt.Errorf("read %s: %w", path, err), hint: "delete it, or use a fresh --data-dir"}
	}
	if len(saved) != n {
		return nil, usagef("%s holds a %d-node cluster: pass --nodes %d, or use a fresh --data-dir", dir, len(saved), len(saved))
	}
	return saved, nil
}

// saveDevPorts keeps the ports the OS gave in dir/dev-ports.json, so a
// restart with the same --data-dir reuses them.
func saveDevPorts(dir string, nodes []devcluster.Node) error {
	b, _ := json.MarshalIndent(nodes, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, devPortsFile), b, 0o644); err != nil {
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
