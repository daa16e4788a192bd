package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/client"
)

// Workloads of `dedupnode bench`.
const (
	MarkNew     = "mark-new"     // Mark fresh IDs: every answer should be NEW
	MarkMixed   = "mark-mixed"   // Mark with a share of repeats (DuplicateRatio)
	CheckHit    = "check-hit"    // Check IDs marked during a preload phase
	CheckMiss   = "check-miss"   // Check fresh IDs: every answer should be NOT_SEEN
	ClaimCommit = "claim-commit" // Claim fresh IDs, then Commit the leases
)

// Workloads lists the workload names in a stable order.
var Workloads = []string{MarkNew, MarkMixed, CheckHit, CheckMiss, ClaimCommit}

// Config describes one `dedupnode bench` run against a cluster.
type Config struct {
	Addrs          []string // gRPC addresses of one or more nodes
	Namespace      string
	Workload       string
	Concurrency    int
	Batch          int // IDs per call
	IDSize         int // bytes per ID
	Duration       time.Duration
	Count          int64 // IDs to measure, instead of Duration
	Warmup         time.Duration
	DuplicateRatio float64 // mark-mixed: share of IDs that repeat an earlier one
	Consistency    string  // check-*: "linearizable" (default), "stale" or "bounded"
	// MaxStaleness is the max staleness of consistency "bounded" (required
	// there, whole milliseconds).
	MaxStaleness time.Duration
	TTL          time.Duration
	Timeout      time.Duration // per call
	Conns        int           // gRPC connections per address
	Preload      int           // check-hit: IDs marked before measuring
	// Target "leader" (default) sends writes and linearizable checks to the
	// leader that Admin.Status names, as the client package does; "any"
	// spreads them over Addrs (a follower then asks the leader for a read
	// index per round of checks). Stale and bounded checks always spread.
	Target string
	// CreateNamespace creates Namespace (TTL as default, >= TTL as max)
	// when the cluster does not know it.
	CreateNamespace bool
	Progress        io.Writer
	OnMeasure       func(start bool)
	Label           string
	MaxTime         time.Duration
	// DialOptions are added to every gRPC connection the run makes (the
	// WAN simulation routes them through its delaying proxies).
	DialOptions []grpc.DialOption
	// Coalesce sends every ID as its own call through one client.Batcher
	// (see coalescing) instead of one single-attempt call per caller call.
	Coalesce bool
	// Transport "unary" (default) sends each call as its own RPC;
	// "stream" sends the calls as messages on one Dedup.Stream per
	// connection (the client's Pipeline), shared by the callers that use
	// it.
	// With Coalesce it is the Batcher's transport.
	Transport string
	// Window caps the calls in flight on one stream (0: the client's
	// default).
	Window int
	// ClientOptions reach the cluster: TLS and token (client.WithTLS,
	// client.WithToken), for every client of the run.
	ClientOptions []client.Option
}

