package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupnode/dedupnode/bench"
)

func natsSystem(replicas int, syncAlways bool, quick, full []Case) system {
	key := fmt.Sprintf("nats-r%d", replicas)
	name := fmt.Sprintf("NATS JetStream R%d", replicas)
	mode := "default (no fsync before the ack; flushes every 2 min)"
	if syncAlways {
		key += "-sync"
		name += " sync_always"
		mode = "sync_always (fsync before the ack)"
	}
	return system{
		Key:   key,
		Name:  name,
		Kind:  kindFor(replicas),
		Nodes: replicas,
		Detail: "embedded nats-server/v2, one process per server; file-storage stream, duplicate window 1 day, " +
			"publish with Nats-Msg-Id = hex(id), PubAck.Duplicate is the answer; batch = async publishes in flight per worker; " + mode,
		Start: func(ctx context.Context, e *env) (Instance, error) { return startNATS(ctx, e, replicas, syncAlways) },
		Quick: quick,
		Full:  full,
	}
}

// natsNodeMain runs one embedded NATS server with JetStream until SIGTERM.
func natsNodeMain(args []string) error {
	fs := flag.NewFlagSet("nats-node", flag.ExitOnError)
	name := fs.String("name", "n1", "server name")
	port := fs.Int("port", 0, "client port")
	cport := fs.Int("cluster-port", 0, "cluster port (0: no cluster)")
	routes := fs.String("routes", "", "nats-route://127.0.0.1:P,...")
	store := fs.String("store", "", "JetStream store dir")
	syncAlways := fs.Bool("sync-always", false, "fsync before acknowledging")
	_ = fs.Parse(args)
	opts := &server.Options{
		ServerName: *name,
		Host:       "127.0.0.1",
		Port:       *port,
		JetStream:  true,
		StoreDir:   *store,
		SyncAlways: *syncAlways,
		NoSigs:     true,
		MaxPayload: 1 << 20,
	}
	if *cport > 0 {
		opts.Cluster = server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: *cport}
		opts.Routes = server.RoutesFromStr(*routes)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		return errors.New("nats server not ready in 30 s")
	}
	fmt.Println("nats ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}

type natsInst struct {
	ps       []*proc
	urls     []string
	conns    []*nats.Conn
	sys      string
	replicas int
	stream   int
}

func startNATS(ctx context.Context, e *env, replicas int, syncAlways bool) (*natsInst, error) {
	sys := fmt.Sprintf("nats-r%d", replicas)
	if syncAlways {
		sys += "-sync"
	}
	ports, err := freePorts(2 * replicas)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := 0; i < replicas; i++ {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[2*i+1]))
	}
	inst := &natsInst{sys: sys, replicas: replicas}
	for i := 0; i < replicas; i++ {
		dir, err := e.dir(fmt.Sprintf("%s-n%d", sys, i+1))
		if err != nil {
			inst.Close()
			return nil, err
		}
		args := []string{"nats-node", "--name", fmt.Sprintf("n%d", i+1), "--port", fmt.Sprint(ports[2*i]),
			"--store", filepath.Join(dir, "js")}
		if replicas > 1 {
			args = append(args, "--cluster-port", fmt.Sprint(ports[2*i+1]), "--routes", strings.Join(routes, ","))
		}
		if syncAlways {
			args = append(args, "--sync-always")
		}
		p, err := startProc(startOpts{name: fmt.Sprintf("%s server n%d", sys, i+1), path: e.self, args: args,
			dir: dir, logPath: filepath.Join(dir, "nats.log")})
		if err != nil {
			inst.Close()
			return nil, err
		}
		inst.ps = append(inst.ps, p)
		inst.urls = append(inst.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[2*i]))
	}
	// One connection per worker, spread over the servers.
	for i := 0; i < e.cfg.Concurrency; i++ {
		var nc *nats.Conn
		err := waitFor(ctx, sys+" connect", 30*time.Second, inst.ps, func(ctx context.Context) error {
			var err error
			nc, err = nats.Connect(strings.Join(rotate(inst.urls, i), ","), nats.NoReconnect(), nats.DontRandomize())
			return err
		})
		if err != nil {
			inst.Close()
			return nil, err
		}
		inst.conns = append(inst.conns, nc)
	}
	return inst, nil
}

func (x *natsInst) Supports(w string) bool { return w == bench.MarkNew }

func (x *natsInst) Close() {
	for _, c := range x.conns {
		c.Close()
	}
	for _, p := range x.ps {
		p.stop()
	}
}

func (x *natsInst) pids() []int {
	var out []int
	for _, p := range x.ps {
		out = append(out, p.pid)
	}
	return out
}

// newStream creates a fresh stream per case, so each case starts empty.
func (x *natsInst) newStream(ctx context.Context, ttl time.Duration) (string, error) {
	x.stream++
	name := fmt.Sprintf("DEDUP%d", x.stream)
	js, err := jetstream.New(x.conns[0])
	if err != nil {
		return "", err
	}
	err = waitFor(ctx, x.sys+" stream", 60*time.Second, x.ps, func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       name,
			Subjects:   []string{"dedup" + fmt.Sprint(x.stream) + ".>"},
			Storage:    jetstream.FileStorage,
			Replicas:   x.replicas,
			Duplicates: ttl,
			MaxAge:     ttl,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil
		}
		return err
	})
	return "dedup" + fmt.Sprint(x.stream) + ".m", err
}

func (x *natsInst) Run(ctx context.Context, c Case, rc runCfg) (*bench.Result, error) {
	if c.Workload != bench.MarkNew {
		return nil, fmt.Errorf("nats: no workload %s", c.Workload)
	}
	subject, err := x.newStream(ctx, rc.TTL)
	if err != nil {
		return nil, err
	}
	return runOps(ctx, x.sys, c, rc, x.pids(), func(w int, gen *bench.IDGen) (bench.Op, error) {
		js, err := jetstream.New(x.conns[w%len(x.conns)], jetstream.WithPublishAsyncMaxPending(4*c.Batch))
		if err != nil {
			return nil, err
		}
		batch := make([][]byte, c.Batch)
		futs := make([]jetstream.PubAckFuture, c.Batch)
		hexbuf := make([]byte, 2*rc.IDSize)
		msgID := func(id []byte) string {
			hex.Encode(hexbuf[:2*len(id)], id)
			return string(hexbuf[:2*len(id)])
		}
		return func(ctx context.Context, n int, t *bench.Tally) (int, int, error) {
			gen.FreshBatch(batch[:n])
			cctx, cancel := context.WithTimeout(ctx, rc.Timeout)
			defer cancel()
			if n == 1 {
				ack, err := js.Publish(cctx, subject, batch[0], jetstream.WithMsgID(msgID(batch[0])))
				if err != nil {
					return 0, 0, err
				}
				tallyNew(t, !ack.Duplicate)
				return 1, 1, nil
			}
			for i := 0; i < n; i++ {
				f, err := js.PublishAsync(subject, batch[i], jetstream.WithMsgID(msgID(batch[i])))
				if err != nil {
					return 0, 0, err
				}
				futs[i] = f
			}
			for i := 0; i < n; i++ {
				select {
				case ack := <-futs[i].Ok():
					tallyNew(t, !ack.Duplicate)
				case err := <-futs[i].Err():
					return 0, 0, err
				case <-cctx.Done():
					return 0, 0, cctx.Err()
				}
			}
			return n, n, nil
		}, nil
	})
}
