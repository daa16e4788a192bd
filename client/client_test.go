package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func fastRetry(attempts int) Option {
	return WithRetry(attempts, time.Millisecond, 10*time.Millisecond)
}

func items(ids ...string) []Item {
	out := make([]Item, len(ids))
	for i, id := range ids {
		out[i] = Item{ID: []byte(id)}
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A Mark whose reply is lost after it was applied is retried with the same
// request token and returns the original NEW, not DUPLICATE (DESIGN
// invariant 7, client side).
func TestMarkRetryAfterLostReplyReturnsOriginalNew(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n1")
	st.leader = n
	n.dropReplies = 2

	c, err := New(ctx, []string{n.addr}, fastRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Mark(ctx, "ns", items("a", "b"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Code != CodeNew {
			t.Fatalf("%s: got %v after retries, want new", r.ID, r.Code)
		}
	}
	if got := n.count("mark"); got != 3 {
		t.Fatalf("mark attempts = %d, want 3", got)
	}
	if len(n.tokens) != 3 || len(n.tokens[0]) != 16 || !bytes.Equal(n.tokens[0], n.tokens[2]) {
		t.Fatalf("request tokens across retries differ or wrong size: %x", n.tokens)
	}
	// A new logical call carries a new token and sees the duplicate.
	res, err = c.Mark(ctx, "ns", items("a"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != CodeDuplicate {
		t.Fatalf("second mark: %v, want duplicate", res[0].Code)
	}
	if bytes.Equal(n.tokens[3], n.tokens[0]) {
		t.Fatal("a new call reused the previous call's request token")
	}
}

func TestWritesGoToTheLeader(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	f := startFake(t, st, "follower")
	l := startFake(t, st, "leader")
	st.leader = l

	c, err := New(ctx, []string{f.addr}, fastRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Leader() != l.addr {
		t.Fatalf("leader after New = %q, want %q", c.Leader(), l.addr)
	}
	if _, err := c.Mark(ctx, "ns", items("x"), 0); err != nil {
		t.Fatal(err)
	}
	if f.count("mark") != 0 || l.count("mark") != 1 {
		t.Fatalf("mark calls: follower %d leader %d, want 0 and 1", f.count("mark"), l.count("mark"))
	}
	// Stale reads go to the current node, linearizable ones to the leader.
	if _, err := c.Check(ctx, "ns", [][]byte{[]byte("x")}, Stale); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx, "ns", [][]byte{[]byte("x")}, Linearizable); err != nil {
		t.Fatal(err)
	}
	if f.count("check") != 1 || l.count("check") != 1 {
		t.Fatalf("check calls: follower %d leader %d, want 1 and 1", f.count("check"), l.count("check"))
	}
}

func TestLeaderChangeIsFollowed(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	a := startFake(t, st, "a")
	b := startFake(t, st, "b")
	st.leader = a

	c, err := New(ctx, []string{a.addr, b.addr}, fastRetry(10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Mark(ctx, "ns", items("1"), 0); err != nil {
		t.Fatal(err)
	}
	// The leader dies; b takes over.
	a.srv.Stop()
	st.mu.Lock()
	st.leader = b
	st.mu.Unlock()
	res, err := c.Mark(ctx, "ns", items("1", "2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != CodeDuplicate || res[1].Code != CodeNew {
		t.Fatalf("after failover: %v %v, want duplicate new", res[0].Code, res[1].Code)
	}
	if c.Leader() != b.addr {
		t.Fatalf("leader = %q, want %q", c.Leader(), b.addr)
	}
}

func TestNonRetryableErrorsFailAtOnce(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	c, err := New(ctx, []string{n.addr}, fastRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	_, err = c.Mark(ctx, "ns", items("ok", ""), 0)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty id: %v, want InvalidArgument", err)
	}
	_, err = c.Mark(ctx, "missing", items("a"), 0)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown namespace: %v, want NotFound", err)
	}
	if got := n.count("mark"); got != 2 {
		t.Fatalf("mark attempts = %d, want 2 (no retries)", got)
	}
}

func TestRetriesStopAtMaxAttempts(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	n.failNext = 100
	c, err := New(ctx, []string{n.addr}, fastRetry(4))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Mark(ctx, "ns", items("a"), 0)
	if status.Code(err) != codes.Unavailable || !IsRetryable(err) {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if got := n.count("mark"); got != 4 {
		t.Fatalf("attempts = %d, want 4", got)
	}
}

func TestRetriesAreBoundedByTheCallersContext(t *testing.T) {
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	n.failNext = 1 << 30
	c, err := New(context.Background(), []string{n.addr}, WithRetry(1<<20, 20*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Mark(ctx, "ns", items("a"), 0)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("call took %v past a 300ms deadline", el)
	}
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestUnreachableClusterFailsWithUnavailable(t *testing.T) {
	// Nothing listens on this port (it was just closed).
	st := newFakeStore()
	n := startFake(t, st, "n")
	addr := n.addr
	n.srv.Stop()
	ctx := testCtx(t)
	c, err := New(ctx, []string{addr}, fastRetry(3))
	if err != nil {
		t.Fatalf("New must not fail when nodes are down: %v", err)
	}
	defer c.Close()
	_, err = c.Check(ctx, "", [][]byte{[]byte("a")}, Linearizable)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
}

func TestResultsKeepRequestOrderAndRecords(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	c, err := New(ctx, []string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dg := Digest([]byte("body"))
	if _, err := c.Mark(ctx, "ns", []Item{{ID: []byte("b"), Digest: dg}}, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	res, err := c.Check(ctx, "ns", [][]byte{[]byte("a"), []byte("b"), []byte("c")}, Linearizable)
	if err != nil {
		t.Fatal(err)
	}
	want := []Code{CodeNotSeen, CodeSeen, CodeNotSeen}
	for i, r := range res {
		if r.Code != want[i] {
			t.Fatalf("result %d (%s) = %v, want %v", i, r.ID, r.Code, want[i])
		}
	}
	rec := res[1].Record
	if rec == nil || res[0].Record != nil {
		t.Fatalf("records: %+v %+v", res[0].Record, rec)
	}
	if rec.State != StateCommitted || rec.Expires.Sub(rec.FirstSeen) != 90*time.Second || !bytes.Equal(rec.Digest, dg) {
		t.Fatalf("record = %+v", rec)
	}
	if rec.FirstSeen.Location() != time.UTC || rec.FirstSeen.UnixMilli() != st.nowMs {
		t.Fatalf("first seen = %v", rec.FirstSeen)
	}
	other := Digest([]byte("other body"))
	res, err = c.Mark(ctx, "ns", []Item{{ID: []byte("b"), Digest: other}}, 0)
	if err != nil || res[0].Code != CodeConflict {
		t.Fatalf("reused id with new digest: %v %v, want conflict", res, err)
	}
}

func TestLeaseCallsAndShortReplies(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	c, err := New(ctx, []string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Commit(ctx, "ns", []Lease{{ID: []byte("a"), FencingToken: 7}, {ID: []byte("b"), FencingToken: 3}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Code != CodeOK || res[1].Code != CodeLeaseLost || string(res[1].ID) != "b" {
		t.Fatalf("commit results = %+v", res)
	}
	if _, err := c.Forget(ctx, "ns", [][]byte{[]byte("a"), []byte("b")}); err == nil {
		t.Fatal("a reply with fewer results than items must be an error")
	}
}

func TestNamespaceRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	n := startFake(t, st, "n")
	st.leader = n
	c, err := New(ctx, []string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	in := Namespace{Name: "orders", DefaultTTL: time.Hour, MaxTTL: 48 * time.Hour, MaxIDBytes: 128, Mode: ExpirySliding, DefaultLease: 10 * time.Second}
	got, err := c.CreateNamespace(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	in.BucketWidth = time.Minute
	if got != in {
		t.Fatalf("created %+v, want %+v", got, in)
	}
}

func TestStatusLearnsMembers(t *testing.T) {
	ctx := testCtx(t)
	st := newFakeStore()
	a := startFake(t, st, "a")
	b := startFake(t, st, "b")
	st.leader = b
	c, err := New(ctx, []string{a.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeID != "b" || s.State != "leader" || s.LeaderID != "b" || len(s.Members) != 1 || !s.Members[0].Leader {
		t.Fatalf("status = %+v", s)
	}
	if addrs := c.Addrs(); len(addrs) != 2 {
		t.Fatalf("known addrs = %v, want both nodes", addrs)
	}
	s, err = c.StatusOf(ctx, a.addr)
	if err != nil || s.NodeID != "a" {
		t.Fatalf("StatusOf(a) = %+v, %v", s, err)
	}
	js, _ := json.Marshal(s)
	for _, k := range []string{`"leader_id":"b"`, `"members":[{"id":"a"`, `"suffrage":"voter"`, `"term":3`} {
		if !bytes.Contains(js, []byte(k)) {
			t.Fatalf("status JSON %s lacks %s", js, k)
		}
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(context.Background(), nil); err == nil {
		t.Fatal("no addresses: want error")
	}
	if _, err := New(context.Background(), []string{"localhost"}); err == nil {
		t.Fatal("address without port: want error")
	}
}

func TestCodesRoundTripTheirNames(t *testing.T) {
	names := []string{"new", "duplicate", "conflict", "seen", "not_seen", "acquired", "in_progress", "ok", "lease_lost"}
	for _, n := range names {
		c, err := ParseCode(n)
		if err != nil || c.String() != n {
			t.Fatalf("ParseCode(%q) = %v, %v", n, c, err)
		}
		b, _ := json.Marshal(c)
		if string(b) != `"`+n+`"` {
			t.Fatalf("JSON of %v = %s", c, b)
		}
	}
	if _, err := ParseCode("unknown"); err == nil {
		t.Fatal("ParseCode(unknown) must fail")
	}
}

func TestContentIDAndDigest(t *testing.T) {
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := string(ContentID([]byte("abc"))); got != abc {
		t.Fatalf("ContentID(abc) = %s", got)
	}
	if d := Digest([]byte("abc")); len(d) != 32 || d[0] != 0xba {
		t.Fatalf("Digest(abc) = %x", d)
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	c := &Client{opts: options{backoffBase: 100 * time.Millisecond, backoffMax: time.Second}}
	for n := 1; n <= 10; n++ {
		d := c.backoff(n)
		want := min(100*time.Millisecond<<(n-1), time.Second)
		if d < want/2 || d > want {
			t.Fatalf("backoff(%d) = %v, want within [%v, %v]", n, d, want/2, want)
		}
	}
}
