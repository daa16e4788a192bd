package client_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// killAfterApply returns a dial option that lets the first call of method
// reach the real leader and be applied, then kills that node before the
// client sees the reply, and hands the client Unavailable instead: the
// leader died between apply and reply.
func killAfterApply(t *testing.T, c *devcluster.Cluster, method string, fired *atomic.Bool) grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, m, req, reply, cc, opts...)
		if m != method || err != nil || fired.Load() {
			return err
		}
		i := indexOf(c.Addrs(), cc.Target())
		if i < 0 {
			t.Errorf("call went to unknown address %s", cc.Target())
			return err
		}
		if c.Leader() != i {
			return err // answered by a follower forwarding; wait for a direct hit
		}
		fired.Store(true)
		if kerr := c.Kill(i); kerr != nil {
			t.Errorf("kill leader: %v", kerr)
		}
		return status.Error(codes.Unavailable, "test: leader killed after apply, reply lost")
	})
}

// README Guarantees (7) (retries are safe), client side, on real nodes: a
// Mark applied by the leader, which is then killed before replying, is
// retried by the client with the same request token against the new leader
// and returns the original NEW, not DUPLICATE.
func TestInvariant7LeaderKilledBetweenApplyAndReplyRetryReturnsOriginalNew(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	var fired atomic.Bool
	var log rpcLog
	c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor(), killAfterApply(t, cl, "/dedup.v1.Dedup/Mark", &fired)))

	res, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("order-456-created")}, {ID: []byte("order-457-created")}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !fired.Load() {
		t.Fatal("the leader was never killed after applying the mark")
	}
	for _, r := range res {
		if r.Code != client.CodeNew {
			t.Fatalf("%s: %v after the leader died between apply and reply, want new", r.ID, r.Code)
		}
	}
	marks := log.of("/dedup.v1.Dedup/Mark")
	if len(marks) < 2 {
		t.Fatalf("got %d mark attempts, want the killed one and at least one retry", len(marks))
	}
	first := marks[0].req.(*dedupv1.MarkRequest).GetRequestToken()
	for i, m := range marks {
		if tok := m.req.(*dedupv1.MarkRequest).GetRequestToken(); !bytes.Equal(tok, first) {
			t.Fatalf("attempt %d carried token %x, first carried %x", i, tok, first)
		}
	}
	if marks[len(marks)-1].target == marks[0].target {
		t.Fatalf("the successful retry went to the killed node %s", marks[0].target)
	}

	// Another caller (a new logical call, a new token) sees the duplicate,
	// and the record names the first call's token.
	other := newClient(t, cl.Addrs())
	res, err = other.Mark(ctx, "orders", []client.Item{{ID: []byte("order-456-created")}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeDuplicate || res[0].Record == nil || !bytes.Equal(res[0].Record.RequestToken, first) {
		t.Fatalf("second caller: %v record %+v, want duplicate recorded by token %x", res[0].Code, res[0].Record, first)
	}

	// The killed node comes back and agrees.
	if err := cl.Restart(ctx, indexOf(cl.Addrs(), marks[0].target)); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 60*time.Second, "the restarted node to see the mark", func() bool {
		r, err := other.Check(ctx, "orders", [][]byte{[]byte("order-457-created")}, client.Stale)
		return err == nil && r[0].Code == client.CodeSeen && other.Leader() != ""
	})
}

// The same for Claim: the retry returns ACQUIRED with the original fencing
// token, so the caller can commit what it processes.
func TestInvariant7LeaderKilledBetweenClaimAndReplyRetryReturnsAcquired(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	var fired atomic.Bool
	c := newClient(t, cl.Addrs(), client.WithDialOptions(killAfterApply(t, cl, "/dedup.v1.Dedup/Claim", &fired)))

	res, err := c.Claim(ctx, "jobs", []client.Item{{ID: []byte("job-1")}}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !fired.Load() {
		t.Fatal("the leader was never killed after applying the claim")
	}
	if res[0].Code != client.CodeAcquired || res[0].Record == nil {
		t.Fatalf("claim after the leader died: %v, want acquired", res[0].Code)
	}
	lease, _ := res[0].Lease()
	cm, err := c.Commit(ctx, "jobs", []client.Lease{lease}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cm[0].Code != client.CodeOK {
		t.Fatalf("commit with the retried claim's fencing token: %v, want ok", cm[0].Code)
	}
}

// README Guarantees (1) and (7) through the Batcher, with the leader killed
// while batches are in flight: two consumers race to Mark the same IDs,
// each ID from its own goroutine; every call returns, and for every ID
// exactly one of the two got NEW. A retry that lost its token would turn
// the winner's NEW into DUPLICATE and leave an ID with no winner.
func TestInvariant1BatchedRaceAcrossLeaderKillHasExactlyOneWinner(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 120*time.Second)
	const n = 300
	idList := ids("race", n)
	var done atomic.Int64
	got := make([][2]client.Code, n)
	errs := make(chan error, 2*n)

	var wg sync.WaitGroup
	for side := range 2 {
		c := newClient(t, cl.Addrs())
		b := c.NewBatcher(client.WithMaxBatch(16), client.WithMaxInflight(2))
		t.Cleanup(func() { b.Close() })
		for i, id := range idList {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := b.Mark(ctx, "race", client.Item{ID: id}, time.Hour)
				if err != nil {
					errs <- err
					return
				}
				got[i][side] = r.Code
				done.Add(1)
			}()
		}
	}
	testcluster.WaitFor(t, 60*time.Second, "some marks to complete before the kill", func() bool { return done.Load() >= n/4 })
	killed, err := cl.KillLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("mark failed across the leader kill: %v", err)
	}
	for i, c := range got {
		news := 0
		for _, code := range c {
			switch code {
			case client.CodeNew:
				news++
			case client.CodeDuplicate:
			default:
				t.Fatalf("%s: unexpected %v", idList[i], code)
			}
		}
		if news != 1 {
			t.Fatalf("%s: %d winners (%v), want exactly 1", idList[i], news, c)
		}
	}
	if err := cl.Restart(ctx, killed); err != nil {
		t.Fatal(err)
	}
}
