package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
)

func modeFromPB(m dedupv1.ExpiryMode) (fsm.ExpiryMode, error) {
	switch m {
	case dedupv1.ExpiryMode_EXPIRY_MODE_UNSPECIFIED:
		return 0, nil
	case dedupv1.ExpiryMode_EXPIRY_MODE_FIXED:
		return fsm.ExpiryFixed, nil
	case dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING:
		return fsm.ExpirySliding, nil
	}
	return 0, invalidf("namespace.expiry_mode", "unknown value %d", m)
}

func modeToPB(m fsm.ExpiryMode) dedupv1.ExpiryMode {
	switch m {
	case fsm.ExpiryFixed:
		return dedupv1.ExpiryMode_EXPIRY_MODE_FIXED
	case fsm.ExpirySliding:
		return dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING
	}
	return dedupv1.ExpiryMode_EXPIRY_MODE_UNSPECIFIED
}

// namespaceFromPB converts without filling defaults; zero fields stay zero.
func namespaceFromPB(p *dedupv1.Namespace) (fsm.NamespaceConfig, error) {
	if p == nil {
		return fsm.NamespaceConfig{}, invalidf("namespace", "required")
	}
	mode, err := modeFromPB(p.ExpiryMode)
	if err != nil {
		return fsm.NamespaceConfig{}, err
	}
	if p.MaxIdBytes > fsm.MaxIDBytesLimit {
		return fsm.NamespaceConfig{}, invalidf("max_id_bytes", "%d is outside 1 .. %d", p.MaxIdBytes, fsm.MaxIDBytesLimit)
	}
	return fsm.NamespaceConfig{
		Name:           p.Name,
		DefaultTTLMs:   p.DefaultTtlMs,
		MaxTTLMs:       p.MaxTtlMs,
		MaxIDBytes:     int(p.MaxIdBytes),
		Mode:           mode,
		DefaultLeaseMs: p.DefaultLeaseMs,
		BucketWidthMs:  p.BucketWidthMs,
	}, nil
}

func namespaceToPB(ns fsm.NamespaceConfig) *dedupv1.Namespace {
	return &dedupv1.Namespace{
		Name:           ns.Name,
		DefaultTtlMs:   ns.DefaultTTLMs,
		MaxTtlMs:       ns.MaxTTLMs,
		MaxIdBytes:     uint32(ns.MaxIDBytes),
		ExpiryMode:     modeToPB(ns.Mode),
		DefaultLeaseMs: ns.DefaultLeaseMs,
		BucketWidthMs:  ns.BucketWidthMs,
	}
}

// negativeField names the first negative duration of a namespace request.
func negativeField(ns *fsm.NamespaceConfig) error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"default_ttl_ms", ns.DefaultTTLMs}, {"max_ttl_ms", ns.MaxTTLMs}, {"default_lease_ms", ns.DefaultLeaseMs}, {"bucket_width_ms", ns.BucketWidthMs}} {
		if f.v < 0 {
			return invalidf(f.name, "%d is negative", f.v)
		}
	}
	return nil
}

// proposeNamespaceOp proposes one namespace op on the leader.
func (s *Server) proposeNamespaceOp(ctx context.Context, op fsm.Op) (fsm.NamespaceConfig, error) {
	res, err := s.node.Propose(ctx, []fsm.Op{op})
	if err != nil {
		return fsm.NamespaceConfig{}, err
	}
	return res[0].Namespace, res[0].Err
}

