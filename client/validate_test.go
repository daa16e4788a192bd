package client_test

// What every node refuses alike (an empty ID; a TTL, lease or max
// staleness that is not whole milliseconds) the client refuses itself,
// before it dials or sends anything, with the error a node's answer gives:
// ErrInvalidArgument, Field, Violation in a node's words, Item.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/server"
)

// refusal is what a call refused for invalid input should carry.
type refusal struct {
	field     string
	item      int
	violation string // "" for any non-empty one
}

// checkRefusal fails unless err is an invalid-argument *Error with the
// field, item and violation of want, shaped as a node's answer: the
// violation in its own words (no field in it), the message "field:
// violation", status code InvalidArgument, and no attempt made.
func checkRefusal(t *testing.T, name string, err error, want refusal) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		return nil
	}
	switch {
	case e.Field != want.field || e.Item != want.item:
		t.Errorf("%s: field %q item %d, want field %q item %d", name, e.Field, e.Item, want.field, want.item)
	case e.Violation == "" || (want.violation != "" && e.Violation != want.violation):
		t.Errorf("%s: violation %q, want %q", name, e.Violation, cmpOr(want.violation, "a sentence"))
	case strings.HasPrefix(e.Violation, e.Field):
		t.Errorf("%s: violation %q repeats the field", name, e.Violation)
	case e.Message != e.Field+": "+e.Violation:
		t.Errorf("%s: message %q, want %q", name, e.Message, e.Field+": "+e.Violation)
	case status.Code(err) != codes.InvalidArgument || e.Code != codes.InvalidArgument:
		t.Errorf("%s: status code %v (Code %v), want InvalidArgument", name, status.Code(err), e.Code)
	case e.Attempts != 0 || e.Addr != "":
		t.Errorf("%s: %d attempts via %q, want none: nothing is sent", name, e.Attempts, e.Addr)
	case client.Heals(err):
		t.Errorf("%s: Heals says waiting may help an invalid request", name)
	}
	return e
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// idCall is a call of every kind that takes IDs, with an empty ID second
// of three, and where the client's error must point.
type idCall struct {
	name string
	want refusal
	call func(ctx context.Context, c *client.Client) error
}

func emptyIDCalls() []idCall {
	items := []client.Item{{ID: []byte("a")}, {ID: nil}, {ID: []byte("c")}}
	tok := []byte("claim-token")
	leases := []client.Lease{{ID: []byte("a"), FencingToken: 1, RequestToken: tok}, {ID: []byte{}, FencingToken: 1, RequestToken: tok}, {ID: []byte("c"), FencingToken: 1, RequestToken: tok}}
	ids := [][]byte{[]byte("a"), {}, []byte("c")}
	item := refusal{field: "items[1].id", item: 2, violation: "empty message ID"}
	list := refusal{field: "ids[1]", item: 2, violation: "empty message ID"}
	ignore := func(_ []client.Result, err error) error { return err }
	return []idCall{
		{"mark", item, func(ctx context.Context, c *client.Client) error { return ignore(c.Mark(ctx, "ns", items, 0)) }},
		{"claim", item, func(ctx context.Context, c *client.Client) error { return ignore(c.Claim(ctx, "ns", items, 0)) }},
		{"commit", item, func(ctx context.Context, c *client.Client) error { return ignore(c.Commit(ctx, "ns", leases, 0)) }},
		{"renew", item, func(ctx context.Context, c *client.Client) error { return ignore(c.Renew(ctx, "ns", leases, 0)) }},
		{"release", item, func(ctx context.Context, c *client.Client) error { return ignore(c.Release(ctx, "ns", leases)) }},
		{"forget", list, func(ctx context.Context, c *client.Client) error { return ignore(c.Forget(ctx, "ns", ids)) }},
		{"check", list, func(ctx context.Context, c *client.Client) error {
			return ignore(c.Check(ctx, "ns", ids, client.Linearizable))
		}},
		{"check stale", list, func(ctx context.Context, c *client.Client) error {
			return ignore(c.Check(ctx, "ns", ids, client.Stale))
		}},
		{"check bounded", list, func(ctx context.Context, c *client.Client) error {
			_, _, err := c.CheckBounded(ctx, "ns", ids, 5*time.Second)
			return err
		}},
		{"mark at", item, func(ctx context.Context, c *client.Client) error {
			return ignore(c.MarkAt(ctx, c.Addrs()[0], "ns", items, 0, nil))
		}},
		{"claim at", item, func(ctx context.Context, c *client.Client) error {
			return ignore(c.ClaimAt(ctx, c.Addrs()[0], "ns", items, 0, nil))
		}},
		{"commit at", item, func(ctx context.Context, c *client.Client) error {
			return ignore(c.CommitAt(ctx, c.Addrs()[0], "ns", leases, 0))
		}},
		{"check at", list, func(ctx context.Context, c *client.Client) error {
			return ignore(c.CheckAt(ctx, c.Addrs()[0], "ns", ids, client.Linearizable))
		}},
	}
}

