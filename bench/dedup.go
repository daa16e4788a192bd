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
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
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
	// (see coalescing) instead of one raw gRPC call per caller call.
	Coalesce bool
	// Transport "unary" (default) sends each call as its own RPC;
	// "stream" sends the calls as messages on one Dedup.Stream per
	// connection (client.Pipeline), shared by the callers that use it.
	// With Coalesce it is the Batcher's transport.
	Transport string
	// Window caps the calls in flight on one stream (0: the client's
	// default).
	Window int
	// ClientOptions reach the cluster: TLS and token (client.WithTLS,
	// client.WithToken). The raw connections use the same
	// (client.DialOptions).
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

func (c *Config) consistency() dedupv1.Consistency {
	switch c.Consistency {
	case "stale":
		return dedupv1.Consistency_CONSISTENCY_STALE
	case "bounded":
		return dedupv1.Consistency_CONSISTENCY_BOUNDED
	}
	return dedupv1.Consistency_CONSISTENCY_LINEARIZABLE
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

// conns is a set of gRPC connections handed to workers round robin, with
// a client.Pipeline on each for the stream transport.
type conns struct {
	all   []*grpc.ClientConn
	pipes []*client.Pipeline
}

// pipeline opens a Pipeline on every connection.
func (cs *conns) pipeline(window int) {
	for _, c := range cs.all {
		cs.pipes = append(cs.pipes, client.NewPipeline(c, window))
	}
}

// dedup returns worker i's Dedup client: a Pipeline when streaming.
func (cs *conns) dedup(i int) dedupv1.DedupClient {
	if len(cs.pipes) > 0 {
		return cs.pipes[i%len(cs.pipes)]
	}
	return dedupv1.NewDedupClient(cs.get(i))
}

func dial(addrs []string, perAddr int, opts ...client.Option) (*conns, error) {
	cs := &conns{}
	for _, a := range addrs {
		for i := 0; i < perAddr; i++ {
			cc, err := grpc.NewClient(a, client.DialOptions(opts...)...)
			if err != nil {
				cs.close()
				return nil, fmt.Errorf("dial %s: %w", a, err)
			}
			cs.all = append(cs.all, cc)
		}
	}
	return cs, nil
}

// warm connects every connection (bounded by timeout), so the first
// measured calls do not pay for dialing.
func (cs *conns) warm(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, c := range cs.all {
		c.Connect()
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				break
			}
		}
	}
}

func (cs *conns) close() {
	for _, p := range cs.pipes {
		_ = p.Close()
	}
	for _, c := range cs.all {
		_ = c.Close()
	}
}

