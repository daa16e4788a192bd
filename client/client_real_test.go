package client_test

// The Client's routing, retries and result mapping against real nodes
// (startNodes, startCluster); faults are injected on the server side (see
// faults_test.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/server"
)

const (
	markMethod   = dedupv1.Dedup_Mark_FullMethodName
	checkMethod  = dedupv1.Dedup_Check_FullMethodName
	forgetMethod = dedupv1.Dedup_Forget_FullMethodName
	statusMethod = dedupv1.Admin_Status_FullMethodName
)

// fastRetry retries quickly: for nodes that fail on purpose, not for
// elections.
func fastRetry(attempts int) client.Option {
	return client.WithRetry(attempts, time.Millisecond, 10*time.Millisecond)
}

func items(ids ...string) []client.Item {
	out := make([]client.Item, len(ids))
	for i, id := range ids {
		out[i] = client.Item{ID: []byte(id)}
	}
	return out
}

func markToken(c rpcCall) []byte { return c.req.(*dedupv1.MarkRequest).GetRequestToken() }

// A Mark whose reply is lost after the node applied it is retried with the
// same request token and returns the original NEW, not DUPLICATE (README
// Guarantees (7), client side).
func TestMarkRetryAfterLostReplyReturnsOriginalNew(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	var log rpcLog
	c := newClient(t, []string{n.addr}, fastRetry(5), client.WithDialOptions(log.interceptor()))
	n.faults.DropReplies(markMethod, 2)

	res, err := c.Mark(ctx, "ns", items("a", "b"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Code != client.CodeNew {
			t.Fatalf("%s: got %v after retries, want new", r.ID, r.Code)
		}
	}
	if got := n.faults.Calls(markMethod); got != 3 {
		t.Fatalf("mark attempts = %d, want 3", got)
	}
	marks := log.of(markMethod)
	if len(marks) != 3 {
		t.Fatalf("client sent %d marks, want 3", len(marks))
	}
	first := markToken(marks[0])
	if len(first) != 16 {
		t.Fatalf("request token %x: want 16 bytes", first)
	}
	for i, m := range marks {
		if !bytes.Equal(markToken(m), first) {
			t.Fatalf("attempt %d carried token %x, first carried %x", i, markToken(m), first)
		}
	}
	if !bytes.Equal(res[0].Record.RequestToken, first) {
		t.Fatalf("record token %x, want the call's %x", res[0].Record.RequestToken, first)
	}
	// A new logical call carries a new token and sees the duplicate.
	res, err = c.Mark(ctx, "ns", items("a"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeDuplicate {
		t.Fatalf("second mark: %v, want duplicate", res[0].Code)
	}
	if marks = log.of(markMethod); len(marks) != 4 || bytes.Equal(markToken(marks[3]), first) {
		t.Fatalf("a new call reused the previous call's request token (%d marks)", len(marks))
	}
}

// Given only a follower's address, the client learns the leader and sends
// writes and linearizable reads there, stale reads to the follower.
func TestWritesGoToTheLeader(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	nodes, li := startNodes(t, 3, nil)
	l, f := nodes[li], nodes[(li+1)%3]

	c := newClient(t, []string{f.addr}, fastRetry(3))
	if c.Leader() != l.addr {
		t.Fatalf("leader after New = %q, want %q", c.Leader(), l.addr)
	}
	if _, err := c.Mark(ctx, "ns", items("x"), 0); err != nil {
		t.Fatal(err)
	}
	if f.faults.Calls(markMethod) != 0 || l.faults.Calls(markMethod) != 1 {
		t.Fatalf("mark calls: follower %d leader %d, want 0 and 1", f.faults.Calls(markMethod), l.faults.Calls(markMethod))
	}
	// A stale check answers from the follower's own state: wait until it
	// has applied the mark (and the namespace its first write created),
	// else it rightly answers NotFound.
	ls, err := l.srv.Node().Status()
	if err != nil {
		t.Fatal(err)
	}
	for {
		fs, err := f.srv.Node().Status()
		if err != nil {
			t.Fatal(err)
		}
		if fs.AppliedIndex >= ls.AppliedIndex {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("follower applied %d, leader %d: %v", fs.AppliedIndex, ls.AppliedIndex, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := c.Check(ctx, "ns", [][]byte{[]byte("x")}, client.Stale); err != nil {
		t.Fatal(err)
	}
	res, err := c.Check(ctx, "ns", [][]byte{[]byte("x")}, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeSeen {
		t.Fatalf("linearizable check after mark: %v, want seen", res[0].Code)
	}
	if f.faults.Calls(checkMethod) != 1 || l.faults.Calls(checkMethod) != 1 {
		t.Fatalf("check calls: follower %d leader %d, want 1 and 1", f.faults.Calls(checkMethod), l.faults.Calls(checkMethod))
	}
}

// WithPinnedNode sends every call to the one node given (it forwards
// writes to its leader itself); the client discovers no leader and learns
// no other node.
func TestPinnedNodeSendsEveryCallToIt(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	nodes, li := startNodes(t, 3, nil)
	f := nodes[(li+1)%3]

	c := newClient(t, []string{f.addr}, fastRetry(3), client.WithPinnedNode())
	if c.Leader() != "" {
		t.Fatalf("pinned client discovered leader %q", c.Leader())
	}
	res, err := c.Mark(ctx, "ns", items("p"), 0)
	if err != nil || res[0].Code != client.CodeNew {
		t.Fatalf("mark through a follower: %v %v", res, err)
	}
	if _, err := c.Check(ctx, "ns", [][]byte{[]byte("p")}, client.Linearizable); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatusOf(ctx, f.addr); err != nil {
		t.Fatal(err)
	}
	if f.faults.Calls(markMethod) != 1 || f.faults.Calls(checkMethod) != 1 {
		t.Fatalf("follower saw %d marks and %d checks, want 1 and 1", f.faults.Calls(markMethod), f.faults.Calls(checkMethod))
	}
	if got := c.Addrs(); len(got) != 1 || got[0] != f.addr || c.Leader() != "" {
		t.Fatalf("pinned client knows %v, leader %q; want only %s", got, c.Leader(), f.addr)
	}
}

// When the leader dies, calls ride out the election and the client
// follows the new leader.
func TestLeaderChangeIsFollowed(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	c := newClient(t, cl.Addrs())
	if _, err := c.Mark(ctx, "ns", items("1"), 0); err != nil {
		t.Fatal(err)
	}
	killed, err := cl.KillLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Mark(ctx, "ns", items("1", "2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeDuplicate || res[1].Code != client.CodeNew {
		t.Fatalf("after failover: %v %v, want duplicate new", res[0].Code, res[1].Code)
	}
	// The call may have succeeded through a follower that forwarded it;
	// the next call to the leader finds the new one.
	testcluster.WaitFor(t, 60*time.Second, "the client to follow the new leader", func() bool {
		if _, err := c.Check(ctx, "ns", [][]byte{[]byte("2")}, client.Linearizable); err != nil {
			return false
		}
		li := cl.Leader()
		return li >= 0 && c.Leader() == cl.Addrs()[li]
	})
	if c.Leader() == cl.Addrs()[killed] {
		t.Fatalf("client still names the killed leader %s", c.Leader())
	}
}

func TestNonRetryableErrorsFailAtOnce(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, func(cfg *server.Config) { cfg.AutoCreateNamespaces = false })
	c := newClient(t, []string{n.addr}, fastRetry(5))

	// An ID longer than any namespace allows: the node refuses it (an
	// empty ID the client refuses itself, sending nothing).
	_, err := c.Mark(ctx, "ns", items("ok", strings.Repeat("x", 5000)), 0)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ID over 4096 bytes: %v, want InvalidArgument", err)
	}
	_, err = c.Mark(ctx, "missing", items("a"), 0)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown namespace: %v, want NotFound", err)
	}
	if got := n.faults.Calls(markMethod); got != 2 {
		t.Fatalf("mark attempts = %d, want 2 (no retries)", got)
	}
}

func TestRetriesStopAtMaxAttempts(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr}, fastRetry(4))
	n.faults.FailNext(markMethod, 100)
	_, err := c.Mark(ctx, "ns", items("a"), 0)
	if status.Code(err) != codes.Unavailable || !client.IsRetryable(err) {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if got := n.faults.Calls(markMethod); got != 4 {
		t.Fatalf("attempts = %d, want 4", got)
	}
}

func TestRetryIfStopsTheRetries(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	var seen []error
	c := newClient(t, []string{n.addr}, fastRetry(10), client.WithRetryIf(func(err error) bool {
		seen = append(seen, err)
		return len(seen) < 2
	}))
	n.faults.FailNext(markMethod, 100)
	_, err := c.Mark(ctx, "ns", items("a"), 0)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if got := n.faults.Calls(markMethod); got != 2 || len(seen) != 2 {
		t.Fatalf("attempts = %d, RetryIf calls = %d; want 2 and 2", got, len(seen))
	}
}

// A call whose attempts keep failing retries until the caller's context
// ends, then returns the context's error. The context ends once the
// client has retried twice: a deadline short enough to keep the test
// quick could pass on a loaded machine before the first attempt was made.
func TestRetriesAreBoundedByTheCallersContext(t *testing.T) {
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr}, client.WithRetry(1<<20, 20*time.Millisecond, 50*time.Millisecond))
	n.faults.FailNext(markMethod, 1<<30)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Mark(ctx, "ns", items("a"), 0)
		done <- err
	}()
	testcluster.WaitFor(t, 60*time.Second, "three mark attempts", func() bool { return n.faults.Calls(markMethod) >= 3 })
	cancel()
	// Without the bound, 2^20 attempts would take hours: wait for the call
	// to return, with a deadline generous enough for two loaded cores under
	// -race, rather than time it.
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Mark still retrying 30s after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestUnreachableClusterFailsWithUnavailable(t *testing.T) {
	// Nothing listens on this port: it was just closed.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx := testCtx(t, 30*time.Second)
	c, err := client.New(ctx, []string{addr}, fastRetry(3))
	if err != nil {
		t.Fatalf("New must not fail when nodes are down: %v", err)
	}
	defer c.Close()
	_, err = c.Check(ctx, "", [][]byte{[]byte("a")}, client.Linearizable)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
}

func TestResultsKeepRequestOrderAndRecords(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr})
	dg := client.Digest([]byte("body"))
	before := time.Now().Truncate(time.Millisecond)
	if _, err := c.Mark(ctx, "ns", []client.Item{{ID: []byte("b"), Digest: dg}}, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	res, err := c.Check(ctx, "ns", [][]byte{[]byte("a"), []byte("b"), []byte("c")}, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	want := []client.Code{client.CodeNotSeen, client.CodeSeen, client.CodeNotSeen}
	for i, r := range res {
		if r.Code != want[i] {
			t.Fatalf("result %d (%s) = %v, want %v", i, r.ID, r.Code, want[i])
		}
	}
	rec := res[1].Record
	if rec == nil || res[0].Record != nil || res[2].Record != nil {
		t.Fatalf("records: %+v %+v %+v", res[0].Record, rec, res[2].Record)
	}
	if rec.State != client.StateCommitted || rec.Expires.Sub(rec.FirstSeen) != 90*time.Second || !bytes.Equal(rec.Digest, dg) {
		t.Fatalf("record = %+v", rec)
	}
	if rec.FirstSeen.Location() != time.UTC || rec.FirstSeen.Before(before) || rec.FirstSeen.After(after) {
		t.Fatalf("first seen = %v, want UTC within [%v, %v]", rec.FirstSeen, before, after)
	}
	other := client.Digest([]byte("other body"))
	res, err = c.Mark(ctx, "ns", []client.Item{{ID: []byte("b"), Digest: other}}, 0)
	if err != nil || res[0].Code != client.CodeConflict {
		t.Fatalf("reused id with new digest: %v %v, want conflict", res, err)
	}
}

// Lease results map per item; a reply with fewer results than items (here
// the node's real reply, cut short on its way out) is an error.
func TestLeaseCallsAndShortReplies(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr})
	cl, err := c.Claim(ctx, "ns", items("a", "b"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cl {
		if r.Code != client.CodeAcquired || r.Record == nil {
			t.Fatalf("claim %s: %v, want acquired", r.ID, r.Code)
		}
	}
	res, err := c.Commit(ctx, "ns", []client.Lease{
		{ID: []byte("a"), FencingToken: cl[0].Record.FencingToken, RequestToken: cl[0].Record.RequestToken},
		{ID: []byte("b"), FencingToken: cl[1].Record.FencingToken + 1000, RequestToken: cl[1].Record.RequestToken},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != client.CodeOK || res[1].Code != client.CodeLeaseLost || string(res[1].ID) != "b" {
		t.Fatalf("commit results = %+v", res)
	}

	n.faults.Wrap(forgetMethod, func(ctx context.Context, req any, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if r, ok := resp.(*dedupv1.ForgetResponse); ok && len(r.Results) > 0 {
			r.Results = r.Results[:len(r.Results)-1]
		}
		return resp, err
	})
	if _, err := c.Forget(ctx, "ns", [][]byte{[]byte("a"), []byte("b")}); err == nil {
		t.Fatal("a reply with fewer results than items must be an error")
	}
}

func TestNamespaceRoundTrip(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, func(cfg *server.Config) { cfg.AutoCreateNamespaces = false })
	c := newClient(t, []string{n.addr})
	in := client.Namespace{Name: "orders", DefaultTTL: time.Hour, MaxTTL: 48 * time.Hour, MaxIDBytes: 128, Mode: client.ExpirySliding, DefaultLease: 10 * time.Second}
	got, err := c.CreateNamespace(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if got.BucketWidth <= 0 {
		t.Fatalf("created %+v: want the server's bucket width", got)
	}
	in.BucketWidth = got.BucketWidth
	if got != in {
		t.Fatalf("created %+v, want %+v", got, in)
	}
	desc, err := c.DescribeNamespace(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if desc != in {
		t.Fatalf("described %+v, want %+v", desc, in)
	}
}

// Status goes to the leader and teaches the client every member; StatusOf
// asks one node.
func TestStatusLearnsMembers(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 60*time.Second)
	li, err := cl.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi := (li + 1) % cl.Size()
	leaderID, followerAddr := cl.NodeID(li), cl.Addrs()[fi]
	c := newClient(t, []string{followerAddr})
	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeID != leaderID || s.State != "leader" || s.LeaderID != leaderID || s.LeaderGRPCAddr != cl.Addrs()[li] || s.Term == 0 {
		t.Fatalf("status = %+v, want leader %s's view", s, leaderID)
	}
	if len(s.Members) != cl.Size() {
		t.Fatalf("members = %+v, want %d", s.Members, cl.Size())
	}
	for _, m := range s.Members {
		if m.Leader != (m.ID == leaderID) || m.Suffrage != "voter" || indexOf(cl.Addrs(), m.GRPCAddr) < 0 {
			t.Fatalf("member %+v (leader %s)", m, leaderID)
		}
	}
	if addrs := c.Addrs(); len(addrs) != cl.Size() {
		t.Fatalf("known addrs = %v, want every node's", addrs)
	}
	s, err = c.StatusOf(ctx, followerAddr)
	if err != nil || s.NodeID != cl.NodeID(fi) || s.State != "follower" {
		t.Fatalf("StatusOf(follower) = %+v, %v", s, err)
	}
	js, _ := json.Marshal(s)
	for _, k := range []string{`"node_id":"` + cl.NodeID(fi) + `"`, `"leader_id":"` + leaderID + `"`, `"members":[{"id":"`, `"suffrage":"voter"`, `"term":`} {
		if !bytes.Contains(js, []byte(k)) {
			t.Fatalf("status JSON %s lacks %s", js, k)
		}
	}
}
