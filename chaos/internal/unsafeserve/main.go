// Command unsafeserve is a TEST-ONLY build of the dedupnode server with
// knobs that deliberately break its guarantees, so that the chaos tests can
// show that the checker catches a broken server. Never run it for real.
//
// It takes the flags of `dedupnode serve` that the chaos runner passes
// (node-id, data-dir, raft-addr, grpc-addr, peers; an optional leading
// "serve" argument is ignored) and starts the real server package with a
// gRPC interceptor in front of it:
//
//	--unsafe-stale-reads        answer every linearizable Check from the
//	                            contacted node's local state, without a
//	                            read index (breaks invariant 3)
//	--unsafe-ack-before-commit  answer Mark with NEW at once and send the
//	                            write in the background (breaks invariants
//	                            1 and 2: a duplicate can win, an
//	                            acknowledged mark can be lost)
//	--unsafe-corrupt-digest     on node n2, flip a bit of every Ops.Digest
//	                            answer, as a replica whose state diverged
//	                            would report (shows that the runner records
//	                            the digests and the checker's state_digests
//	                            fails the run; the state itself is intact)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/server"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("unsafeserve", flag.ExitOnError)
	nodeID := fs.String("node-id", "", "node ID")
	dataDir := fs.String("data-dir", "", "data directory")
	raftAddr := fs.String("raft-addr", "127.0.0.1:7000", "raft address")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:7070", "gRPC address")
	peers := fs.String("peers", "", "id=raft=grpc,...")
	staleReads := fs.Bool("unsafe-stale-reads", false, "BREAKS INVARIANT 3: answer linearizable Check without a read index")
	ackEarly := fs.Bool("unsafe-ack-before-commit", false, "BREAKS INVARIANTS 1 AND 2: answer Mark NEW before the write commits")
	corruptDigest := fs.Bool("unsafe-corrupt-digest", false, "BREAKS INVARIANT 5 AS REPORTED: node n2 answers Ops.Digest with a flipped bit")
	_ = fs.Parse(args)

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	logger.Warn("UNSAFE TEST BUILD: guarantees are broken on purpose", "stale_reads", *staleReads, "ack_before_commit", *ackEarly, "corrupt_digest", *corruptDigest)
	var ps []cluster.Peer
	for _, p := range strings.Split(*peers, ",") {
		f := strings.Split(p, "=")
		if len(f) == 3 {
			ps = append(ps, cluster.Peer{ID: f[0], RaftAddr: f[1], GRPCAddr: f[2]})
		}
	}
	cfg := server.Config{
		Cluster: cluster.Config{NodeID: *nodeID, DataDir: *dataDir, RaftAddr: *raftAddr, GRPCAddr: *grpcAddr,
			Peers: ps, Logger: logger},
		ListenAddr:       *grpcAddr,
		CallInterceptors: []grpc.UnaryServerInterceptor{unsafe(*staleReads, *ackEarly, *corruptDigest && *nodeID == "n2")},
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "unsafeserve: %v\n", err)
		os.Exit(1)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Close(sctx); err != nil {
		fmt.Fprintf(os.Stderr, "unsafeserve: %v\n", err)
		os.Exit(1)
	}
}

func unsafe(staleReads, ackEarly, corruptDigest bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch r := req.(type) {
		case *dedupv1.DigestRequest:
			resp, err := handler(ctx, req)
			if d, ok := resp.(*dedupv1.DigestResponse); ok && err == nil && corruptDigest && len(d.Digest) > 0 {
				d.Digest[0] ^= 1
			}
			return resp, err
		case *dedupv1.CheckRequest:
			if staleReads && r.Consistency != dedupv1.Consistency_CONSISTENCY_STALE {
				c := proto.Clone(r).(*dedupv1.CheckRequest)
				c.Consistency = dedupv1.Consistency_CONSISTENCY_STALE
				return handler(ctx, c)
			}
		case *dedupv1.MarkRequest:
			if ackEarly {
				go func() {
					bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
					defer cancel()
					_, _ = handler(bctx, req)
				}()
				now := time.Now().UnixMilli()
				ttl := r.TtlMs
				if ttl == 0 {
					ttl = int64(24 * time.Hour / time.Millisecond)
				}
				resp := &dedupv1.MarkResponse{}
				for _, it := range r.Items {
					tok := it.RequestToken
					if len(tok) == 0 {
						tok = r.RequestToken
					}
					resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_NEW,
						Record: &dedupv1.Record{State: dedupv1.RecordState_RECORD_STATE_COMMITTED, FirstSeenUnixMs: now,
							ExpiresUnixMs: now + ttl, RequestToken: tok, Digest: it.Digest}})
				}
				return resp, nil
			}
		}
		return handler(ctx, req)
	}
}
