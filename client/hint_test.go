package client_test

import (
	"context"
	"fmt"
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
//
// The scenario needs the leader to lead throughout: when an election on a
// loaded machine moves the leadership meanwhile (another Raft term), what
// the client saw says nothing about hints, and it runs again on a fresh
// cluster, at most 5 times.
func TestNotLeaderHintRedirectsTheRetry(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	for round := 1; ; round++ {
		nodes, li := startNodes(t, 3, nil)
		l := nodes[li]
		term := leadingTerm(l.srv)
		err := hintRedirects(t, ctx, l, nodes[(li+1)%3])
		if err == nil {
			return
		}
		now := leadingTerm(l.srv)
		if term != 0 && now == term {
			t.Fatalf("%v (the leader led throughout, term %d)", err, term)
		}
		if round == 5 {
			t.Fatalf("the leadership moved during each of %d rounds; last: %v", round, err)
		}
		t.Logf("round %d: the leadership moved (term %d, now %d; 0 = not leading): %v; again", round, term, now, err)
	}
}

// hintRedirects runs the scenario against leader l and follower f and says
// what went otherwise than expected.
func hintRedirects(t *testing.T, ctx context.Context, l, f *realNode) error {
	f.faults.FailNext(statusMethod, 1<<30)
	f.faults.Wrap(markMethod, func(ctx context.Context, req any, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return h(metadata.NewIncomingContext(ctx, metadata.Join(md, metadata.Pairs(forwardedHeader, "test"))), req)
	})

	var log rpcLog
	c := newClient(t, []string{f.addr}, fastRetry(3), client.WithDialOptions(log.interceptor()))
	if c.Leader() != "" {
		return fmt.Errorf("leader %q known before the hint", c.Leader())
	}
	res, err := c.Mark(ctx, "ns", items("x"), 0)
	if err != nil {
		return err
	}
	if res[0].Code != client.CodeNew || l.faults.Calls(markMethod) != 1 {
		return fmt.Errorf("result %v, leader mark calls %d; want new via the hinted leader", res[0].Code, l.faults.Calls(markMethod))
	}
	if c.Leader() != l.addr {
		return fmt.Errorf("leader = %q, want the hinted %q", c.Leader(), l.addr)
	}
	// One Status: before the write goes to a node it has not talked to,
	// the client checks that node's cluster ID (clusterid.go); the hint
	// alone leads it there, without a discovery round.
	if n := l.faults.Calls(statusMethod); n != 1 {
		return fmt.Errorf("the client asked the leader for its status %d times; want once, its cluster check", n)
	}
	marks := log.of(markMethod)
	if len(marks) != 2 || marks[0].target != f.addr || marks[1].target != l.addr {
		return fmt.Errorf("marks went to %v, want the follower then the leader", marks)
	}
	var hinted bool
	st, _ := status.FromError(marks[0].err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "NOT_LEADER" && info.GetMetadata()["leader_grpc_addr"] == l.addr {
			hinted = true
		}
	}
	if !hinted {
		return fmt.Errorf("the follower answered %v, want NOT_LEADER naming %s", marks[0].err, l.addr)
	}
	return nil
}
