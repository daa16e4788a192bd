package client

import (
	"context"
	"net"
	"testing"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A node that answers NOT_LEADER with the leader's address in the error
// details sends the retry straight there, without a Status round.
func TestNotLeaderHintRedirectsTheRetry(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	l := startFake(t, st, "leader")
	// No leader known through Status: only the error hint names it.
	st.leader = nil

	hinted := status.New(codes.Unavailable, "not the raft leader")
	hinted, err := hinted.WithDetails(&errdetails.ErrorInfo{
		Reason:   "NOT_LEADER",
		Domain:   "dedupnode",
		Metadata: map[string]string{"leader_id": "leader", "leader_grpc_addr": l.addr},
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{id: "follower", addr: lis.Addr().String(), store: st, calls: map[string]int{}}
	f.srv = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == dedupv1.Dedup_Mark_FullMethodName {
			return nil, hinted.Err()
		}
		return h(ctx, req)
	}))
	dedupv1.RegisterDedupServer(f.srv, f)
	dedupv1.RegisterAdminServer(f.srv, f)
	go func() { _ = f.srv.Serve(lis) }()
	t.Cleanup(f.srv.Stop)

	c, err := New(ctx, []string{f.addr}, fastRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Mark(ctx, "ns", items("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != CodeNew || l.count("mark") != 1 {
		t.Fatalf("result %v, leader mark calls %d; want new via the hinted leader", res[0].Code, l.count("mark"))
	}
	if c.Leader() != l.addr {
		t.Fatalf("leader = %q, want the hinted %q", c.Leader(), l.addr)
	}
}
