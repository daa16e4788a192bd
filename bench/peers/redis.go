package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupnode/dedupnode/bench"
)

// redisSystem runs redis-server with the given persistence: "always",
// "everysec" (AOF fsync policy) or "none" (no AOF, no RDB).
func redisSystem(fsync string, quick, full []Case) system {
	detail := "SET d:<id> 1 NX EX 86400 (mark), EXISTS (check); pipelined to the batch depth; appendonly yes, appendfsync " + fsync
	if fsync == "none" {
		detail = "SET NX EX / EXISTS; no persistence (appendonly no, save \"\")"
	}
	return system{
		Key:    "redis-" + fsync,
		Name:   "Redis " + map[string]string{"always": "appendfsync always", "everysec": "appendfsync everysec", "none": "no persistence"}[fsync],
		Kind:   "single",
		Nodes:  1,
		Detail: detail,
		Start: func(ctx context.Context, e *env) (Instance, error) {
			return startRedis(ctx, e, fsync)
		},
		Quick: quick,
		Full:  full,
	}
}

type redisInst struct {
	p    *proc
	addr string
	cl   *redis.Client
	sys  string
}

func startRedis(ctx context.Context, e *env, fsync string) (*redisInst, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not installed: %w", err)
	}
	dir, err := e.dir("redis-" + fsync)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "yes",
		"--maxclients", "1000", "--loglevel", "warning",
	}
	if fsync == "none" {
		args = append(args, "--appendonly", "no")
	} else {
		args = append(args, "--appendonly", "yes", "--appendfsync", fsync)
	}
	p, err := startProc(startOpts{name: "redis-" + fsync, path: bin, args: args, dir: dir, logPath: filepath.Join(dir, "redis.log")})
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	r := &redisInst{p: p, addr: addr, sys: "redis-" + fsync}
	r.cl = redis.NewClient(&redis.Options{
		Addr:            addr,
		PoolSize:        e.cfg.Concurrency + 4,
		DisableIdentity: true,
		Protocol:        2,
	})
	err = waitFor(ctx, "redis", 20*time.Second, []*proc{p}, func(ctx context.Context) error {
		return r.cl.Ping(ctx).Err()
	})
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *redisInst) Supports(w string) bool { return w == bench.MarkNew || w == bench.CheckMiss }

func (r *redisInst) Close() {
	if r.cl != nil {
		r.cl.Close()
	}
	r.p.stop()
}

func redisKey(id []byte) string { return "d:" + string(id) }

func (r *redisInst) Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error) {
	ttl := rc.TTL
	return runOps(ctx, r.sys, c, rc, []int{r.p.pid}, func(w int, gen *bench.IDGen) (bench.Op, error) {
		batch := make([][]byte, c.Batch)
		switch c.Workload {
		case bench.MarkNew:
			cmds := make([]*redis.BoolCmd, c.Batch)
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				if n == 1 {
					ok, err := r.cl.SetNX(cctx, redisKey(batch[0]), 1, ttl).Result()
					if err != nil {
						return 0, 0, err
					}
					tallyNew(t, ok)
					return 1, 1, nil
				}
				pipe := r.cl.Pipeline()
				for i := 0; i < n; i++ {
					cmds[i] = pipe.SetNX(cctx, redisKey(batch[i]), 1, ttl)
				}
				if _, err := pipe.Exec(cctx); err != nil {
					return 0, 0, err
				}
				for i := 0; i < n; i++ {
					tallyNew(t, cmds[i].Val())
				}
				return n, 1, nil
			}, nil
		case bench.CheckMiss:
			cmds := make([]*redis.IntCmd, c.Batch)
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				if n == 1 {
					v, err := r.cl.Exists(cctx, redisKey(batch[0])).Result()
					if err != nil {
						return 0, 0, err
					}
					tallyMiss(t, v == 0)
					return 1, 1, nil
				}
				pipe := r.cl.Pipeline()
				for i := 0; i < n; i++ {
					cmds[i] = pipe.Exists(cctx, redisKey(batch[i]))
				}
				if _, err := pipe.Exec(cctx); err != nil {
					return 0, 0, err
				}
				for i := 0; i < n; i++ {
					tallyMiss(t, cmds[i].Val() == 0)
				}
				return n, 1, nil
			}, nil
		}
		return nil, fmt.Errorf("redis: no workload %s", c.Workload)
	})
}

// tallyNew counts a mark answer for a fresh ID (NEW expected).
func tallyNew(t *bench.Tally, isNew bool) {
	if isNew {
		t.Add("NEW", 1)
	} else {
		t.Add("DUPLICATE", 1)
		t.Unexpected(1)
	}
}

// tallyMiss counts a check answer for a fresh ID (NOT_SEEN expected).
func tallyMiss(t *bench.Tally, miss bool) {
	if miss {
		t.Add("NOT_SEEN", 1)
	} else {
		t.Add("SEEN", 1)
		t.Unexpected(1)
	}
}

func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
