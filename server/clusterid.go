package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

// The cluster ID on the wire (cluster/DESIGN.md, Cluster ID): every answer
// carries this node's in the dedupnode-cluster-id response header, and
// every answer this node gets from a peer (a forwarded call, a read index,
// a probe) is checked against it.

// cachedIDHeader is the response header naming a cluster, built once per
// ID: every answer carries it, and grpc copies it into the call's own
// header (metadata.Join), so one map serves every call read-only.
type cachedIDHeader struct {
	id string
	md metadata.MD
}

// clusterIDHeader returns the response header naming this node's cluster,
// nil while the node has not applied its ID.
func (s *Server) clusterIDHeader() metadata.MD {
	id := s.node.ClusterID()
	if id == "" {
		return nil
	}
	if h := s.idHeader.Load(); h != nil && h.id == id {
		return h.md
	}
	h := &cachedIDHeader{id: id, md: metadata.Pairs(dedupv1.HeaderClusterID, id)}
	s.idHeader.Store(h)
	return h.md
}

// unaryClusterID sets the header before the handler runs, so errors carry
// it too (grpc-go sends set headers ahead of an error status).
func (s *Server) unaryClusterID(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if md := s.clusterIDHeader(); md != nil {
		_ = grpc.SetHeader(ctx, md) // fails only on a stream whose header went out: not here
	}
	return h(ctx, req)
}

// streamClusterID sends the header as the stream opens, not with its first
// answer: a client learns the cluster before its first call on the stream
// is answered. No handler sets headers of its own.
func (s *Server) streamClusterID(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if md := s.clusterIDHeader(); md != nil {
		if err := ss.SendHeader(md); err != nil {
			return err // the stream is gone
		}
	}
	return h(srv, ss)
}

// checkPeer compares the cluster ID a peer at addr sent in md with this
// node's. Either side without an ID (an older version, a node catching up)
// passes: there is nothing to compare.
func (s *Server) checkPeer(addr string, md metadata.MD) error {
	ours := s.node.ClusterID()
	v := md.Get(dedupv1.HeaderClusterID)
	if ours == "" || len(v) == 0 || v[0] == "" || v[0] == ours {
		return nil
	}
	return &cluster.ClusterMismatchError{Ours: ours, Theirs: v[0], Addr: addr}
}

// probeClusterID is the cluster's join probe: the joining node's cluster
// ID from its Admin.Status (checked by peerUnary on the way: a mismatch
// comes back as *cluster.ClusterMismatchError).
func (s *Server) probeClusterID(ctx context.Context, id, grpcAddr string) (string, error) {
	c, err := s.conn(grpcAddr)
	if err != nil {
		return "", err
	}
	st, err := dedupv1.NewAdminClient(c).Status(ctx, &dedupv1.StatusRequest{})
	var mm *cluster.ClusterMismatchError
	if errors.As(err, &mm) {
		mm.NodeID = id
	}
	if err != nil {
		return "", err
	}
	if st.NodeId != id {
		return "", fmt.Errorf("node at %s is %q, not %q", grpcAddr, st.NodeId, id)
	}
	return st.ClusterId, nil
}