func (c *Config) defaults() error {
	if len(c.Addrs) == 0 {
		return errors.New("no address given (--addr)")
	}
	if c.Workload == "" {
		c.Workload = MarkNew
	}
	ok := false
	for _, w := range Workloads {
		ok = ok || w == c.Workload
	}
	if !ok {
		return fmt.Errorf("unknown workload %q (one of %s)", c.Workload, strings.Join(Workloads, ", "))
	}
	if c.Coalesce {
		if err := checkCoalesce(c.Workload); err != nil {
			return err
		}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 50
	}
	if c.Batch <= 0 {
		c.Batch = 16
	}
	if c.IDSize <= 0 {
		c.IDSize = 16
	}
	if c.TTL <= 0 {
		c.TTL = 24 * time.Hour
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.Preload <= 0 {
		c.Preload = 100_000
	}
	if c.DuplicateRatio < 0 || c.DuplicateRatio > 1 {
		return fmt.Errorf("duplicate ratio %v out of [0,1]", c.DuplicateRatio)
	}
	if c.Workload == MarkMixed && c.DuplicateRatio == 0 {
		c.DuplicateRatio = 0.5
	}
	switch c.Consistency {
	case "", "linearizable", "stale", "bounded":
	default:
		return fmt.Errorf("unknown consistency %q (linearizable, stale or bounded)", c.Consistency)
	}
	switch bounded := c.Consistency == "bounded"; {
	case bounded && (c.MaxStaleness <= 0 || c.MaxStaleness%time.Millisecond != 0):
		return fmt.Errorf("max staleness %v: consistency bounded needs a positive whole number of milliseconds, e.g. 5s", c.MaxStaleness)
	case !bounded && c.MaxStaleness != 0:
		return fmt.Errorf("max staleness %v: only consistency bounded takes one", c.MaxStaleness)
	}
	if c.Consistency == "" {
		c.Consistency = "linearizable"
	}
	switch c.Target {
	case "":
		c.Target = "leader"
	case "leader", "any":
	default:
		return fmt.Errorf("unknown target %q (leader or any)", c.Target)
	}
	if c.Transport == "" {
		c.Transport = "unary"
	}
	if _, err := client.ParseTransport(c.Transport); err != nil {
		return err
	}
	if c.Label == "" {
		c.Label = c.Workload
	}
	return nil
}

func (c *Config) transport() client.Transport {
	t, _ := client.ParseTransport(c.Transport)
	return t
}

func (c *Config) clientConsistency() client.Consistency {
	switch c.Consistency {
	case "stale":
		return client.Stale
	case "bounded":
		return client.Bounded
	}
	return client.Linearizable
}

// clientOptions are ClientOptions with DialOptions.
func (c *Config) clientOptions() []client.Option {
	return append(slices.Clone(c.ClientOptions), client.WithDialOptions(c.DialOptions...))
}

func (c *Config) isWrite() bool { return c.Workload != CheckHit && c.Workload != CheckMiss }

// toLeader reports whether the client package would send this workload's
// calls to the leader: writes and linearizable checks (stale and bounded
// checks go to any node).
func (c *Config) toLeader() bool {
	return c.isWrite() || (c.Consistency != "stale" && c.Consistency != "bounded")
}

// nodes are pinned clients (client.WithPinnedNode), one per connection,
// handed to workers round robin. Every measured call is one attempt on its
// client's node (client.Client.MarkAt and the like): no retry and no
// re-routing, so that a call's latency is one round trip's.
type nodes struct {
	all []node
}

// node is one pinned client and the address it is pinned to.
type node struct {
	c    *client.Client
	addr string
}

// dial makes perAddr pinned clients (connections) per address, with opts.
func dial(ctx context.Context, addrs []string, perAddr int, opts ...client.Option) (*nodes, error) {
	ns := &nodes{}
	opts = append(slices.Clone(opts), client.WithPinnedNode(), client.WithRetry(1, 0, 0))
	for _, a := range addrs {
		for i := 0; i < perAddr; i++ {
			c, err := client.New(ctx, []string{a}, opts...)
			if err != nil {
				ns.close()
				return nil, fmt.Errorf("dial %s: %w", a, err)
			}
			ns.all = append(ns.all, node{c: c, addr: a})
		}
	}
	return ns, nil
}

// nodeOptions are the options of the measuring clients: the run's
// transport, per-call timeout and max staleness.
func (c *Config) nodeOptions() []client.Option {
	opts := append(c.clientOptions(), client.WithTimeout(c.Timeout), client.WithTransport(c.transport(), c.Window))
	if c.Consistency == "bounded" {
		opts = append(opts, client.WithMaxStaleness(c.MaxStaleness))
	}
	return opts
}

// warm connects every client (one Status each, bounded by timeout in
// all), so the first measured calls do not pay for dialing.
func (ns *nodes) warm(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, n := range ns.all {
		_, _ = n.c.StatusOf(ctx, n.addr)
	}
}

// namespaceWait bounds how long Run waits for every target node to know
// the namespace it created.
const namespaceWait = 30 * time.Second

// waitNamespace waits until every address of ns knows the namespace: a
// stale check there (answered from that node's own state) no longer says
// it does not exist. A node that answers otherwise, with an error that
// waiting does not heal, is left to the measurement to report. It fails
// after timeout.
func (ns *nodes) waitNamespace(ctx context.Context, namespace string, timeout time.Duration) error {
	if namespace == "" {
		namespace = "default"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	probe := [][]byte{[]byte("bench-namespace-probe")}
	seen := map[string]bool{}
	for _, n := range ns.all {
		if seen[n.addr] {
			continue
		}
		seen[n.addr] = true
		for {
			_, err := n.c.CheckAt(ctx, n.addr, namespace, probe, client.Stale)
			if err == nil || (!errors.Is(err, client.ErrNamespaceNotFound) && !client.Heals(err)) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("namespace %q created, but %s did not know it after %s: %w", namespace, n.addr, timeout, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func (ns *nodes) close() {
	for _, n := range ns.all {
		_ = n.c.Close()
	}
}

func (ns *nodes) get(i int) node { return ns.all[i%len(ns.all)] }

// findLeader asks the given nodes for the leader's gRPC address (the
// client's leader discovery, each call bounded by timeout).
func findLeader(ctx context.Context, addrs []string, timeout time.Duration, opts ...client.Option) (string, error) {
	c, err := client.New(ctx, addrs, append(slices.Clone(opts), client.WithTimeout(timeout), client.WithRetry(1, 0, 0))...)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if l := c.Leader(); l != "" {
		return l, nil
	}
	st, err := c.Status(ctx)
	if err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s knows no leader (state %s)", st.NodeID, st.State)
}

// WaitReady polls Admin.Status on the given nodes until one names a leader
// or the timeout passes.
func WaitReady(ctx context.Context, addrs []string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		leader, err := findLeader(ctx, addrs, 2*time.Second)
		if err == nil {
			return leader, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no leader after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// EnsureNamespace creates the namespace unless it exists. Servers without
// the Admin service (or with auto-create) are left alone.
func EnsureNamespace(ctx context.Context, c *client.Client, name string, ttl time.Duration) error {
	if name == "" {
		name = "default"
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ns, err := c.DescribeNamespace(cctx, name)
	switch status.Code(err) {
	case codes.OK:
		if m := ns.MaxTTL; m > 0 && m < ttl {
			return fmt.Errorf("namespace %q allows a TTL of at most %s, below --ttl %s", name, m, ttl)
		}
		return nil
	case codes.NotFound:
	case codes.Unimplemented:
		return nil
	default:
		return fmt.Errorf("describe namespace %q: %w", name, err)
	}
	_, err = c.CreateNamespace(cctx, client.Namespace{Name: name, DefaultTTL: ttl, MaxTTL: max(ttl, 7*24*time.Hour)})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create namespace %q: %w", name, err)
	}
	return nil
}

// ConfigError is Run's error for an invalid Config (an unknown workload,
// consistency or target, a ratio out of range): the caller's input, not
// the cluster, is at fault.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Run runs one benchmark against a dedupnode cluster.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	addrs := cfg.Addrs
	note := ""
	if cfg.Target == "leader" && cfg.toLeader() {
		if leader, err := findLeader(ctx, cfg.Addrs, 5*time.Second, cfg.clientOptions()...); err == nil {
			addrs = []string{leader}
			if len(cfg.Addrs) > 1 {
				note = "calls sent to the leader " + leader
			}
		} else if status.Code(err) != codes.Unimplemented {
			note = "leader unknown (" + err.Error() + "); calls spread over all addresses"
		}
	}
	cs, err := dial(ctx, addrs, cfg.Conns, cfg.nodeOptions()...)
	if err != nil {
		return nil, err
	}
	defer cs.close()
	cs.warm(ctx, 5*time.Second)
	if cfg.CreateNamespace {
		adm, err := client.New(ctx, addrs, cfg.clientOptions()...)
		if err != nil {
			return nil, err
		}
		err = EnsureNamespace(ctx, adm, cfg.Namespace, cfg.TTL)
		adm.Close()
		if err != nil {
			return nil, err
		}
		// The leader created it; a follower or read replica that is a
		// target must have applied it too before the measurement starts,
		// or its first calls fail with "namespace not found".
		if err := cs.waitNamespace(ctx, cfg.Namespace, namespaceWait); err != nil {
			return nil, err
		}
	}

	seed := NewRunSeed()
	var hits [][]byte
	if cfg.Workload == CheckHit {
		hits, err = preload(ctx, cfg, addrs, seed)
		if err != nil {
			return nil, fmt.Errorf("preload for check-hit: %w", err)
		}
	}

	res := &Result{
		System:      "dedupnode",
		Workload:    cfg.Workload,
		Concurrency: cfg.Concurrency,
		Batch:       cfg.Batch,
		IDSize:      cfg.IDSize,
		TTLSec:      cfg.TTL.Seconds(),
		StartedAt:   time.Now().UTC().Format(time.RFC3339),
		Transport:   cfg.Transport,
	}
	if !cfg.isWrite() {
		res.Consistency = cfg.Consistency
	}
	if cfg.Workload == MarkMixed {
		res.DuplicateRate = cfg.DuplicateRatio
	}
	spec := Spec{
		Label:       cfg.Label,
		Concurrency: cfg.Concurrency,
		Batch:       cfg.Batch,
		Duration:    cfg.Duration,
		Count:       cfg.Count,
		Warmup:      cfg.Warmup,
		MaxTime:     cfg.MaxTime,
		Progress:    cfg.Progress,
		OnMeasure:   cfg.OnMeasure,
	}
	newOp := func(w int) (Op, error) {
		return newDedupOp(cfg, cs.get(w), NewIDGen(seed, w, cfg.IDSize), hits), nil
	}
	var co *coalescing
	if cfg.Coalesce {
		if co, err = newCoalescing(ctx, cfg); err != nil {
			return nil, err
		}
		defer co.close()
		res.Variant = "coalesced"
		newOp = func(w int) (Op, error) { return co.op(cfg, NewIDGen(seed, w, cfg.IDSize), hits), nil }
	}
	lr, err := RunLoop(ctx, spec, newOp)
	if err != nil {
		return nil, err
	}
	Summarize(res, lr.Rec, lr.Elapsed)
	coNote := ""
	if co != nil {
		st := co.b.Stats()
		res.RPCs, res.RPCItems = int64(st.RPCs), int64(st.Items)
		coNote = co.stats()
	}
	res.Note = joinNotes(note, coNote, lr.Stopped, firstErrNote(lr))
	return res, nil
}

func firstErrNote(lr *LoopResult) string {
	if lr.FirstError == "" {
		return ""
	}
	msg := lr.FirstError
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return "first error: " + msg
}

func joinNotes(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

// preload marks cfg.Preload fresh IDs (1000 per call, 8 callers, over
// unary connections of their own to addrs, each call tried up to 20 times
// with its request token, 30 s per try) and returns them, for check-hit.
// Bounded by 5 minutes.
func preload(ctx context.Context, cfg Config, addrs []string, seed uint64) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	const per, callers = 1000, 8
	cs, err := dial(ctx, addrs, 1, append(cfg.clientOptions(), client.WithTimeout(30*time.Second))...)
	if err != nil {
		return nil, err
	}
	defer cs.close()
	ttl := cfg.TTL.Truncate(time.Millisecond)
	ids := make([][]byte, cfg.Preload)
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			gen := NewIDGen(seed, cfg.Concurrency+1+c, cfg.IDSize)
			nd := cs.get(c)
			items := make([]client.Item, 0, per)
			for ctx.Err() == nil {
				hi := next.Add(per)
				lo := hi - per
				if lo >= int64(len(ids)) {
					return
				}
				hi = min(hi, int64(len(ids)))
				items = items[:0]
				for i := lo; i < hi; i++ {
					ids[i] = gen.Fresh(nil)
					items = append(items, client.Item{ID: ids[i]})
				}
				token := gen.Token()
				var err error
				for try := 0; try < 20; try++ { // same token: retries are safe
					_, err = nd.c.MarkAt(ctx, nd.addr, cfg.Namespace, items, ttl, token)
					if err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					cancel()
					return
				}
			}
		}(c)
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return nil, *p
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return ids, nil
}

// newDedupOp returns the op of one worker for cfg.Workload: one
// single-attempt call (two for claim-commit) on nd per op.
func newDedupOp(cfg Config, nd node, gen *IDGen, hits [][]byte) Op {
	ttl := cfg.TTL.Truncate(time.Millisecond)
	batch := make([][]byte, cfg.Batch)
	isDup := make([]bool, cfg.Batch)
	items := make([]client.Item, cfg.Batch)
	cons := cfg.clientConsistency()

	mark := func(ctx context.Context, n int, t *Tally, dups []bool) (int, int, error) {
		for i := 0; i < n; i++ {
			items[i].ID = batch[i]
		}
		rs, err := nd.c.MarkAt(ctx, nd.addr, cfg.Namespace, items[:n], ttl, gen.Token())
		if err != nil {
			return 0, 0, err
		}
		for i, r := range rs {
			t.Add(codeName(r.Code), 1)
			fresh := dups == nil || !dups[i]
			if fresh && r.Code != client.CodeNew {
				t.Unexpected(1)
			}
		}
		return n, 1, nil
	}
	check := func(ctx context.Context, n int, t *Tally, want client.Code) (int, int, error) {
		rs, err := nd.c.CheckAt(ctx, nd.addr, cfg.Namespace, batch[:n], cons)
		if err != nil {
			return 0, 0, err
		}
		for _, r := range rs {
			t.Add(codeName(r.Code), 1)
			if r.Code != want {
				t.Unexpected(1)
			}
		}
		return n, 1, nil
	}

	switch cfg.Workload {
	case MarkMixed:
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			gen.Mixed(batch[:n], isDup[:n], cfg.DuplicateRatio)
			return mark(ctx, n, t, isDup[:n])
		}
	case CheckMiss:
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			gen.FreshBatch(batch[:n])
			return check(ctx, n, t, client.CodeNotSeen)
		}
	case CheckHit:
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			for i := 0; i < n; i++ {
				batch[i] = hits[gen.Intn(len(hits))]
			}
			return check(ctx, n, t, client.CodeSeen)
		}
	case ClaimCommit:
		leases := make([]client.Lease, 0, cfg.Batch)
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			gen.FreshBatch(batch[:n])
			for i := 0; i < n; i++ {
				items[i].ID = batch[i]
			}
			rs, err := nd.c.ClaimAt(ctx, nd.addr, cfg.Namespace, items[:n], 0, gen.Token())
			if err != nil {
				return 0, 0, err
			}
			leases = leases[:0]
			for _, r := range rs {
				t.Add("claim "+codeName(r.Code), 1)
				l, ok := r.Lease()
				if !ok {
					t.Unexpected(1)
					continue
				}
				leases = append(leases, l)
			}
			if len(leases) == 0 {
				return 0, 1, nil
			}
			crs, err := nd.c.CommitAt(ctx, nd.addr, cfg.Namespace, leases, ttl)
			if err != nil {
				return 0, 1, err
			}
			done := 0
			for _, r := range crs {
				t.Add("commit "+codeName(r.Code), 1)
				if r.Code == client.CodeOK {
					done++
				} else {
					t.Unexpected(1)
				}
			}
			return done, 2, nil
		}
	default: // MarkNew
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			gen.FreshBatch(batch[:n])
			return mark(ctx, n, t, nil)
		}
	}
}
