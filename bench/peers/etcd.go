package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/dedupnode/dedupnode/bench"
)

func etcdSystem(members int, quick, full []Case) system {
	return system{
		Key:   fmt.Sprintf("etcd-%d", members),
		Name:  fmt.Sprintf("etcd 3.7, %d member%s", members, plural(members)),
		Kind:  kindFor(members),
		Nodes: members,
		Detail: "embedded go.etcd.io/etcd/server/v3, one process per member; mark: Txn(If CreateRevision(k)=0, Then Put(k, lease)) " +
			"with one 1-day lease, batch = that many transactions in flight per worker; check: a read-only Txn of batch Gets (linearizable)",
		Start: func(ctx context.Context, e *env) (Instance, error) { return startEtcd(ctx, e, members) },
		Quick: quick,
		Full:  full,
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func kindFor(nodes int) string {
	if nodes == 1 {
		return "single"
	}
	return "replicated"
}

// etcdNodeMain runs one embedded etcd member until SIGTERM/SIGINT.
func etcdNodeMain(args []string) error {
	fs := flag.NewFlagSet("etcd-node", flag.ExitOnError)
	name := fs.String("name", "m1", "member name")
	dir := fs.String("dir", "", "data dir")
	client := fs.String("client-url", "", "client URL (loopback)")
	peer := fs.String("peer-url", "", "peer URL (loopback)")
	cluster := fs.String("initial-cluster", "", "name=peerURL,...")
	_ = fs.Parse(args)
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	cu, err := url.Parse(*client)
	if err != nil {
		return err
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		return err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = *cluster
	cfg.InitialClusterToken = "dedupnode-bench"
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.LogLevel = "error"
	cfg.QuotaBackendBytes = 8 << 30
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("etcd ready")
	case err := <-e.Err():
		return err
	case <-sig:
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("etcd member %s not ready in 2 minutes", *name)
	}
	select {
	case err := <-e.Err():
		return err
	case <-sig:
		return nil
	}
}

type etcdInst struct {
	ps      []*proc
	clients []*clientv3.Client
	sys     string
}

func startEtcd(ctx context.Context, e *env, members int) (*etcdInst, error) {
	sys := fmt.Sprintf("etcd-%d", members)
	ports, err := freePorts(2 * members)
	if err != nil {
		return nil, err
	}
	var initial, endpoints []string
	for i := 0; i < members; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
		endpoints = append(endpoints, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
	}
	inst := &etcdInst{sys: sys}
	for i := 0; i < members; i++ {
		dir, err := e.dir(fmt.Sprintf("%s-m%d", sys, i+1))
		if err != nil {
			inst.Close()
			return nil, err
		}
		p, err := startProc(startOpts{
			name: fmt.Sprintf("%s member m%d", sys, i+1), path: e.self,
			args: []string{"etcd-node", "--name", fmt.Sprintf("m%d", i+1), "--dir", filepath.Join(dir, "data"),
				"--client-url", "http://" + endpoints[i], "--peer-url", fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
				"--initial-cluster", strings.Join(initial, ",")},
			dir: dir, logPath: filepath.Join(dir, "etcd.log"),
		})
		if err != nil {
			inst.Close()
			return nil, err
		}
		inst.ps = append(inst.ps, p)
	}
	// A few clients (each one gRPC connection) shared by the workers.
	nc := e.cfg.GRPCConns
	for i := 0; i < nc; i++ {
		cl, err := clientv3.New(clientv3.Config{
			Endpoints:   rotate(endpoints, i),
			DialTimeout: 5 * time.Second,
			Logger:      quietZap(),
		})
		if err != nil {
			inst.Close()
			return nil, err
		}
		inst.clients = append(inst.clients, cl)
	}
	err = waitFor(ctx, sys, 60*time.Second, inst.ps, func(ctx context.Context) error {
		_, err := inst.clients[0].Put(ctx, "ready", "1")
		return err
	})
	if err != nil {
		inst.Close()
		return nil, err
	}
	return inst, nil
}

func rotate(s []string, k int) []string {
	out := make([]string, len(s))
	for i := range s {
		out[i] = s[(i+k)%len(s)]
	}
	return out
}

func (x *etcdInst) Supports(w string) bool { return w == bench.MarkNew || w == bench.CheckMiss }

func (x *etcdInst) Close() {
	for _, c := range x.clients {
		c.Close()
	}
	for _, p := range x.ps {
		p.stop()
	}
}

func (x *etcdInst) pids() []int {
	var out []int
	for _, p := range x.ps {
		out = append(out, p.pid)
	}
	return out
}

func (x *etcdInst) Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error) {
	var lease clientv3.LeaseID
	if c.Workload == bench.MarkNew {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lr, err := x.clients[0].Grant(lctx, int64(rc.TTL.Seconds()))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcd lease: %w", err)
		}
		lease = lr.ID
	}
	return runOps(ctx, x.sys, c, rc, x.pids(), func(w int, gen *bench.IDGen) (bench.Op, error) {
		cl := x.clients[w%len(x.clients)]
		batch := make([][]byte, c.Batch)
		keys := make([]string, c.Batch)
		switch c.Workload {
		case bench.MarkNew:
			isNew := make([]bool, c.Batch)
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				err := fanout(n, func(i int) error {
					k := "d/" + string(batch[i])
					resp, err := cl.Txn(cctx).
						If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
						Then(clientv3.OpPut(k, "1", clientv3.WithLease(lease))).
						Commit()
					if err != nil {
						return err
					}
					isNew[i] = resp.Succeeded
					return nil
				})
				if err != nil {
					return 0, 0, err
				}
				for i := 0; i < n; i++ {
					tallyNew(t, isNew[i])
				}
				return n, n, nil
			}, nil
		case bench.CheckMiss:
			ops := make([]clientv3.Op, c.Batch)
			return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
				gen.FreshBatch(batch[:n])
				cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
				defer cancel()
				for i := 0; i < n; i++ {
					keys[i] = "d/" + string(batch[i])
					ops[i] = clientv3.OpGet(keys[i], clientv3.WithCountOnly())
				}
				var found int64
				if n == 1 {
					resp, err := cl.Get(cctx, keys[0], clientv3.WithCountOnly())
					if err != nil {
						return 0, 0, err
					}
					found = resp.Count
				} else {
					resp, err := cl.Txn(cctx).Then(ops[:n]...).Commit()
					if err != nil {
						return 0, 0, err
					}
					for _, r := range resp.Responses {
						found += r.GetResponseRange().GetCount()
					}
				}
				t.Add("NOT_SEEN", int64(n)-found)
				if found > 0 {
					t.Add("SEEN", found)
					t.Unexpected(found)
				}
				return n, 1, nil
			}, nil
		}
		return nil, fmt.Errorf("etcd: no workload %s", c.Workload)
	})
}

func quietZap() *zap.Logger { return zap.NewNop() }
