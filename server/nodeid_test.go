package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/fsm"
)

// TestJoin_InvalidNodeIDIsInvalidArgument: Admin.Join with a node ID the
// FSM cannot record (longer than fsm.MaxNodeIDBytes) fails with
// INVALID_ARGUMENT naming node_id and the limit, through the leader and
// through a follower, and the configuration keeps its members. (It used to
// add the ID to Raft and then fail on the rejected OpSetNode, leaving a
// member that could never be removed.)
func TestJoin_InvalidNodeIDIsInvalidArgument(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 2})
	l := tc.leader()
	long := strings.Repeat("x", fsm.MaxNodeIDBytes+1)
	for _, nd := range tc.live() {
		for _, replica := range []bool{false, true} {
			_, err := nd.admin.Join(rpcCtx(t), &dedupv1.JoinRequest{NodeId: long, RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:1", ReadReplica: replica})
			wantStatus(t, err, codes.InvalidArgument, "node_id")
			wantStatus(t, err, codes.InvalidArgument, "longer than the 128 bytes")
		}
		_, err := nd.admin.Join(rpcCtx(t), &dedupv1.JoinRequest{NodeId: " n3", RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:1"})
		wantStatus(t, err, codes.InvalidArgument, "node_id")
	}
	st, err := l.admin.Status(rpcCtx(t), &dedupv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 2 {
		t.Fatalf("members after refused joins: %d, want 2", len(st.Members))
	}
}

// TestJoin_InvalidAddressIsInvalidArgument: Admin.Join with a Raft or gRPC
// address that is not HOST:PORT fails with INVALID_ARGUMENT naming the
// field, and the configuration keeps its members (join --force --raft-addr
// nonsense used to record "nonsense").
func TestJoin_InvalidAddressIsInvalidArgument(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1})
	l := tc.leader()
	_, err := l.admin.Join(rpcCtx(t), &dedupv1.JoinRequest{NodeId: "n4", RaftAddr: "nonsense", GrpcAddr: "127.0.0.1:17073"})
	wantStatus(t, err, codes.InvalidArgument, `raft_addr: "nonsense": want HOST:PORT`)
	_, err = l.admin.Join(rpcCtx(t), &dedupv1.JoinRequest{NodeId: "n4", RaftAddr: "127.0.0.1:17003", GrpcAddr: "127.0.0.1:99999"})
	wantStatus(t, err, codes.InvalidArgument, "grpc_addr")
	st, err := l.admin.Status(rpcCtx(t), &dedupv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 1 {
		t.Fatalf("members after refused joins: %+v", st.Members)
	}
}
