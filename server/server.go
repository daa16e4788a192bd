// Package server is dedupnode's gRPC edge: it implements the dedup.v1
// Dedup, Admin and Internal services over a cluster.Node, validates every
// request before anything is proposed, forwards writes from followers to
// the leader, serves linearizable reads through a read index, and maps
// internal errors to gRPC codes in one table (errors.go). It also serves
// grpc.health.v1 and server reflection.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/adminhttp"
	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/grpccodec"
	"github.com/dedupnode/dedupnode/internal/headercheck"
	"github.com/dedupnode/dedupnode/metrics"
)

// Config configures a Server.
type Config struct {
	// Cluster configures the Raft node. Cluster.GRPCAddr defaults to the
	// address the gRPC listener got (an unspecified host becomes
	// 127.0.0.1); set it when clients reach this node by another address.
	// Cluster.Progress is set by the server.
	Cluster cluster.Config
	// ListenAddr is the gRPC bind address; port 0 picks a free port.
	// Ignored when Listener is set.
	ListenAddr string
	// Listener, if set, is served instead of listening on ListenAddr. The
	// server takes ownership.
	Listener net.Listener
	// AutoCreateNamespaces creates an unknown namespace named by a write
	// with fsm.DefaultNamespaceConfig (dev mode); otherwise it is NotFound.
	// A check creates nothing: an unknown namespace is NotFound either way.
	AutoCreateNamespaces bool
	// MaxBatch is the most items one request may carry (default 10 000).
	MaxBatch int
	// Join lists gRPC addresses of existing members. A node without Raft
	// state calls Admin.Join on them in turn, with backoff, until one
	// succeeds or Start's ctx ends.
	Join []string
	// ReadReplica makes the Join a read replica's (JoinRequest.read_replica):
	// a permanent non-voter that serves reads and is never promoted by the
	// leader. Ignored for a node that already has Raft state.
	ReadReplica bool
	// MaxClockOffset is the largest difference assumed between any two
	// nodes' wall clocks (default DefaultMaxClockOffset). A BOUNDED Check
	// is answered locally only when now - (leader timestamp of the last
	// applied entry) + MaxClockOffset < max staleness (see cluster/DESIGN.md,
	// Read replicas).
	MaxClockOffset time.Duration
	// LeaderWait bounds how long a request waits for a leader during an
	// election before failing with Unavailable (default 3 s; always less
	// than the request's own deadline).
	LeaderWait time.Duration
	// ServerOptions are added to the gRPC server (interceptors, TLS
	// credentials, ...), after the message size limits. Unary interceptors
	// given here see unary calls only; those that must see every Dedup call
	// (access control) go in CallInterceptors.
	ServerOptions []grpc.ServerOption
	// CallInterceptors run, in order, around every unary call and around
	// every call carried on a Dedup.Stream (each with the FullMethod of the
	// unary RPC of its kind), after the metrics interceptor.
	CallInterceptors []grpc.UnaryServerInterceptor
	// StreamInflight is how many calls of one Dedup.Stream run at once
	// (default DefaultStreamInflight).
	StreamInflight int
	// DialOptions are used for connections to other nodes (forwarding,
	// read index, join, promotion probes), after the defaults (insecure
	// transport, message size limits), so transport credentials given here
	// replace the insecure default.
	DialOptions []grpc.DialOption
	// AdminAddr, if set, serves the admin HTTP listener there (Prometheus
	// /metrics, the status page at /, /healthz); port 0 picks a free port.
	// AdminListener, if set, is used instead (the server takes ownership).
	AdminAddr     string
	AdminListener net.Listener
	// Version is shown on the status page and in dedup_node_info.
	Version string
}

// Server is a running dedupnode node: gRPC server plus Raft node.
type Server struct {
	dedupv1.UnimplementedDedupServer
	dedupv1.UnimplementedAdminServer
	dedupv1.UnimplementedInternalServer

	cfg Config
	log *slog.Logger
	// idHeader caches the cluster-ID response header (clusterIDHeader).
	idHeader atomic.Pointer[cachedIDHeader]
	node     *cluster.Node
	grpc     *grpc.Server
	ln       net.Listener
	health   *health.Server
	lim      fsm.Limits

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool

	metrics *metrics.Metrics
	admin   *adminhttp.Server
	started time.Time
	disk    diskUsageCache

	reads remoteReads // follower read-index RPCs shared between reads

	// callChain is the unary interceptor chain (metrics, then
	// CallInterceptors) that Stream runs each carried call through.
	callChain grpc.UnaryServerInterceptor
	checkHandler, markHandler, claimHandler, commitHandler,
	renewHandler, releaseHandler, forgetHandler grpc.UnaryHandler

	stop      chan struct{}
	wg        sync.WaitGroup
	serveErr  chan error
	closeOnce sync.Once
	closeErr  error
}

