package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/bench"
)

// Raft log stores (serve --raft-log-store). Spelled out rather than taken
// from dedupnode's cluster package, which would pull raft and bbolt into
// this module next to etcd's. defaultLogStore must match
// defaultLogStore: the target rows measure the default.
const (
	defaultLogStore = "wal"
	otherLogStore   = "boltdb"
)

// dedupnodeSystem is dedupnode on nodes nodes with the Raft log store
// store (serve --raft-log-store). The default store's rows keep the plain
// keys (dedupnode-1, dedupnode-3: the target rows); another store's get
// its name appended (dedupnode-1-boltdb).
func dedupnodeSystem(nodes int, store string, quick, full []Case) system {
	key := fmt.Sprintf("dedupnode-%d", nodes)
	if store != defaultLogStore {
		key += "-" + store
	}
	return system{
		Key:   key,
		Name:  fmt.Sprintf("dedupnode, %d node%s, %s log", nodes, plural(nodes), store),
		Kind:  "dedupnode",
		Nodes: nodes,
		Detail: "the dedupnode binary, one `serve` process per node (or one `dev` process with --dedupnode-mode dev), " +
			"--raft-log-store " + store + "; the bench package's gRPC workloads: Mark and Check linearizable, sent to the leader as the Go client sends them",
		Start: func(ctx context.Context, e *env) (Instance, error) { return startDedupnode(ctx, e, nodes, store, key) },
		Quick: quick,
		Full:  full,
	}
}

// dedupnodeBatcherSystem is dedupnode measured through the Go client's
// Batcher (bench --coalesce): every ID is its own call, merged into few
// RPCs by the client. Not a target row: the targets compare raw calls.
func dedupnodeBatcherSystem(nodes int, quick, full []Case) system {
	s := dedupnodeSystem(nodes, defaultLogStore, quick, full)
	s.Key += "-batcher"
	s.Name += ", Go client Batcher"
	s.Detail = "as the row without Batcher, but every ID is its own single-ID call (one goroutine per ID, as a consumer " +
		"handling one message per goroutine makes them) through the Go client's Batcher, which merges waiting calls into " +
		"one RPC (at most 4 in flight per operation); latency is per caller call of the batch size shown"
	s.Start = func(ctx context.Context, e *env) (Instance, error) {
		inst, err := startDedupnode(ctx, e, nodes, defaultLogStore, s.Key)
		if err != nil {
			return nil, err
		}
		inst.coalesce = true
		return inst, nil
	}
	return s
}

// dedupnodeStreamSystem is dedupnode with every call a message on one
// Dedup.Stream per connection (bench --transport stream) instead of a
// unary RPC.
func dedupnodeStreamSystem(nodes int, quick, full []Case) system {
	s := dedupnodeSystem(nodes, defaultLogStore, quick, full)
	s.Key += "-stream"
	s.Name += ", streamed calls"
	s.Detail = "as the row without streamed calls, but every call is a message on one Dedup.Stream per connection " +
		"(bench --transport stream), shared by the callers, instead of a unary RPC"
	s.Start = func(ctx context.Context, e *env) (Instance, error) {
		inst, err := startDedupnode(ctx, e, nodes, defaultLogStore, s.Key)
		if err != nil {
			return nil, err
		}
		inst.transport = "stream"
		return inst, nil
	}
	return s
}

type dedupInst struct {
	ps        []*proc
	addrs     []string
	sys       string
	conns     int
	coalesce  bool
	transport string
}