// A new user's report: Mark with an empty ID and no server running said
// "connection refused". An empty ID is refused before anything is dialled
// or sent, by every call that takes IDs, naming the field and the item.
// Nothing listens at the address: trying to send would fail with
// ErrRefused instead.
func TestEmptyIDIsRefusedBeforeAnythingIsSentEvenWithNoServer(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c, err := client.New(ctx, []string{"127.0.0.1:1"}, client.WithRetry(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range emptyIDCalls() {
		err := tc.call(ctx, c)
		if errors.Is(err, client.ErrRefused) {
			t.Errorf("%s: %v: the client dialled", tc.name, err)
			continue
		}
		checkRefusal(t, tc.name, err, tc.want)
	}
	// The first empty ID is the one named.
	_, err = c.Mark(ctx, "ns", []client.Item{{ID: []byte("a")}, {ID: []byte("b")}, {}, {}}, 0)
	checkRefusal(t, "mark, third and fourth IDs empty", err, refusal{"items[2].id", 3, "empty message ID"})
	// A TTL out of whole milliseconds is named first, as a node does.
	_, err = c.Mark(ctx, "ns", []client.Item{{}}, -5*time.Second)
	checkRefusal(t, "mark, empty ID and TTL -5s", err, refusal{field: "ttl"})
}

// With a node up, the client's refusal of an empty ID is the node's own
// answer to that input, field for field, and no Dedup call reaches the
// node for it.
func TestEmptyIDRefusalIsTheNodesAnswerAndNothingReachesIt(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	var received atomic.Int64
	n := startSingle(t, func(cfg *server.Config) {
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if strings.HasPrefix(info.FullMethod, "/"+dedupv1.Dedup_ServiceDesc.ServiceName+"/") {
					received.Add(1)
				}
				return h(ctx, req)
			}))
	})

	// The node's answers, from requests the client would not send.
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	d := dedupv1.NewDedupClient(cc)
	id := func(s string) []byte { return []byte(s) }
	markItems := []*dedupv1.MarkItem{{Id: id("a")}, {}, {Id: id("c")}}
	claimItems := []*dedupv1.ClaimItem{{Id: id("a")}, {}, {Id: id("c")}}
	leaseItems := []*dedupv1.LeaseItem{{Id: id("a"), FencingToken: 1, RequestToken: id("t")}, {FencingToken: 1, RequestToken: id("t")}, {Id: id("c"), FencingToken: 1, RequestToken: id("t")}}
	ids := [][]byte{id("a"), {}, id("c")}
	node := map[string]func() error{}
	node["mark"] = func() error {
		_, err := d.Mark(ctx, &dedupv1.MarkRequest{Namespace: "ns", Items: markItems})
		return err
	}
	node["claim"] = func() error {
		_, err := d.Claim(ctx, &dedupv1.ClaimRequest{Namespace: "ns", Items: claimItems})
		return err
	}
	node["commit"] = func() error {
		_, err := d.Commit(ctx, &dedupv1.CommitRequest{Namespace: "ns", Items: leaseItems})
		return err
	}
	node["renew"] = func() error {
		_, err := d.Renew(ctx, &dedupv1.RenewRequest{Namespace: "ns", Items: leaseItems})
		return err
	}
	node["release"] = func() error {
		_, err := d.Release(ctx, &dedupv1.ReleaseRequest{Namespace: "ns", Items: leaseItems})
		return err
	}
	node["forget"] = func() error { _, err := d.Forget(ctx, &dedupv1.ForgetRequest{Namespace: "ns", Ids: ids}); return err }
	node["check"] = func() error { _, err := d.Check(ctx, &dedupv1.CheckRequest{Namespace: "ns", Ids: ids}); return err }
	answers := map[string]*client.Error{}
	for op, call := range node {
		err := call()
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("the node's answer to %s with an empty ID: %v, want InvalidArgument", op, err)
		}
		answers[op] = client.AsError(err)
	}
	fromNode := received.Load()

	c := newClient(t, []string{n.addr})
	for _, tc := range emptyIDCalls() {
		e := checkRefusal(t, tc.name, tc.call(ctx, c), tc.want)
		a := answers[strings.Fields(tc.name)[0]]
		if e == nil || a == nil {
			continue
		}
		if e.Kind != a.Kind || e.Code != a.Code || e.Field != a.Field || e.Item != a.Item || e.Violation != a.Violation || e.Message != a.Message {
			t.Errorf("%s: the client says (%v, %v, %q, item %d, %q, %q), the node (%v, %v, %q, item %d, %q, %q)", tc.name,
				e.Kind, e.Code, e.Field, e.Item, e.Violation, e.Message, a.Kind, a.Code, a.Field, a.Item, a.Violation, a.Message)
		}
	}
	if got := received.Load() - fromNode; got != 0 {
		t.Errorf("the node received %d Dedup calls from the client's refused requests, want 0", got)
	}
}