// DefaultMaxClockOffset is Config.MaxClockOffset's default (CockroachDB's
// default --max-offset).
const DefaultMaxClockOffset = 500 * time.Millisecond

// maxRecvBytes is the gRPC receive limit: one Raft entry's worth plus room
// for protobuf framing, so a request gRPC admits is either proposed whole
// or refused by the cluster with ENTRY_TOO_LARGE (both RESOURCE_EXHAUSTED)
// before it is proposed, and a larger one is refused by gRPC unread.
func maxRecvBytes(maxEntry int) int { return maxEntry + 1<<20 }

// maxSendBytes is the gRPC send limit: the answer to a batch of maxBatch
// items of the largest allowed size (records echo IDs), and never less
// than what a node may receive (forwarded requests).
func maxSendBytes(maxBatch, maxEntry int) int {
	return max(16<<20, maxBatch*(fsm.MaxIDBytesLimit+fsm.MaxDigestBytes+fsm.MaxTokenBytes+64), maxRecvBytes(maxEntry))
}

// Start listens on cfg.ListenAddr, starts the Raft node and serves gRPC.
// With cfg.Join and no Raft state it joins through the listed members
// before returning (bounded by ctx). On error everything started is closed.
func Start(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = fsm.DefaultMaxBatch
	}
	if cfg.MaxClockOffset == 0 {
		cfg.MaxClockOffset = DefaultMaxClockOffset
	}
	if cfg.MaxClockOffset < 0 {
		return nil, fmt.Errorf("server config: MaxClockOffset %v: want 0 (default) or more", cfg.MaxClockOffset)
	}
	if cfg.LeaderWait <= 0 {
		cfg.LeaderWait = 3 * time.Second
	}
	if cfg.StreamInflight <= 0 {
		cfg.StreamInflight = DefaultStreamInflight
	}
	logger := cfg.Cluster.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
		cfg.Cluster.Logger = logger
	}
	s := &Server{
		cfg:      cfg,
		log:      logger.With("component", "server", "node", cfg.Cluster.NodeID),
		lim:      fsm.Limits{MaxBatch: cfg.MaxBatch},
		conns:    map[string]*grpc.ClientConn{},
		stop:     make(chan struct{}),
		serveErr: make(chan error, 1),
	}
	s.ln = cfg.Listener
	if s.ln == nil {
		if s.ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("listen for grpc on %s: %w", cfg.ListenAddr, err)
		}
	}
	if s.cfg.Cluster.GRPCAddr == "" {
		s.cfg.Cluster.GRPCAddr = advertisable(s.ln.Addr())
	}
	s.cfg.Cluster.Progress = s.probeProgress
	s.cfg.Cluster.RegionProbe = s.probeRegion
	s.cfg.Cluster.ClusterIDProbe = s.probeClusterID
	s.cfg.Cluster.RetiredProbe = s.probeRetired
	if s.node, err = cluster.New(s.cfg.Cluster); err != nil {
		s.ln.Close()
		return nil, err
	}

	s.started = time.Now()
	s.metrics = metrics.New(metrics.Options{NodeID: cfg.Cluster.NodeID, Version: cfg.Version, Region: cfg.Cluster.Region, Source: metrics.SourceFunc(s.metricsSnapshot)})
	recv, send := maxRecvBytes(s.node.MaxEntryBytes()), maxSendBytes(cfg.MaxBatch, s.node.MaxEntryBytes())
	// The metrics interceptors come first, so calls that later interceptors
	// (access control) refuse are counted too.
	calls := append([]grpc.UnaryServerInterceptor{s.metrics.UnaryServerInterceptor()}, cfg.CallInterceptors...)
	// The cluster ID header is set on every call, ahead of the others, so
	// refused calls carry it too. It stays out of callChain: a carried
	// call of a TransportStream has the stream's header.
	s.callChain = chainUnary(calls)
	s.initHandlers()
	s.grpc = grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(recv), grpc.MaxSendMsgSize(send),
		grpc.ForceServerCodecV2(grpccodec.Codec{}),
		grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{s.unaryClusterID}, calls...)...),
		grpc.ChainStreamInterceptor(s.streamClusterID, s.metrics.StreamServerInterceptor())}, cfg.ServerOptions...)...)
	dedupv1.RegisterDedupServer(s.grpc, s)
	dedupv1.RegisterAdminServer(s.grpc, s)
	dedupv1.RegisterInternalServer(s.grpc, s)
	dedupv1.RegisterOpsServer(s.grpc, &opsServer{s: s})
	s.health = health.NewServer()
	s.setHealth(false)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.serveErr <- s.grpc.Serve(s.ln)
	}()
	go s.runHousekeeping()
	go s.runMetrics()

	if cfg.AdminAddr != "" || cfg.AdminListener != nil {
		s.admin, err = adminhttp.Start(adminhttp.Config{
			Addr:     cfg.AdminAddr,
			Listener: cfg.AdminListener,
			Status:   adminhttp.StatusFunc(s.AdminStatus),
			Metrics:  s.metrics.Handler(),
			Logger:   s.log,
		})
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return nil, errors.Join(err, s.Close(cctx))
		}
	}

	if len(cfg.Join) > 0 && !s.node.HadExistingState() {
		if err := s.join(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return nil, errors.Join(err, s.Close(cctx))
		}
	}
	s.log.Info("serving", "grpc_addr", s.GRPCAddr(), "raft_addr", s.RaftAddr(), "admin_addr", s.AdminAddr())
	return s, nil
}

