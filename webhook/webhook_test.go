package webhook_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/msgid"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/webhook"
)

func newBatcher(t *testing.T, cl *devcluster.Cluster, opts ...client.Option) *client.Batcher {
	t.Helper()
	return testcluster.Batcher(t, cl.Addrs(), opts...)
}

// upstream is a real HTTP endpoint counting deliveries per event, failing
// or blocking on demand.
type upstream struct {
	mu      sync.Mutex
	hits    map[string]int
	fail    map[string]int           // answer 500 this many times first
	block   map[string]chan struct{} // wait for the channel (or the request's end)
	entered chan string
	srv     *httptest.Server
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{hits: map[string]int{}, fail: map[string]int{}, block: map[string]chan struct{}{}, entered: make(chan string, 16)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Webhook-Id")
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.hits[id]++
		failing := u.fail[id] > 0
		if failing {
			u.fail[id]--
		}
		block := u.block[id]
		u.mu.Unlock()
		if block != nil {
			u.entered <- id
			select {
			case <-block:
			case <-r.Context().Done():
				return
			}
		}
		if failing {
			http.Error(w, "database down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "handled "+id+" body="+string(body))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) count(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[id]
}

func startProxy(t *testing.T, p client.Processor, u *upstream, mod func(*webhook.Config)) *httptest.Server {
	t.Helper()
	target, _ := url.Parse(u.srv.URL)
	cfg := webhook.Config{Processor: p, Namespace: "hooks", ID: webhook.HeaderID("Webhook-Id"), DigestBody: true}
	if mod != nil {
		mod(&cfg)
	}
	h, err := webhook.NewProxy(target, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	code   int
	status string
	body   string
	header http.Header
}

func deliver(t *testing.T, srv *httptest.Server, id, body string) answer {
	t.Helper()
	if id == "" {
		return deliverIDs(t, srv, body)
	}
	return deliverIDs(t, srv, body, id)
}

// deliverIDs posts body with one Webhook-Id header line per id.
func deliverIDs(t *testing.T, srv *httptest.Server, body string, ids ...string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hooks/payments?x=1", strings.NewReader(body))
	for _, id := range ids {
		req.Header.Add("Webhook-Id", id)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, status: resp.Header.Get(webhook.StatusHeader), body: string(b), header: resp.Header}
}

func TestProxyFirstDeliveryGoesUpstreamDuplicatesAnsweredAtOnce(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	srv := startProxy(t, newBatcher(t, cl), u, nil)

	a := deliver(t, srv, "evt-1", `{"amount":10}`)
	if a.code != http.StatusCreated || a.status != "processed" || a.header.Get("X-Upstream") != "yes" || a.body != `handled evt-1 body={"amount":10}` {
		t.Fatalf("first delivery: %+v", a)
	}
	for range 3 {
		a = deliver(t, srv, "evt-1", `{"amount":10}`)
		if a.code != http.StatusOK || a.status != "duplicate" || !strings.Contains(a.body, `"first_seen"`) {
			t.Fatalf("duplicate: %+v", a)
		}
	}
	if n := u.count("evt-1"); n != 1 {
		t.Fatalf("upstream got evt-1 %d times, want 1", n)
	}
	// Same ID, another body: a producer bug, reported, not forwarded.
	if a = deliver(t, srv, "evt-1", `{"amount":99}`); a.code != http.StatusUnprocessableEntity || a.status != "conflict" {
		t.Fatalf("conflict: %+v", a)
	}
	// No event ID: refused, not forwarded.
	if a = deliver(t, srv, "", `{}`); a.code != http.StatusBadRequest || a.status != "no-id" {
		t.Fatalf("no id: %+v", a)
	}
	// Other methods pass through.
	resp, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(webhook.StatusHeader) != "" {
		t.Fatalf("GET: %d %q, want passed through", resp.StatusCode, resp.Header.Get(webhook.StatusHeader))
	}
}

// A non-2xx answer releases the claim: the sender's retry goes upstream at
// once (not after the lease), and its success is committed.
func TestProxyUpstreamFailureLetsTheRetrySucceed(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	u.fail["evt-2"] = 2
	srv := startProxy(t, newBatcher(t, cl), u, func(c *webhook.Config) {
		c.ProcessOptions = []client.ProcessOption{client.WithLease(time.Hour)}
	})
	for i := range 2 {
		if a := deliver(t, srv, "evt-2", "x"); a.code != http.StatusInternalServerError || a.status != "failed" || !strings.Contains(a.body, "database down") {
			t.Fatalf("attempt %d: %+v, want the upstream's 500", i+1, a)
		}
	}
	if a := deliver(t, srv, "evt-2", "x"); a.code != http.StatusCreated || a.status != "processed" {
		t.Fatalf("third attempt: %+v", a)
	}
	if a := deliver(t, srv, "evt-2", "x"); a.status != "duplicate" {
		t.Fatalf("fourth attempt: %+v", a)
	}
	if n := u.count("evt-2"); n != 3 {
		t.Fatalf("upstream got evt-2 %d times, want 3", n)
	}
}

// An upstream slower than the timeout: the sender gets 504 in-progress,
// but the claim is kept (renewed past its lease) while the upstream works,
// three redeliveries meanwhile get 409 with an honest Retry-After, and the
// upstream's late success is committed: it was called exactly once
// (issue 12 input 6b).
func TestProxySlowUpstreamCalledOnceForThreeRedeliveries(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	block := make(chan struct{})
	u.block["evt-3"] = block
	const lease = time.Second
	srv := startProxy(t, newBatcher(t, cl), u, func(c *webhook.Config) {
		c.Timeout = 200 * time.Millisecond
		c.ProcessOptions = []client.ProcessOption{client.WithLease(lease)}
	})
	a := deliver(t, srv, "evt-3", "x")
	if a.code != http.StatusGatewayTimeout || a.status != "in-progress" || a.header.Get("Retry-After") == "" {
		t.Fatalf("timed-out attempt: %+v, want 504 in-progress with Retry-After", a)
	}
	// The lease is renewed while the upstream works: wait until the record
	// expires later than the first lease could have (so it was renewed),
	// and well past the moment the first lease would have ended.
	c := testcluster.Client(t, cl.Addrs())
	ctx := context.Background()
	var first time.Time
	testcluster.WaitFor(t, 30*time.Second, "the lease to be renewed past its first expiry", func() bool {
		res, err := c.Check(ctx, "hooks", [][]byte{[]byte("evt-3")}, client.Linearizable)
		if err != nil || res[0].Record == nil || res[0].Record.State != client.StateLeased {
			return false
		}
		if first.IsZero() {
			first = res[0].Record.Expires
		}
		return res[0].Record.Expires.After(first.Add(2 * lease))
	})
	for i := range 3 {
		a := deliver(t, srv, "evt-3", "x")
		if a.code != http.StatusConflict || a.status != "in-progress" {
			t.Fatalf("redelivery %d while the upstream works: %+v, want 409 in-progress", i+1, a)
		}
		// Past the timeout, the earliest the event may be free is the
		// lease's current expiry: at most the 1 s lease away.
		if ra, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || ra != 1 {
			t.Fatalf("redelivery %d: Retry-After %q, want 1 (the lease's time left, rounded up)", i+1, a.header.Get("Retry-After"))
		}
	}
	close(block)
	testcluster.WaitFor(t, 30*time.Second, "the late upstream success to be committed", func() bool {
		return deliver(t, srv, "evt-3", "x").status == "duplicate"
	})
	if n := u.count("evt-3"); n != 1 {
		t.Fatalf("upstream got evt-3 %d times, want exactly once", n)
	}
}

// Past MaxUpstream the upstream's context ends and the claim is released:
// the next delivery goes upstream again.
func TestProxyMaxUpstreamReleases(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	u.block["evt-5"] = make(chan struct{}) // never answers
	srv := startProxy(t, newBatcher(t, cl), u, func(c *webhook.Config) {
		c.Timeout = 100 * time.Millisecond
		c.MaxUpstream = 500 * time.Millisecond
		c.ProcessOptions = []client.ProcessOption{client.WithLease(time.Hour)}
	})
	if a := deliver(t, srv, "evt-5", "x"); a.code != http.StatusGatewayTimeout || a.status != "in-progress" {
		t.Fatalf("first attempt: %+v", a)
	}
	<-u.entered
	u.mu.Lock()
	delete(u.block, "evt-5")
	u.mu.Unlock()
	testcluster.WaitFor(t, 30*time.Second, "a redelivery to reach the upstream after the hard limit", func() bool {
		return deliver(t, srv, "evt-5", "x").status == "processed"
	})
	if n := u.count("evt-5"); n != 2 {
		t.Fatalf("upstream got evt-5 %d times, want 2 (the abandoned call and the retry)", n)
	}
}

// A duplicate arriving while the first delivery is still upstream gets
// 409 with Retry-After; after the first succeeds, retries are duplicates.
func TestProxyConcurrentDuplicateGets409WithRetryAfter(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	block := make(chan struct{})
	u.block["evt-4"] = block
	srv := startProxy(t, newBatcher(t, cl), u, func(c *webhook.Config) {
		c.ProcessOptions = []client.ProcessOption{client.WithLease(20 * time.Second)}
	})

	first := make(chan answer, 1)
	go func() { first <- deliver(t, srv, "evt-4", "x") }()
	<-u.entered // the first delivery is upstream now

	a := deliver(t, srv, "evt-4", "x")
	if a.code != http.StatusConflict || a.status != "in-progress" {
		t.Fatalf("concurrent duplicate: %+v, want 409 in-progress", a)
	}
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 20 {
		t.Fatalf("Retry-After %q, want 1..20 seconds (the first delivery's lease)", a.header.Get("Retry-After"))
	}
	close(block)
	if a := <-first; a.code != http.StatusCreated || a.status != "processed" {
		t.Fatalf("first delivery: %+v", a)
	}
	if a := deliver(t, srv, "evt-4", "x"); a.code != http.StatusOK || a.status != "duplicate" {
		t.Fatalf("retry after the first finished: %+v", a)
	}
	if n := u.count("evt-4"); n != 1 {
		t.Fatalf("upstream got evt-4 %d times, want 1", n)
	}
}

// The middleware on a plain net/http handler, with the ID from a JSON
// field; with the store down, deliveries get 503 + Retry-After and never
// reach the handler.
func TestMiddlewareJSONFieldAndStoreUnavailable(t *testing.T) {
	cl := testcluster.Demo(t)
	var mu sync.Mutex
	hits := map[string]int{}
	mw, err := webhook.Middleware(webhook.Config{
		Processor: newBatcher(t, cl, client.WithRetry(2, 10*time.Millisecond, 20*time.Millisecond), client.WithTimeout(time.Second)),
		Namespace: "hooks-json",
		ID:        webhook.JSONFieldID("data.id"),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hits[string(b)]++
		mu.Unlock()
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)

	body := `{"data":{"id":"ch_123","amount":5}}`
	if a := deliver(t, srv, "", body); a.code != http.StatusOK || a.status != "processed" || a.body != "ok" {
		t.Fatalf("first: %+v", a)
	}
	if a := deliver(t, srv, "", body); a.status != "duplicate" {
		t.Fatalf("second: %+v", a)
	}
	if a := deliver(t, srv, "", `{"data":{}}`); a.code != http.StatusBadRequest || a.status != "no-id" {
		t.Fatalf("missing field: %+v", a)
	}
	mu.Lock()
	if hits[body] != 1 {
		t.Fatalf("handler ran %d times, want once", hits[body])
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Close(ctx); err != nil {
		t.Logf("close: %v", err)
	}
	a := deliver(t, srv, "", `{"data":{"id":"ch_456"}}`)
	if a.code != http.StatusServiceUnavailable || a.status != "unavailable" || a.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %+v", a)
	}
	if _, err := webhook.Middleware(webhook.Config{}); err == nil {
		t.Fatal("Middleware accepted an empty config")
	}
}

// A delivery naming two event IDs — the ID header repeated with different
// values — is refused with 400 naming the header, before it reaches
// dedupnode or the upstream: the proxy would take one value for the ID and
// the upstream perhaps the other, and a later delivery of the same body
// under the other value would go upstream again. A header repeated with
// one value is that ID.
func TestProxyRefusesIDHeaderRepeatedWithDifferentValues(t *testing.T) {
	cl := testcluster.Demo(t)
	u := newUpstream(t)
	srv := startProxy(t, newBatcher(t, cl), u, nil)

	const body = `{"amount":10}`
	a := deliverIDs(t, srv, body, "evt-a", "evt-b")
	if a.code != http.StatusBadRequest || a.status != "no-id" || !strings.Contains(a.body, "header Webhook-Id is repeated with different values") {
		t.Fatalf("two IDs: %+v", a)
	}
	if n := u.count("evt-a"); n != 0 {
		t.Fatalf("upstream got the ambiguous delivery %d times", n)
	}
	// Neither ID was claimed: each, sent alone, goes upstream once.
	for _, id := range []string{"evt-b", "evt-a"} {
		if a = deliver(t, srv, id, body); a.code != http.StatusCreated || a.status != "processed" {
			t.Fatalf("%s alone: %+v", id, a)
		}
		if a = deliver(t, srv, id, body); a.code != http.StatusOK || a.status != "duplicate" {
			t.Fatalf("%s again: %+v", id, a)
		}
		if n := u.count(id); n != 1 {
			t.Fatalf("upstream got %s %d times, want 1", id, n)
		}
	}
	// An empty value beside a real one is ambiguous too.
	if a = deliverIDs(t, srv, body, "", "evt-c"); a.code != http.StatusBadRequest || a.status != "no-id" {
		t.Fatalf("empty and evt-c: %+v", a)
	}

	// One value repeated names one event.
	if a = deliverIDs(t, srv, body, "evt-d", "evt-d"); a.code != http.StatusCreated || a.status != "processed" {
		t.Fatalf("evt-d twice: %+v", a)
	}
	if a = deliver(t, srv, "evt-d", body); a.code != http.StatusOK || a.status != "duplicate" {
		t.Fatalf("evt-d alone after it: %+v", a)
	}
	if n := u.count("evt-d"); n != 1 {
		t.Fatalf("upstream got evt-d %d times, want 1", n)
	}
}

func TestHeaderIDRepeated(t *testing.T) {
	id := webhook.HeaderID("Idempotency-Key")
	req := func(vals ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		for _, v := range vals {
			r.Header.Add("Idempotency-Key", v)
		}
		return r
	}
	if _, err := id(req("k1", "k2"), nil); !errors.Is(err, webhook.ErrAmbiguousID) || !strings.Contains(err.Error(), "Idempotency-Key") {
		t.Errorf("two values: %v, want ErrAmbiguousID naming the header", err)
	}
	if got, err := id(req("k1", "k1", "k1"), nil); err != nil || string(got) != "k1" {
		t.Errorf("one value thrice: %q, %v", got, err)
	}
	if _, err := id(req(), nil); !errors.Is(err, msgid.ErrNoID) {
		t.Errorf("no header: %v, want ErrNoID", err)
	}
}
