package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupnode/dedupnode/bench"
)

const pgBinDir = "/usr/lib/postgresql/15/bin"

func postgresSystem(quick, full []Case) system {
	return system{
		Key:   "postgres",
		Name:  "PostgreSQL 15",
		Kind:  "single",
		Nodes: 1,
		Detail: "INSERT INTO dedup(id, expires_at) ... ON CONFLICT DO NOTHING (one row, or unnest of a bytea[] " +
			"of the batch size with RETURNING id); check: SELECT id WHERE id = ANY($1); " +
			"fsync on, synchronous_commit on, pgx pool of one connection per worker",
		Start: func(ctx context.Context, e *env) (Instance, error) { return startPostgres(ctx, e) },
		Quick: quick,
		Full:  full,
	}
}

type pgInst struct {
	p    *proc
	pool *pgxpool.Pool
}

func startPostgres(ctx context.Context, e *env) (*pgInst, error) {
	bin := pgBinDir
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		return nil, fmt.Errorf("PostgreSQL 15 not installed in %s", bin)
	}
	// PostgreSQL refuses to run as root: as root, run it as the postgres
	// user; otherwise as ourselves.
	uid, gid := 0, 0
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("no postgres user to run the server as: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	dir, err := e.dir("postgres")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	if uid > 0 {
		for _, d := range []string{dir, data} {
			if err := os.Chown(d, uid, gid); err != nil {
				return nil, err
			}
		}
	}
	// initdb must not run as root: run it as the postgres user.
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "--auth=trust", "--username=postgres",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid > 0 {
		initdb.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	args := []string{"-D", data, "-p", strconv.Itoa(ports[0]),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + dir,
		"-c", "max_connections=200",
		"-c", "shared_buffers=512MB",
		"-c", "fsync=on", "-c", "synchronous_commit=on",
		"-c", "max_wal_size=4GB",
		"-c", "logging_collector=off",
	}
	// SIGINT is PostgreSQL's "fast shutdown".
	p, err := startProc(startOpts{name: "postgres", path: filepath.Join(bin, "postgres"), args: args, dir: dir,
		logPath: filepath.Join(dir, "postgres.log"), uid: uid, gid: gid, stopSig: syscall.SIGINT})
	if err != nil {
		return nil, err
	}
	inst := &pgInst{p: p}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&pool_max_conns=%d", ports[0], e.cfg.Concurrency+4)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		inst.Close()
		return nil, err
	}
	err = waitFor(ctx, "postgres", 60*time.Second, []*proc{p}, func(ctx context.Context) error {
		if inst.pool == nil {
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				return err
			}
			inst.pool = pool
		}
		return inst.pool.Ping(ctx)
	})
	if err != nil {
		inst.Close()
		return nil, err
	}
	_, err = inst.pool.Exec(ctx, `CREATE TABLE dedup (id bytea PRIMARY KEY, expires_at timestamptz NOT NULL)`)
	if err != nil {
		inst.Close()
		return nil, err
	}
	return inst, nil
}

func (g *pgInst) Supports(w string) bool { return w == bench.MarkNew || w == bench.CheckMiss }

func (g *pgInst) Close() {
	if g.pool != nil {
		g.pool.Close()
	}
	g.p.stop()
}

func (g *pgInst) Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error) {
	ttl := fmt.Sprintf("%d seconds", int64(rc.TTL.Seconds()))
	return runOps(ctx, "postgres", c, rc, []int{g.p.pid}, func(w int, gen *bench.IDGen) (bench.Op, error) {
		batch := make([][]byte, c.Batch)
		switch c.Workload {
		case bench.MarkNew:
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				if n == 1 {
					tag, err := g.pool.Exec(cctx,
						`INSERT INTO dedup (id, expires_at) VALUES ($1, now() + $2::interval) ON CONFLICT DO NOTHING`,
						batch[0], ttl)
					if err != nil {
						return 0, 0, err
					}
					tallyNew(t, tag.RowsAffected() == 1)
					return 1, 1, nil
				}
				rows, err := g.pool.Query(cctx,
					`INSERT INTO dedup (id, expires_at) SELECT unnest($1::bytea[]), now() + $2::interval
					 ON CONFLICT DO NOTHING RETURNING id`, batch[:n], ttl)
				if err != nil {
					return 0, 0, err
				}
				fresh := 0
				for rows.Next() {
					fresh++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return 0, 0, err
				}
				t.Add("NEW", int64(fresh))
				if n > fresh {
					t.Add("DUPLICATE", int64(n-fresh))
					t.Unexpected(int64(n - fresh))
				}
				return n, 1, nil
			}, nil
		case bench.CheckMiss:
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				rows, err := g.pool.Query(cctx, `SELECT id FROM dedup WHERE id = ANY($1::bytea[])`, batch[:n])
				if err != nil {
					return 0, 0, err
				}
				found := 0
				for rows.Next() {
					found++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return 0, 0, err
				}
				t.Add("NOT_SEEN", int64(n-found))
				if found > 0 {
					t.Add("SEEN", int64(found))
					t.Unexpected(int64(found))
				}
				return n, 1, nil
			}, nil
		}
		return nil, fmt.Errorf("postgres: no workload %s", c.Workload)
	})
}

func postgresVersion() string {
	out, err := exec.Command(filepath.Join(pgBinDir, "postgres"), "--version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
