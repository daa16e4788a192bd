package client_test

// The single-attempt calls (MarkAt, CheckAt, ClaimAt, CommitAt) against
// real nodes: one attempt on the node named, the caller's request token,
// typed errors.

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
)

const (
	claimMethod  = dedupv1.Dedup_Claim_FullMethodName
	commitMethod = dedupv1.Dedup_Commit_FullMethodName
)

// Each *At call goes, once, to the node it names (a follower here, which
// forwards writes and linearizable reads itself), even though the client
// knows the leader and may retry; the client's view of the leader stays.
func TestAtCallsGoOnceToTheNamedNode(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	nodes, li := startNodes(t, 3, nil)
	l, f := nodes[li], nodes[(li+1)%3]
	c := newClient(t, []string{l.addr}, fastRetry(5))
	if c.Leader() != l.addr {
		t.Fatalf("leader after New = %q, want %q", c.Leader(), l.addr)
	}

	token := []byte("bench-token-0001")
	res, err := c.MarkAt(ctx, f.addr, "ns", items("a", "b"), time.Minute, token)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Code != client.CodeNew || string(r.ID) != []string{"a", "b"}[i] || r.Record == nil || r.Record.Expires.IsZero() {
			t.Fatalf("mark result %d = %+v, want new for %q with its record", i, r, []string{"a", "b"}[i])
		}
	}
	if res[0].Record == res[1].Record {
		t.Fatal("two results share one record")
	}
	checks, err := c.CheckAt(ctx, f.addr, "ns", [][]byte{[]byte("a"), []byte("x")}, client.Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	if checks[0].Code != client.CodeSeen || checks[1].Code != client.CodeNotSeen || checks[1].Record != nil {
		t.Fatalf("linearizable check after mark: %+v, want seen, not_seen", checks)
	}

	claims, err := c.ClaimAt(ctx, f.addr, "ns", items("job"), 0, []byte("bench-token-0002"))
	if err != nil {
		t.Fatal(err)
	}
	if claims[0].Code != client.CodeAcquired || claims[0].Record == nil || claims[0].Record.FencingToken == 0 {
		t.Fatalf("claim = %+v, want acquired with a fencing token", claims[0])
	}
	commits, err := c.CommitAt(ctx, f.addr, "ns", []client.Lease{{ID: []byte("job"), FencingToken: claims[0].Record.FencingToken, RequestToken: []byte("bench-token-0002")}}, time.Minute)
	if err != nil || commits[0].Code != client.CodeOK {
		t.Fatalf("commit = %+v, %v; want ok", commits, err)
	}

	for _, m := range []string{markMethod, checkMethod, claimMethod, commitMethod} {
		if f.faults.Calls(m) != 1 || l.faults.Calls(m) != 0 {
			t.Fatalf("%s: follower saw %d calls, leader %d; want 1 and 0", m, f.faults.Calls(m), l.faults.Calls(m))
		}
	}
	if c.Leader() != l.addr {
		t.Fatalf("leader after *At calls = %q, want %q still", c.Leader(), l.addr)
	}
}

// A failed *At call is not retried, whatever WithRetry says; its error is
// typed (a write whose reply was lost: ErrOutcomeUnknown), and trying again
// with the same request token returns the first answer.
func TestAtCallsMakeOneAttemptAndKeepTheCallersToken(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	var log rpcLog
	c := newClient(t, []string{n.addr}, fastRetry(5), client.WithDialOptions(log.interceptor()))

	token := []byte("bench-token-0003")
	n.faults.DropReplies(markMethod, 1)
	_, err := c.MarkAt(ctx, n.addr, "ns", items("lost"), 0, token)
	if !errors.Is(err, client.ErrOutcomeUnknown) || status.Code(err) != codes.Unavailable {
		t.Fatalf("mark with a lost reply: %v, want outcome unknown (Unavailable)", err)
	}
	if e := client.AsError(err); e == nil || e.Attempts != 1 || e.Addr != n.addr || e.Op != "mark" {
		t.Fatalf("error %+v: want one attempt of mark on %s", e, n.addr)
	}
	if got := n.faults.Calls(markMethod); got != 1 {
		t.Fatalf("mark attempts = %d, want 1", got)
	}
	res, err := c.MarkAt(ctx, n.addr, "ns", items("lost"), 0, token)
	if err != nil || res[0].Code != client.CodeNew {
		t.Fatalf("retry with the same token: %+v, %v; want the first answer, new", res, err)
	}
	res, err = c.MarkAt(ctx, n.addr, "ns", items("lost"), 0, []byte("bench-token-0004"))
	if err != nil || res[0].Code != client.CodeDuplicate {
		t.Fatalf("mark with another token: %+v, %v; want duplicate", res, err)
	}
	if got := len(log.of(markMethod)); got != 3 {
		t.Fatalf("client sent %d marks, want 3", got)
	}
	for i, m := range log.of(markMethod) {
		want := token
		if i == 2 {
			want = []byte("bench-token-0004")
		}
		if got := markToken(m); !bytes.Equal(got, want) {
			t.Fatalf("mark %d sent token %q, want %q", i, got, want)
		}
	}

	n.faults.FailNext(checkMethod, 1)
	_, err = c.CheckAt(ctx, n.addr, "ns", [][]byte{[]byte("lost")}, client.Stale)
	if status.Code(err) != codes.Unavailable || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("failed check: %v, want Unavailable (a read's outcome is never unknown)", err)
	}
	if got := n.faults.Calls(checkMethod); got != 1 {
		t.Fatalf("check attempts = %d, want 1", got)
	}
	_, err = c.CheckAt(ctx, n.addr, "ns", [][]byte{[]byte("lost")}, client.Bounded)
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("bounded check without a max staleness: %v, want ErrInvalidArgument", err)
	}
	_, err = c.MarkAt(ctx, n.addr, "ns", items("x"), 1500*time.Microsecond, nil)
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("ttl of 1.5ms: %v, want ErrInvalidArgument", err)
	}
}

// With the stream transport, *At calls are messages on the node's
// Pipeline (no unary RPC), with the same answers.
func TestAtCallsUseTheStreamTransport(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr}, client.WithPinnedNode(), client.WithTransport(client.TransportStream, 4),
		client.WithMaxStaleness(5*time.Second))
	res, err := c.MarkAt(ctx, n.addr, "ns", items("s1", "s2"), 0, []byte("bench-token-0005"))
	if err != nil || res[0].Code != client.CodeNew || res[1].Code != client.CodeNew {
		t.Fatalf("streamed mark: %+v, %v; want new, new", res, err)
	}
	checks, err := c.CheckAt(ctx, n.addr, "ns", [][]byte{[]byte("s2")}, client.Bounded)
	if err != nil || checks[0].Code != client.CodeSeen {
		t.Fatalf("streamed bounded check: %+v, %v; want seen", checks, err)
	}
	if n.faults.Calls(markMethod) != 0 || n.faults.Calls(checkMethod) != 0 {
		t.Fatalf("unary calls: %d marks, %d checks; want none (streamed)", n.faults.Calls(markMethod), n.faults.Calls(checkMethod))
	}
}