// advertisable turns a bound address into one others can dial: an
// unspecified host (":0", "0.0.0.0", "::") becomes 127.0.0.1.
func advertisable(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok && (ta.IP == nil || ta.IP.IsUnspecified()) {
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(ta.Port))
	}
	return a.String()
}

// GRPCAddr returns the client address advertised for this node.
func (s *Server) GRPCAddr() string { return s.cfg.Cluster.GRPCAddr }

// RaftAddr returns the advertised Raft address.
func (s *Server) RaftAddr() string { return s.node.RaftAddr() }

// Node returns the Raft node.
func (s *Server) Node() *cluster.Node { return s.node }

// Close stops serving: GracefulStop bounded by ctx (then Stop), closes the
// connections to other nodes, then shuts the node down (handing off
// leadership first). Safe to call twice.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		close(s.stop)
		var errs []error
		if s.admin != nil {
			if err := s.admin.Close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("admin listener: %w", err))
			}
		}
		s.health.Shutdown()
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
		s.connMu.Lock()
		s.closed = true
		conns := s.conns
		s.conns = nil
		s.connMu.Unlock()
		for _, c := range conns {
			if err := c.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.node.Shutdown(nctx); err != nil {
			errs = append(errs, err)
		}
		s.wg.Wait()
		if err := <-s.serveErr; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errs = append(errs, fmt.Errorf("grpc serve: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// conn returns a cached client connection to another node.
func (s *Server) conn(addr string) (*grpc.ClientConn, error) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed {
		return nil, cluster.ErrShutdown
	}
	if c := s.conns[addr]; c != nil {
		return c, nil
	}
	// A forwarded request is at most what this node received; answers are
	// at most what the leader may send.
	send := maxSendBytes(s.cfg.MaxBatch, s.node.MaxEntryBytes())
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(send), grpc.MaxCallSendMsgSize(send), grpc.ForceCodecV2(grpccodec.Codec{})),
		// Answers from a node of another cluster are refused (checkPeer).
		grpc.WithChainUnaryInterceptor(headercheck.Unary(func(md metadata.MD) error { return s.checkPeer(addr, md) })),
		grpc.WithChainStreamInterceptor(headercheck.Stream(func(md metadata.MD) error { return s.checkPeer(addr, md) })),
	}, s.cfg.DialOptions...)
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	s.conns[addr] = c
	return c, nil
}

// probeCtx marks a node's own Admin.Status probe of another node as
// forwarded, so a follower answers from itself instead of asking the leader
// for the members' liveness (which a probe does not read).
func probeCtx(ctx context.Context, self string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwarded, self)
}

// probeProgress is the cluster's promotion probe: a node's applied index
// from its Admin.Status.
func (s *Server) probeProgress(ctx context.Context, id, grpcAddr string) (uint64, error) {
	c, err := s.conn(grpcAddr)
	if err != nil {
		return 0, err
	}
	st, err := dedupv1.NewAdminClient(c).Status(probeCtx(ctx, s.node.ID()), &dedupv1.StatusRequest{})
	if err != nil {
		return 0, err
	}
	if st.NodeId != id {
		return 0, fmt.Errorf("node at %s is %q, not %q", grpcAddr, st.NodeId, id)
	}
	return st.AppliedIndex, nil
}