func (cs *conns) get(i int) *grpc.ClientConn { return cs.all[i%len(cs.all)] }

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
	cs, err := dial(addrs, cfg.Conns, cfg.clientOptions()...)
	if err != nil {
		return nil, err
	}
	defer cs.close()
	cs.warm(ctx, 5*time.Second)
	if cfg.transport() == client.TransportStream && !cfg.Coalesce {
		cs.pipeline(cfg.Window)
	}
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
	}

	seed := NewRunSeed()
	var hits [][]byte
	if cfg.Workload == CheckHit {
		hits, err = preload(ctx, cfg, cs, seed)
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
		return newDedupOp(cfg, cs.dedup(w), NewIDGen(seed, w, cfg.IDSize), hits), nil
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

// preload marks cfg.Preload fresh IDs (1000 per call, 8 callers) and
// returns them, for check-hit. Bounded by 5 minutes.
func preload(ctx context.Context, cfg Config, cs *conns, seed uint64) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	const per, callers = 1000, 8
	ids := make([][]byte, cfg.Preload)
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			gen := NewIDGen(seed, cfg.Concurrency+1+c, cfg.IDSize)
			cl := dedupv1.NewDedupClient(cs.get(c))
			for ctx.Err() == nil {
				hi := next.Add(per)
				lo := hi - per
				if lo >= int64(len(ids)) {
					return
				}
				hi = min(hi, int64(len(ids)))
				req := &dedupv1.MarkRequest{Namespace: cfg.Namespace, TtlMs: cfg.TTL.Milliseconds(), RequestToken: gen.Token()}
				for i := lo; i < hi; i++ {
					ids[i] = gen.Fresh(nil)
					req.Items = append(req.Items, &dedupv1.MarkItem{Id: ids[i]})
				}
				var err error
				for try := 0; try < 20; try++ { // same token: retries are safe
					cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
					_, err = cl.Mark(cctx, req)
					ccancel()
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

// newDedupOp returns the op of one worker for cfg.Workload.
func newDedupOp(cfg Config, cl dedupv1.DedupClient, gen *IDGen, hits [][]byte) Op {
	ttl := cfg.TTL.Milliseconds()
	timeout := cfg.Timeout
	batch := make([][]byte, cfg.Batch)
	isDup := make([]bool, cfg.Batch)
	items := make([]*dedupv1.MarkItem, cfg.Batch)
	for i := range items {
		items[i] = &dedupv1.MarkItem{}
	}
	markReq := &dedupv1.MarkRequest{Namespace: cfg.Namespace, TtlMs: ttl}
	checkReq := &dedupv1.CheckRequest{Namespace: cfg.Namespace, Consistency: cfg.consistency(), MaxStalenessMs: cfg.MaxStaleness.Milliseconds()}

	mark := func(ctx context.Context, n int, t *Tally, dups []bool) (int, int, error) {
		for i := 0; i < n; i++ {
			items[i].Id = batch[i]
		}
		markReq.Items = items[:n]
		markReq.RequestToken = gen.Token()
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := cl.Mark(cctx, markReq)
		cancel()
		if err != nil {
			return 0, 0, err
		}
		rs := resp.GetResults()
		if len(rs) != n {
			return 0, 0, fmt.Errorf("mark: %d results for %d items", len(rs), n)
		}
		for i, r := range rs {
			code := r.GetCode()
			t.Add(code.String(), 1)
			fresh := dups == nil || !dups[i]
			if fresh && code != dedupv1.MarkResult_NEW {
				t.Unexpected(1)
			}
		}
		return n, 1, nil
	}
	check := func(ctx context.Context, n int, t *Tally, want dedupv1.CheckResult_Code) (int, int, error) {
		checkReq.Ids = batch[:n]
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := cl.Check(cctx, checkReq)
		cancel()
		if err != nil {
			return 0, 0, err
		}
		rs := resp.GetResults()
		if len(rs) != n {
			return 0, 0, fmt.Errorf("check: %d results for %d ids", len(rs), n)
		}
		for _, r := range rs {
			t.Add(r.GetCode().String(), 1)
			if r.GetCode() != want {
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
			return check(ctx, n, t, dedupv1.CheckResult_NOT_SEEN)
		}
	case CheckHit:
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			for i := 0; i < n; i++ {
				batch[i] = hits[gen.Intn(len(hits))]
			}
			return check(ctx, n, t, dedupv1.CheckResult_SEEN)
		}
	case ClaimCommit:
		claimItems := make([]*dedupv1.ClaimItem, cfg.Batch)
		for i := range claimItems {
			claimItems[i] = &dedupv1.ClaimItem{}
		}
		claimReq := &dedupv1.ClaimRequest{Namespace: cfg.Namespace}
		commitReq := &dedupv1.CommitRequest{Namespace: cfg.Namespace, TtlMs: ttl}
		leases := make([]*dedupv1.LeaseItem, 0, cfg.Batch)
		return func(ctx context.Context, n int, t *Tally) (int, int, error) {
			gen.FreshBatch(batch[:n])
			for i := 0; i < n; i++ {
				claimItems[i].Id = batch[i]
			}
			claimReq.Items = claimItems[:n]
			claimReq.RequestToken = gen.Token()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			resp, err := cl.Claim(cctx, claimReq)
			cancel()
			if err != nil {
				return 0, 0, err
			}
			rs := resp.GetResults()
			if len(rs) != n {
				return 0, 1, fmt.Errorf("claim: %d results for %d items", len(rs), n)
			}
			leases = leases[:0]
			for i, r := range rs {
				t.Add("claim "+r.GetCode().String(), 1)
				if r.GetCode() != dedupv1.ClaimResult_ACQUIRED {
					t.Unexpected(1)
					continue
				}
				leases = append(leases, &dedupv1.LeaseItem{Id: batch[i], FencingToken: r.GetRecord().GetFencingToken()})
			}
			if len(leases) == 0 {
				return 0, 1, nil
			}
			commitReq.Items = leases
			cctx, cancel = context.WithTimeout(ctx, timeout)
			cresp, err := cl.Commit(cctx, commitReq)
			cancel()
			if err != nil {
				return 0, 1, err
			}
			done := 0
			for _, r := range cresp.GetResults() {
				t.Add("commit "+r.GetCode().String(), 1)
				if r.GetCode() == dedupv1.LeaseResult_OK {
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