// CreateNamespace implements dedupv1.AdminServer. Zero fields take the
// defaults of fsm.FillNamespaceDefaults.
func (s *Server) CreateNamespace(ctx context.Context, req *dedupv1.CreateNamespaceRequest) (*dedupv1.NamespaceResponse, error) {
	cfg, err := namespaceFromPB(req.Namespace)
	if err == nil {
		err = negativeField(&cfg)
	}
	if err == nil {
		cfg = fsm.FillNamespaceDefaults(cfg)
		err = fsm.ValidateNamespaceConfig(&cfg)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	var out *dedupv1.NamespaceResponse
	err = s.onLeader(ctx, func(ctx context.Context) error {
		ns, err := s.proposeNamespaceOp(ctx, fsm.Op{Kind: fsm.OpCreateNamespace, Namespace: cfg.Name, Config: cfg})
		if err == nil {
			out = &dedupv1.NamespaceResponse{Namespace: namespaceToPB(ns)}
		}
		return err
	}, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		out, err = dedupv1.NewAdminClient(cc).CreateNamespace(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

// UpdateNamespace implements dedupv1.AdminServer: non-zero fields replace
// the current values; bucket_width_ms cannot change.
func (s *Server) UpdateNamespace(ctx context.Context, req *dedupv1.UpdateNamespaceRequest) (*dedupv1.NamespaceResponse, error) {
	upd, err := namespaceFromPB(req.Namespace)
	if err == nil {
		err = fsm.ValidateNamespaceName(upd.Name)
	}
	if err == nil {
		err = negativeField(&upd)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	var out *dedupv1.NamespaceResponse
	err = s.onLeader(ctx, func(ctx context.Context) error {
		cur, ok := s.node.FSM().Namespace(upd.Name)
		if !ok {
			return &fsm.NamespaceError{Name: upd.Name, Err: fsm.ErrNamespaceNotFound}
		}
		if upd.BucketWidthMs != 0 && upd.BucketWidthMs != cur.BucketWidthMs {
			return invalidf("bucket_width_ms", "cannot change (is %d ms)", cur.BucketWidthMs)
		}
		merged := fsm.MergeNamespaceUpdate(cur, upd)
		if err := fsm.ValidateNamespaceConfig(&merged); err != nil {
			return err
		}
		upd.BucketWidthMs = 0
		ns, err := s.proposeNamespaceOp(ctx, fsm.Op{Kind: fsm.OpUpdateNamespace, Namespace: upd.Name, Config: upd})
		if err == nil {
			out = &dedupv1.NamespaceResponse{Namespace: namespaceToPB(ns)}
		}
		return err
	}, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		out, err = dedupv1.NewAdminClient(cc).UpdateNamespace(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

// DescribeNamespace implements dedupv1.AdminServer (linearizable).
func (s *Server) DescribeNamespace(ctx context.Context, req *dedupv1.DescribeNamespaceRequest) (*dedupv1.NamespaceResponse, error) {
	name := req.Name
	if name == "" {
		name = fsm.DefaultNamespace
	}
	if err := fsm.ValidateNamespaceName(name); err != nil {
		return nil, toStatus(err)
	}
	if err := s.linearize(ctx); err != nil {
		return nil, toStatus(err)
	}
	ns, ok := s.node.FSM().Namespace(name)
	if !ok {
		return nil, toStatus(&fsm.NamespaceError{Name: name, Err: fsm.ErrNamespaceNotFound})
	}
	return &dedupv1.NamespaceResponse{Namespace: namespaceToPB(ns)}, nil
}

// ListNamespaces implements dedupv1.AdminServer (linearizable).
func (s *Server) ListNamespaces(ctx context.Context, _ *dedupv1.ListNamespacesRequest) (*dedupv1.ListNamespacesResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, toStatus(err)
	}
	out := &dedupv1.ListNamespacesResponse{}
	for _, ns := range s.node.FSM().Namespaces() {
		out.Namespaces = append(out.Namespaces, namespaceToPB(ns))
	}
	return out, nil
}

// DeleteNamespace implements dedupv1.AdminServer.
func (s *Server) DeleteNamespace(ctx context.Context, req *dedupv1.DeleteNamespaceRequest) (*dedupv1.DeleteNamespaceResponse, error) {
	if err := fsm.ValidateNamespaceName(req.Name); err != nil {
		return nil, toStatus(err)
	}
	err := s.onLeader(ctx, func(ctx context.Context) error {
		_, err := s.proposeNamespaceOp(ctx, fsm.Op{Kind: fsm.OpDeleteNamespace, Namespace: req.Name, Config: fsm.NamespaceConfig{Name: req.Name}})
		return err
	}, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).DeleteNamespace(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.DeleteNamespaceResponse{}, nil
}

// Status implements dedupv1.AdminServer: this node's own view, never
// forwarded.
func (s *Server) Status(ctx context.Context, _ *dedupv1.StatusRequest) (*dedupv1.StatusResponse, error) {
	st, err := s.node.Status()
	if err != nil {
		return nil, toStatus(err)
	}
	out := statusPB(st)
	out.Disk = s.diskStatus()
	out.Healthy, out.HealthReason = s.node.Health()
	ls := s.node.LogStoreStats()
	out.LogStoreStalled, out.LogStoreMaxWriteMs = ls.Stalled, ls.MaxWrite.Milliseconds()
	out.ReadReplica = s.node.FSM().NodeRole(s.node.ID()) == fsm.RoleReplica
	out.Region, out.PreferredLeaderRegions = s.node.Region(), s.node.PreferredLeaderRegions()
	out.RetiredNodeIds = s.node.FSM().RetiredIDs()
	if st.State != "leader" && st.LeaderGRPCAddr != "" && !isForwarded(ctx) {
		s.leaderLiveness(ctx, st.LeaderID, st.LeaderGRPCAddr, out.Members)
	}
	return out, nil
}

// leaderLivenessWait bounds a follower's question to the leader in Status:
// a leader that does not answer within it leaves the members UNKNOWN
// rather than making status slow.
const leaderLivenessWait = time.Second

// leaderLiveness fills the members' liveness from the leader's Status: only
// the leader heartbeats the others, and users of etcd's member list or
// CockroachDB's node status expect the cluster's view from whichever node
// they ask. The call is marked forwarded so the leader (or a node that has
// just lost leadership) answers from itself and asks no one. Any failure
// leaves the members REACHABILITY_UNKNOWN.
func (s *Server) leaderLiveness(ctx context.Context, leaderID, addr string, members []*dedupv1.Member) {
	cc, err := s.conn(addr)
	if err != nil {
		return
	}
	wait := leaderLivenessWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	lctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, mdForwarded, s.node.ID()), wait)
	defer cancel()
	ls, err := dedupv1.NewAdminClient(cc).Status(lctx, &dedupv1.StatusRequest{})
	if err != nil || ls.GetState() != "leader" || ls.GetNodeId() != leaderID {
		return
	}
	byID := make(map[string]*dedupv1.Member, len(ls.GetMembers()))
	for _, m := range ls.GetMembers() {
		byID[m.GetId()] = m
	}
	for _, m := range members {
		if lm := byID[m.Id]; lm != nil {
			m.Reachability, m.UnreachableSinceUnixMs, m.LogLag, m.LastError = lm.Reachability, lm.UnreachableSinceUnixMs, lm.LogLag, lm.LastError
		}
	}
}

func statusPB(st cluster.Status) *dedupv1.StatusResponse {
	b := st.FSM.Bloom
	out := &dedupv1.StatusResponse{
		NodeId:            st.NodeID,
		ClusterId:         st.ClusterID,
		State:             st.State,
		LeaderId:          st.LeaderID,
		LeaderGrpcAddr:    st.LeaderGRPCAddr,
		Term:              st.Term,
		CommitIndex:       st.CommitIndex,
		AppliedIndex:      st.AppliedIndex,
		LastSnapshotIndex: st.LastSnapshotIndex,
		IdsStored:         st.FSM.IDsStored,
		LeaderTimeUnixMs:  st.FSM.LastTsMs,
		Buckets:           st.FSM.Buckets,
		Bloom: &dedupv1.BloomStatus{
			Filters:          b.Filters,
			MemoryBytes:      b.MemoryBytes,
			Ids:              b.IDs,
			BitsPerId:        b.BitsPerID,
			ConfiguredFpRate: b.FPRate,
			ObservedFpRate:   b.ObservedFPRate,
			MaybeLookups:     b.MaybeLookups,
			FalsePositives:   b.FalsePositives,
			Ready:            b.Ready,
		},
	}
	for _, m := range st.Members {
		pm := &dedupv1.Member{
			Id: m.ID, RaftAddr: m.RaftAddr, GrpcAddr: m.GRPCAddr, Suffrage: m.Suffrage, Leader: m.Leader, Region: m.Region,
			Reachability: reachabilityPB(m.Reachability), LogLag: m.LogLag, LastError: m.LastError,
		}
		if !m.UnreachableSince.IsZero() {
			pm.UnreachableSinceUnixMs = m.UnreachableSince.UnixMilli()
		}
		out.Members = append(out.Members, pm)
	}
	return out
}

func reachabilityPB(r cluster.Reachability) dedupv1.Reachability {
	switch r {
	case cluster.Reachable:
		return dedupv1.Reachability_REACHABILITY_REACHABLE
	case cluster.Unreachable:
		return dedupv1.Reachability_REACHABILITY_UNREACHABLE
	}
	return dedupv1.Reachability_REACHABILITY_UNKNOWN
}

// Join implements dedupv1.AdminServer: adds a node as a non-voter
// (promoted once caught up), or as a read replica (never promoted by the
// leader) with read_replica. Forwarded to the leader.
func (s *Server) Join(ctx context.Context, req *dedupv1.JoinRequest) (*dedupv1.JoinResponse, error) {
	for _, f := range []struct{ name, v string }{{"node_id", req.NodeId}, {"raft_addr", req.RaftAddr}, {"grpc_addr", req.GrpcAddr}} {
		if f.v == "" {
			return nil, toStatus(invalidf(f.name, "required"))
		}
	}
	// Checked here and again by the leader's cluster.Node.Join, before
	// any configuration change.
	if err := fsm.ValidateNodeID(req.NodeId); err != nil {
		return nil, toStatus(err)
	}
	if err := cluster.CheckHostPort(req.RaftAddr); err != nil {
		return nil, toStatus(invalidf("raft_addr", "%v", err))
	}
	if err := cluster.CheckHostPort(req.GrpcAddr); err != nil {
		return nil, toStatus(invalidf("grpc_addr", "%v", err))
	}
	err := s.onLeader(ctx, func(ctx context.Context) error {
		if req.ReadReplica {
			return s.node.JoinReplica(ctx, req.NodeId, req.RaftAddr, req.GrpcAddr)
		}
		return s.node.Join(ctx, req.NodeId, req.RaftAddr, req.GrpcAddr)
	}, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Join(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.JoinResponse{}, nil
}

// Remove implements dedupv1.AdminServer. Forwarded to the leader.
func (s *Server) Remove(ctx context.Context, req *dedupv1.RemoveRequest) (*dedupv1.RemoveResponse, error) {
	if req.NodeId == "" {
		return nil, toStatus(invalidf("node_id", "required"))
	}
	err := s.onLeader(ctx, func(ctx context.Context) error {
		return s.node.Remove(ctx, req.NodeId)
	}, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Remove(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &dedupv1.RemoveResponse{}, nil
}

// TransferLeadership implements dedupv1.AdminServer. Forwarded to the
// leader.
func (s *Server) TransferLeadership(ctx context.Context, req *dedupv1.TransferLeadershipRequest) (*dedupv1.TransferLeadershipResponse, error) {
	var out *dedupv1.TransferLeadershipResponse
	err := s.onLeader(ctx, func(ctx context.Context) error {
		id, err := s.node.TransferLeadership(ctx, req.NodeId)
		out = &dedupv1.TransferLeadershipResponse{NewLeaderId: id}
		return err
	}, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		out, err = dedupv1.NewAdminClient(cc).TransferLeadership(ctx, req)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}