// A Batcher caller with an empty ID gets the unbatched call's error at
// once and never joins a batch: the callers beside it are answered, and
// only their items are sent.
func TestBatcherRefusesAnEmptyIDWithoutFailingOthers(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	c := newClient(t, []string{n.addr})
	b := c.NewBatcher(client.WithLinger(100*time.Millisecond), client.WithBatchTransport(client.TransportUnary))
	defer b.Close()
	var wg sync.WaitGroup
	res := make([]client.Result, 3)
	errs := make([]error, 3)
	for i, id := range []string{"a", "", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = b.Mark(ctx, "ns", client.Item{ID: []byte(id)}, 0)
		}()
	}
	wg.Wait()
	checkRefusal(t, "batched mark of an empty ID", errs[1], refusal{"items[0].id", 1, "empty message ID"})
	for _, i := range []int{0, 2} {
		if errs[i] != nil || res[i].Code != client.CodeNew {
			t.Errorf("batched mark %q beside an empty ID: %v, %v, want new", res[i].ID, res[i].Code, errs[i])
		}
	}
	_, err := b.Check(ctx, "ns", nil, client.Linearizable)
	checkRefusal(t, "batched check of an empty ID", err, refusal{"ids[0]", 1, "empty message ID"})
	_, err = b.Release(ctx, "ns", client.Lease{FencingToken: 1, RequestToken: []byte("claim-token")})
	checkRefusal(t, "batched release of an empty ID", err, refusal{"items[0].id", 1, "empty message ID"})
	if st := b.Stats(); st.Calls != 2 || st.Items != 2 {
		t.Errorf("batcher stats %+v, want 2 calls and 2 items sent: the empty IDs neither join nor split a batch", st)
	}
}

// A TTL, lease or max staleness that is negative or not a whole number of
// milliseconds is refused before anything is sent (issue 14: 500µs used
// to become 0, "the namespace default", a 24 h record), and the error
// says what is wrong with it, as a node's violation does (a new user found
// Field "ttl" with an empty Violation for a TTL of -5s or 1.5ms).
func TestClientSideDurationErrorsSayWhatIsWrong(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c, err := client.New(ctx, []string{"127.0.0.1:1"}, client.WithRetry(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	item := []client.Item{{ID: []byte("x")}}
	lease := []client.Lease{{ID: []byte("x"), FencingToken: 1, RequestToken: []byte("claim-token")}}
	ignore := func(_ []client.Result, err error) error { return err }
	const want = "0 (the namespace default) or a positive whole number of milliseconds"
	for _, tc := range []struct {
		name string
		call func() error
		want refusal
	}{
		{"mark -5s", func() error { return ignore(c.Mark(ctx, "", item, -5*time.Second)) },
			refusal{"ttl", 0, "-5s is negative; want " + want}},
		{"mark 1.5ms", func() error { return ignore(c.Mark(ctx, "", item, 1500*time.Microsecond)) },
			refusal{"ttl", 0, "1.5ms is not a whole number of milliseconds; want " + want}},
		{"claim 999µs", func() error { return ignore(c.Claim(ctx, "", item, 999*time.Microsecond)) },
			refusal{"lease", 0, "999µs is not a whole number of milliseconds; want " + want}},
		{"commit -1ms", func() error { return ignore(c.Commit(ctx, "", lease, -time.Millisecond)) },
			refusal{"ttl", 0, "-1ms is negative; want " + want}},
		{"renew 10.5ms", func() error { return ignore(c.Renew(ctx, "", lease, 10500*time.Microsecond)) },
			refusal{"lease", 0, "10.5ms is not a whole number of milliseconds; want " + want}},
		{"mark at 1.5ms", func() error { return ignore(c.MarkAt(ctx, "127.0.0.1:1", "", item, 1500*time.Microsecond, nil)) },
			refusal{"ttl", 0, "1.5ms is not a whole number of milliseconds; want " + want}},
		{"create namespace", func() error {
			_, err := c.CreateNamespace(ctx, client.Namespace{Name: "x", DefaultTTL: 1500 * time.Microsecond})
			return err
		}, refusal{"default_ttl", 0, "1.5ms is not a whole number of milliseconds; want 0 (the default) or a positive whole number of milliseconds"}},
		{"update namespace", func() error {
			_, err := c.UpdateNamespace(ctx, client.Namespace{Name: "x", MaxTTL: -time.Hour})
			return err
		}, refusal{"max_ttl", 0, "-1h0m0s is negative; want 0 (unchanged) or a positive whole number of milliseconds"}},
		{"check bounded 0", func() error { _, _, err := c.CheckBounded(ctx, "", nil, 0); return err },
			refusal{"max_staleness", 0, "0s is not above 0; want a positive whole number of milliseconds, e.g. 5s"}},
		{"check bounded 1.5ms", func() error { _, _, err := c.CheckBounded(ctx, "", nil, 1500*time.Microsecond); return err },
			refusal{"max_staleness", 0, "1.5ms is not a whole number of milliseconds; want a positive whole number of milliseconds, e.g. 5s"}},
		{"check bounded without max staleness", func() error { return ignore(c.Check(ctx, "", [][]byte{[]byte("x")}, client.Bounded)) },
			refusal{field: "max_staleness"}},
	} {
		err := tc.call()
		if errors.Is(err, client.ErrRefused) {
			t.Errorf("%s: %v: the client dialled", tc.name, err)
			continue
		}
		checkRefusal(t, tc.name, err, tc.want)
	}
}
