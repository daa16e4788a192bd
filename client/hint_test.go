package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/client"
)

// A node that answers NOT_LEADER with the leader's address in the error
// details sends the retry straight there, without a Status round.
//
// The follower is real; two faults shape what the client sees: its Status
// fails (so discovery learns no leader and the client starts on the
// follower), and it handles the client's Mark as a call forwarded by
// another node, which a real non-leader answers with NOT_LEADER naming the
// leader instead of forwarding it.
func TestNotLeaderHintRedirectsTheRetry(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	nodes, li := startNodes(t, 3, nil)
	l, f := nodes[li], nodes[(li+1)%3]
	f.faults.FailNext(statusMethod, 1<<30)
	f.faults.Wrap(markMethod, func(ctx context.Context, req any, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return h(metadata.NewIncomingContext(ctx, metadata.Join(md, metadata.Pairs(forwardedHeader, "test"))), req)
	})

	var log rpcLog
	c := newClient(t, []string{f.addr}, fastRetry(3), client.WithDialOptions(log.interceptor()))
	if c.Leader() != "" {
		t.Fatalf("leader %q known before the hint", c.Leader())
	}
	res, err := c.Mark(ctx, "ns", items("x"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeNew || l.faults.Calls(markMethod) != 1 {
		t.Fatalf("result %v, leader mark calls %d; want new via the hinted leader", res[0].Code, l.faults.Calls(markMethod))
	}
	if c.Leader() != l.addr {
		t.Fatalf("leader = %q, want the hinted %q", c.Leader(), l.addr)
	}
	// One Status: before the write goes to a node it has not talked to,
	// the client checks that node's cluster ID (clusterid.go); the hint
	// alone leads it there, without a discovery round.
	if n := l.faults.Calls(statusMethod); n != 1 {
		t.Fatalf("the client asked the leader for its status %d times; want once, its cluster check", n)
	}
	marks := log.of(markMethod)
	if len(marks) != 2 || marks[0].target != f.addr || marks[1].target != l.addr {
		t.Fatalf("marks went to %v, want the follower then the leader", marks)
	}
	var hinted bool
	st, _ := status.FromError(marks[0].err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "NOT_LEADER" && info.GetMetadata()["leader_grpc_addr"] == l.addr {
			hinted = true
		}
	}
	if !hinted {
		t.Fatalf("the follower answered %v, want NOT_LEADER naming %s", marks[0].err, l.addr)
	}
}