// startDedupnode starts a cluster of nodes with the Raft log store store
// for the system named sys (its data directories are named after it).
func startDedupnode(ctx context.Context, e *env, nodes int, store string, sys string) (*dedupInst, error) {
	if e.cfg.DedupnodeBin == "" {
		return nil, fmt.Errorf("%w: no --dedupnode-bin given", errSkip)
	}
	inst := &dedupInst{sys: sys, conns: e.cfg.GRPCConns}
	if e.cfg.DedupnodeMode == "dev" {
		dir, err := e.dir(sys)
		if err != nil {
			return nil, err
		}
		w := newLineWatcher("addrs:")
		p, err := startProc(startOpts{name: sys + " (dev)", path: e.cfg.DedupnodeBin,
			args: []string{"dev", "--nodes", fmt.Sprint(nodes), "--base-port", "0", "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn", "--raft-log-store", store},
			dir:  dir, logPath: filepath.Join(dir, "dedupnode.log"), stdout: w, stopSig: 2})
		if err != nil {
			return nil, err
		}
		inst.ps = append(inst.ps, p)
		select {
		case line := <-w.found:
			inst.addrs = strings.Split(strings.TrimSpace(line), ",")
		case <-p.done:
			return nil, fmt.Errorf("dedupnode dev exited; log tail:\n%s", p.tailLog(15))
		case <-time.After(90 * time.Second):
			inst.Close()
			return nil, fmt.Errorf("dedupnode dev printed no addrs line in 90 s; log tail:\n%s", p.tailLog(15))
		}
	} else {
		ports, err := freePorts(2 * nodes)
		if err != nil {
			return nil, err
		}
		var peers []string
		for i := 0; i < nodes; i++ {
			g := fmt.Sprintf("127.0.0.1:%d", ports[2*i])
			r := fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])
			inst.addrs = append(inst.addrs, g)
			peers = append(peers, fmt.Sprintf("n%d=%s=%s", i+1, r, g))
		}
		for i := 0; i < nodes; i++ {
			dir, err := e.dir(fmt.Sprintf("%s-n%d", sys, i+1))
			if err != nil {
				inst.Close()
				return nil, err
			}
			args := []string{"serve", "--node-id", fmt.Sprintf("n%d", i+1), "--data-dir", filepath.Join(dir, "data"),
				"--grpc-addr", inst.addrs[i], "--raft-addr", strings.Split(peers[i], "=")[1], "--log-level", "warn",
				"--raft-log-store", store}
			if nodes == 1 {
				args = append(args, "--bootstrap")
			} else {
				args = append(args, "--peers", strings.Join(peers, ","))
			}
			p, err := startProc(startOpts{name: fmt.Sprintf("%s node n%d", sys, i+1), path: e.cfg.DedupnodeBin, args: args,
				dir: dir, logPath: filepath.Join(dir, "dedupnode.log")})
			if err != nil {
				inst.Close()
				return nil, err
			}
			inst.ps = append(inst.ps, p)
		}
	}
	err := waitFor(ctx, sys+" leader", 90*time.Second, inst.ps, func(ctx context.Context) error {
		_, err := bench.WaitReady(ctx, inst.addrs, time.Second)
		return err
	})
	if err != nil {
		inst.Close()
		return nil, err
	}
	return inst, nil
}

func (d *dedupInst) Supports(w string) bool { return true }

func (d *dedupInst) Close() {
	for _, p := range d.ps {
		p.stop()
	}
}

func (d *dedupInst) Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error) {
	var pids []int
	for _, p := range d.ps {
		pids = append(pids, p.pid)
	}
	var c0, c1 cpuSample
	res, err := bench.Run(ctx, bench.Config{
		Addrs:           d.addrs,
		Namespace:       "bench",
		Workload:        c.Workload,
		Concurrency:     rc.Concurrency,
		Batch:           c.Batch,
		IDSize:          rc.IDSize,
		Duration:        rc.Duration,
		Warmup:          rc.Warmup,
		TTL:             rc.TTL,
		Timeout:         rc.Timeout,
		Conns:           d.conns,
		Preload:         100_000,
		CreateNamespace: true,
		Coalesce:        d.coalesce,
		Transport:       d.transport,
		Progress:        rc.Progress,
		Label:           fmt.Sprintf("%-22s %-10s b%-3d", d.sys, c.Workload, c.Batch),
		OnMeasure: func(start bool) {
			if start {
				c0 = sampleCPU(pids)
			} else {
				c1 = sampleCPU(pids)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	res.System = d.sys
	// where writes went is said once, in the system's description
	if strings.HasPrefix(res.Note, "calls sent to the leader") {
		_, rest, _ := strings.Cut(res.Note, "; ")
		res.Note = rest
	}
	fillCPU(res, c0, c1)
	return res, nil
}

func dedupnodeVersion(bin string) string {
	if bin == "" {
		return ""
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}