// probeRegion is the cluster's region probe: a node's region from its
// Admin.Status.
func (s *Server) probeRegion(ctx context.Context, id, grpcAddr string) (string, error) {
	c, err := s.conn(grpcAddr)
	if err != nil {
		return "", err
	}
	st, err := dedupv1.NewAdminClient(c).Status(probeCtx(ctx, s.node.ID()), &dedupv1.StatusRequest{})
	if err != nil {
		return "", err
	}
	if st.NodeId != id {
		return "", fmt.Errorf("node at %s is %q, not %q", grpcAddr, st.NodeId, id)
	}
	return st.Region, nil
}

// probeRetired asks the node at grpcAddr whether node ID id is retired
// (cluster.RetiredProbe): its Status lists the retired IDs it applied.
func (s *Server) probeRetired(ctx context.Context, grpcAddr, id string) (bool, error) {
	c, err := s.conn(grpcAddr)
	if err != nil {
		return false, err
	}
	st, err := dedupv1.NewAdminClient(c).Status(probeCtx(ctx, s.node.ID()), &dedupv1.StatusRequest{})
	if err != nil {
		return false, err
	}
	return slices.Contains(st.RetiredNodeIds, id), nil
}

// join calls Admin.Join on the configured members in turn until one
// succeeds, backing off between rounds, bounded by ctx. A refusal
// (INVALID_ARGUMENT, CLUSTER_MISMATCH) ends it at once.
func (s *Server) join(ctx context.Context) error {
	req := &dedupv1.JoinRequest{NodeId: s.node.ID(), RaftAddr: s.node.RaftAddr(), GrpcAddr: s.GRPCAddr(), ReadReplica: s.cfg.ReadReplica}
	backoff := 100 * time.Millisecond
	var last error
	for {
		for _, addr := range s.cfg.Join {
			if addr == s.GRPCAddr() {
				continue
			}
			c, err := s.conn(addr)
			if err != nil {
				last = err
				continue
			}
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = dedupv1.NewAdminClient(c).Join(actx, req)
			cancel()
			if err == nil {
				s.log.Info("joined cluster", "via", addr)
				return nil
			}
			if status.Code(err) == codes.InvalidArgument || reasonOf(err) == dedupv1.ReasonClusterMismatch {
				// The cluster refused this node (a retired ID, a voter
				// asking to be a replica, another cluster's data dir):
				// asking again cannot help.
				return fmt.Errorf("join via %s: %w", addr, err)
			}
			last = fmt.Errorf("join via %s: %w", addr, err)
			s.log.Warn("join attempt failed", "via", addr, "err", err)
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		case <-ctx.Done():
			return fmt.Errorf("join cluster through %v: %w (last error: %v)", s.cfg.Join, ctx.Err(), last)
		}
	}
}

var healthServices = []string{"", "dedup.v1.Dedup", "dedup.v1.Admin", "dedup.v1.Ops", "dedup.v1.Internal"}

func (s *Server) setHealth(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		s.health.SetServingStatus(name, st)
	}
}

// runHousekeeping keeps the health status current and keeps this node's
// entry in the replicated node table current (a follower that restarted on
// a new client address re-announces itself through Admin.Join).
func (s *Server) runHousekeeping() {
	defer s.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	healthy, reason := false, ""
	var lastAnnounce time.Time
	for {
		select {
		case <-t.C:
		case <-s.node.Changed():
		case <-s.stop:
			return
		}
		h, why := s.node.Health()
		if h != healthy {
			healthy = h
			s.setHealth(h)
		}
		if why != reason {
			if why != "" {
				s.log.Warn("health: NOT_SERVING", "reason", why)
			} else {
				s.log.Info("health: SERVING")
			}
			reason = why
		}
		// Only a changed address is re-announced: an absent entry means the
		// node is new (its join records it) or was removed (and must not
		// re-add itself).
		if cur, ok := s.node.FSM().Nodes()[s.node.ID()]; healthy && ok && cur != s.GRPCAddr() &&
			!s.node.IsLeader() && time.Since(lastAnnounce) > 5*time.Second {
			lastAnnounce = time.Now()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.announce()
			}()
		}
	}
}

func (s *Server) announce() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err := s.Join(ctx, &dedupv1.JoinRequest{NodeId: s.node.ID(), RaftAddr: s.node.RaftAddr(), GrpcAddr: s.GRPCAddr()})
	if err != nil {
		s.log.Debug("announce client address failed", "err", err)
	}
}
