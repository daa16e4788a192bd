package demo

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
)

// Config configures a demo run. Zero values take the defaults listed.
type Config struct {
	// Broker names the embedded broker the events go through: "nats"
	// (NATS JetStream, the default), "kafka" or "rabbitmq"; see Brokers.
	Broker string
	// Messages is the number of unique events published (default 100 000).
	Messages int
	// Consumers is the number of consumer processes, each with its own
	// broker connection, dedupnode client and Batcher (default 4).
	Consumers int
	// Workers is the number of messages each consumer handles at once
	// (default 64).
	Workers int
	// Addrs, when set, names the gRPC addresses of a running cluster to
	// use; otherwise a local cluster of Nodes nodes is started in-process.
	Addrs []string
	// ClientOptions reach the cluster at Addrs (client.WithTLS,
	// client.WithToken).
	ClientOptions []client.Option
	// Nodes is the size of the local cluster (default 3).
	Nodes int
	// KillLeaderEvery, when positive, kills the leader node abruptly (no
	// leadership transfer) and restarts it, again and again while the
	// consumers run: each leader leads for this long (counted from when
	// the cluster is stable again), then dies. Needs the local cluster.
	KillLeaderEvery time.Duration
	// Dir holds the cluster's, the broker's and the ledger's data (default: a
	// temporary folder removed at the end). It must not hold an earlier
	// run's (ErrDirInUse).
	Dir string
	// RetryRate is the share of events the producer publishes a second
	// time, 1 to 3 s after the first (a retry after a lost publish ack);
	// default 0.05.
	RetryRate float64
	// ReplayRate is the size of the older range replayed (republished)
	// once 60% of the events are out, as a share of Messages; default 0.05.
	ReplayRate float64
	// CrashRate is the chance that a delivery makes its consumer crash
	// mid-message: its broker and dedupnode connections drop, every message
	// it holds is abandoned (no ack, no release), and it restarts. Default
	// 0.0005.
	CrashRate float64
	// StallRate is the chance that a delivery stalls its handler for 1.5 ×
	// AckWait, so that the broker redelivers it to another consumer while
	// the claim is held (JetStream's AckWait; on Kafka, which has no such
	// timer, the stall holds its partition back until a rebalance hands it
	// to another consumer). Default 0.001.
	StallRate float64
	// AckWait is the broker's ack wait where it has one (JetStream's
	// consumer AckWait, RabbitMQ's consumer_timeout; default 2 s).
	AckWait time.Duration
	// Lease is the claim lease per message (default 5 s): a crashed
	// consumer's messages are processed again once it has expired. It must
	// outlast a leader election (about a second here) so that commits land
	// in time.
	Lease time.Duration
	// Seed seeds the event generator and the crashes and stalls, which
	// are drawn per event and run (default: the current time).
	Seed uint64
	// Timeout bounds the whole run (default 15 min).
	Timeout time.Duration
	// Progress, if set, receives a progress bar.
	Progress io.Writer
	// Logger receives the demo's logs (default: discarded).
	Logger *slog.Logger
	// NodeLogger receives the local cluster's nodes' logs (default:
	// discarded; a killed leader's peers log connection errors).
	NodeLogger *slog.Logger
}

func (c *Config) defaults() {
	if c.Broker == "" {
		c.Broker = "nats"
	}
	if c.Messages <= 0 {
		c.Messages = 100_000
	}
	if c.Consumers <= 0 {
		c.Consumers = 4
	}
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.Nodes <= 0 {
		c.Nodes = 3
	}
	if c.RetryRate < 0 {
		c.RetryRate = 0
	}
	if c.ReplayRate < 0 {
		c.ReplayRate = 0
	}
	if c.AckWait <= 0 {
		c.AckWait = 2 * time.Second
	}
	if c.Lease <= 0 {
		c.Lease = 5 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Timeout <= 0 {
		c.Timeout = 15 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.NodeLogger == nil {
		c.NodeLogger = slog.New(slog.DiscardHandler)
	}
}

// DefaultConfig returns the settings `dedupnode demo` starts from.
func DefaultConfig() Config {
	return Config{RetryRate: 0.05, ReplayRate: 0.05, CrashRate: 0.0002, StallRate: 0.0005}
}

// Check is one verdict of the summary.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Summary is the outcome of a run.
type Summary struct {
	OK bool `json:"ok"`
	// Broker names the broker the events went through.
	Broker string `json:"broker"`
	// Cluster describes the dedupnode cluster used.
	Cluster   string `json:"cluster"`
	Consumers int    `json:"consumers"`
	Workers   int    `json:"workers_per_consumer"`
	Accounts  int    `json:"accounts"`

	Published       int `json:"published"`
	UniqueIDs       int `json:"unique_ids"`
	ProducerRetries int `json:"producer_retries"`
	Replayed        int `json:"replayed"`

	Deliveries   int64 `json:"deliveries"`
	Redeliveries int64 `json:"redeliveries"`
	// DuplicatesSuppressed counts deliveries dedupnode answered
	// "duplicate": acked without running the handler.
	DuplicatesSuppressed int64 `json:"duplicates_suppressed"`
	// InProgressDeferred counts deliveries that found another consumer's
	// claim live: nak'ed to come back later, handler not run.
	InProgressDeferred int64 `json:"in_progress_deferred"`
	// HandlerFailures counts runs that ended without an effect and
	// released (or, after a crash, abandoned) their claim.
	HandlerFailures int64 `json:"handler_failures"`
	// Unavailable counts deliveries whose claim could not be made
	// (cluster unreachable, e.g. during a leader election): nak'ed.
	Unavailable int64 `json:"dedupnode_unavailable"`
	// CommitUnconfirmed counts runs whose effect may have happened but
	// whose commit was not confirmed (crash or lost lease).
	CommitUnconfirmed int64 `json:"commit_unconfirmed"`

	EffectsApplied int64 `json:"effects_applied"`
	// LedgerRepeatsRefused counts re-runs that reached the ledger for an
	// event already applied and were refused by its idempotency check.
	LedgerRepeatsRefused int   `json:"ledger_repeats_refused"`
	LedgerTotal          int64 `json:"ledger_total"`
	ExpectedTotal        int64 `json:"expected_total"`

	ConsumerCrashes int64 `json:"consumer_crashes"`
	ConsumerStalls  int64 `json:"consumer_stalls"`
	LeaderKills     int64 `json:"leader_kills"`

	// Seconds is the time from the first publish until the broker had
	// every message acknowledged (committed); MessagesPerSecond is Published over it.
	// The last messages wait out crashed consumers' leases and AckWait, so
	// the time to 99% shows the steady rate better.
	Seconds               float64 `json:"seconds"`
	MessagesPerSecond     float64 `json:"messages_per_second"`
	SecondsTo99           float64 `json:"seconds_to_99_percent"`
	MessagesPerSecondTo99 float64 `json:"messages_per_second_to_99_percent"`
	Checks                []Check `json:"checks"`
}

type event struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

type demoRun struct {
	cfg    Config
	log    *slog.Logger
	ns     string
	addrs  []string
	cl     *devcluster.Cluster
	broker Broker
	ledger *Ledger

	deliveries, redeliveries, duplicates, deferred, failures, unavailable, unconfirmed atomic.Int64
	crashes, stalls, kills                                                             atomic.Int64

	faults *faultPlan

	mu     sync.Mutex
	atRisk map[string]bool // IDs with a run whose commit was unconfirmed
}

// faultPlan decides whether a handler run crashes or stalls. The roll is a
// function of the seed, the event and how many times that event has run, so
// a seed fixes which events fail their first run however deliveries
// interleave: a run with a fixed seed injects at least the same faults
// every time.
type faultPlan struct {
	seed  uint64
	index map[string]int  // event ID -> its place in the plan
	runs  []atomic.Uint32 // handler runs so far, per event
}

func newFaultPlan(seed uint64, events []event) *faultPlan {
	p := &faultPlan{seed: seed, index: make(map[string]int, len(events)), runs: make([]atomic.Uint32, len(events))}
	for i, ev := range events {
		p.index[ev.ID] = i
	}
	return p
}

// roll counts a run of the event and returns its draw in [0, 1); an ID
// that is not in the plan draws 1, no fault.
func (p *faultPlan) roll(id string) float64 {
	i, ok := p.index[id]
	if !ok {
		return 1
	}
	run := p.runs[i].Add(1) - 1
	return rand.New(rand.NewPCG(p.seed, uint64(i)<<32|uint64(run))).Float64()
}

var errCrashed = errors.New("consumer crashed")

// ErrDirInUse: Config.Dir holds an earlier run's data.
var ErrDirInUse = errors.New("demo data dir in use")

// holdsEarlierRun reports whether dir holds anything of an earlier run
// (the cluster's, the broker's or the ledger's data).
func holdsEarlierRun(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read demo data dir: %w", err)
	}
	for _, e := range entries {
		switch e.Name() {
		case "cluster", "broker", "ledger":
			return true, nil
		}
	}
	return false, nil
}

// Run runs the demo and returns its summary; Summary.OK says whether every
// check held. An error means the demo could not run (or was interrupted).
func Run(ctx context.Context, cfg Config) (sum Summary, err error) {
	cfg.defaults()
	if cfg.KillLeaderEvery > 0 && len(cfg.Addrs) > 0 {
		return sum, errors.New("killing the leader needs the local cluster: drop --addr or --kill-leader-every")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &demoRun{cfg: cfg, log: cfg.Logger.With("component", "demo"), atRisk: map[string]bool{}}

	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "dedupnode-demo-"); err != nil {
			return sum, err
		}
		defer os.RemoveAll(dir)
	} else if used, err := holdsEarlierRun(dir); err != nil {
		return sum, err
	} else if used {
		// Its cluster's nodes would start on new ports from the OS while
		// their Raft configuration names the old ones, and its ledger
		// holds the earlier run's effects: a run starts from nothing.
		return sum, fmt.Errorf("%w: %s holds an earlier demo run; pass a new or empty data dir", ErrDirInUse, dir)
	}
	runID := make([]byte, 4)
	for i := range runID {
		runID[i] = byte(rand.N(256))
	}
	r.ns = "demo-" + hex.EncodeToString(runID)

	// The dedupnode cluster.
	sum.Cluster = strings.Join(cfg.Addrs, ",")
	if len(cfg.Addrs) == 0 {
		r.cl, err = devcluster.Start(ctx, devcluster.Config{Nodes: cfg.Nodes, Dir: filepath.Join(dir, "cluster"), Logger: cfg.NodeLogger,
			ElectionTimeout: devcluster.FastElection, AutoCreateNamespaces: true})
		if err != nil {
			return sum, err
		}
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer ccancel()
			if cerr := r.cl.Close(cctx); cerr != nil {
				r.log.Warn("close cluster", "err", cerr)
			}
		}()
		sum.Cluster = fmt.Sprintf("%d nodes in this process", cfg.Nodes)
		if cfg.Nodes == 1 {
			sum.Cluster = "1 node in this process"
		}
		cfg.Addrs = r.cl.Addrs()
	}
	r.addrs = cfg.Addrs
	admin, err := r.newClient(ctx)
	if err != nil {
		return sum, err
	}
	defer admin.Close()
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = admin.CreateNamespace(actx, client.Namespace{Name: r.ns, DefaultTTL: time.Hour, MaxTTL: 24 * time.Hour, DefaultLease: cfg.Lease})
	acancel()
	if err != nil {
		return sum, fmt.Errorf("create namespace %s: %w", r.ns, err)
	}

	// The broker: started once the plan says how much will be published.
	sum.Broker = cfg.Broker
	// The ledger.
	if r.ledger, err = OpenLedger(filepath.Join(dir, "ledger"), r.log); err != nil {
		return sum, err
	}
	ledgerOpen := true
	defer func() {
		if ledgerOpen {
			r.ledger.Close()
		}
	}()

	// The plan: unique events, producer retries, a replay.
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	events := make([]event, cfg.Messages)
	for i := range events {
		events[i] = event{
			ID:      fmt.Sprintf("%s-evt-%07d", r.ns, i),
			Account: fmt.Sprintf("acct-%03d", rng.IntN(100)),
			Amount:  1 + rng.Int64N(1000),
		}
		sum.ExpectedTotal += events[i].Amount
	}
	r.faults = newFaultPlan(cfg.Seed, events)
	retryDelay := make(map[int]time.Duration)
	for i := range events {
		if rng.Float64() < cfg.RetryRate {
			retryDelay[i] = time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		}
	}
	replayFrom, replayN := cfg.Messages/10, int(cfg.ReplayRate*float64(cfg.Messages))
	replayAt := cfg.Messages * 6 / 10
	sum.UniqueIDs, sum.ProducerRetries, sum.Replayed = cfg.Messages, len(retryDelay), replayN
	sum.Published = cfg.Messages + len(retryDelay) + replayN
	sum.Consumers, sum.Workers = cfg.Consumers, cfg.Workers

	r.broker, err = OpenBroker(ctx, cfg.Broker, BrokerConfig{
		Dir: filepath.Join(dir, "broker"), Consumers: cfg.Consumers, Workers: cfg.Workers,
		AckWait: cfg.AckWait, Published: sum.Published, Logger: r.log,
	})
	if err != nil {
		return sum, err
	}
	defer r.broker.Close()

	// Consumers, then the leader killer, then the producer.
	start := time.Now()
	cctx, stopConsumers := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	for i := range cfg.Consumers {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			r.consumer(cctx, i)
		}()
	}
	defer func() {
		stopConsumers()
		cwg.Wait()
	}()
	var kwg sync.WaitGroup
	if cfg.KillLeaderEvery > 0 {
		kwg.Add(1)
		go func() {
			defer kwg.Done()
			r.killLeaders(cctx)
		}()
	}
	defer kwg.Wait()

	// Progress: the bar, and when 99% of the messages were acknowledged.
	var bar *progressbar.ProgressBar
	if cfg.Progress != nil {
		bar = progressbar.NewOptions64(int64(sum.Published),
			progressbar.OptionSetWriter(cfg.Progress),
			progressbar.OptionSetDescription("messages acked"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("msg"),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetWidth(30),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(cfg.Progress) }),
		)
	}
	var to99 atomic.Int64 // nanoseconds from start
	pctx, stopProgress := context.WithCancel(ctx)
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			n := r.ackedCount()
			if bar != nil {
				_ = bar.Set64(n)
			}
			if to99.Load() == 0 && n*100 >= int64(sum.Published)*99 {
				to99.Store(int64(time.Since(start)))
			}
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() {
		stopProgress()
		pwg.Wait()
	}()

	if err := r.publish(ctx, events, retryDelay, replayFrom, replayN, replayAt); err != nil {
		return sum, err
	}
	r.log.Info("all published", "messages", sum.Published, "after", time.Since(start).Round(time.Millisecond), "acked", r.ackedCount())

	// Wait until the broker has every message acknowledged.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if done, err := r.broker.Drained(ctx, sum.Published); err == nil && done {
			break
		}
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("waiting for every message to be acknowledged (%d of %d so far): %w", r.ackedCount(), sum.Published, ctx.Err())
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)
	stopProgress()
	pwg.Wait()
	if bar != nil {
		_ = bar.Set64(int64(sum.Published))
		_ = bar.Finish()
	}
	// The last percent may have been acknowledged between two ticks.
	to99.CompareAndSwap(0, int64(elapsed))
	if d := time.Duration(to99.Load()); d > 0 {
		sum.SecondsTo99 = d.Seconds()
		sum.MessagesPerSecondTo99 = float64(sum.Published) * 0.99 / d.Seconds()
	}
	stopConsumers()
	cwg.Wait()
	kwg.Wait()

	// The ledger as stored, after a reopen.
	if err := r.ledger.Close(); err != nil {
		return sum, err
	}
	ledgerOpen = false
	l2, err := OpenLedger(filepath.Join(dir, "ledger"), r.log)
	if err != nil {
		return sum, err
	}
	st, err := l2.Scan()
	l2.Close()
	if err != nil {
		return sum, err
	}

	expectBal := map[string]int64{}
	for _, ev := range events {
		expectBal[ev.Account] += ev.Amount
	}
	sum.Deliveries = r.deliveries.Load()
	sum.Redeliveries = r.redeliveries.Load()
	sum.DuplicatesSuppressed = r.duplicates.Load()
	sum.InProgressDeferred = r.deferred.Load()
	sum.HandlerFailures = r.failures.Load()
	sum.Unavailable = r.unavailable.Load()
	sum.CommitUnconfirmed = r.unconfirmed.Load()
	sum.EffectsApplied = int64(st.AppliedIDs)
	sum.LedgerTotal = st.Total
	sum.ConsumerCrashes = r.crashes.Load()
	sum.ConsumerStalls = r.stalls.Load()
	sum.LeaderKills = r.kills.Load()
	sum.Seconds = elapsed.Seconds()
	sum.MessagesPerSecond = float64(sum.Published) / elapsed.Seconds()

	repeats := r.ledger.Repeats()
	unexplained := 0
	r.mu.Lock()
	for id, n := range repeats {
		sum.LedgerRepeatsRefused += n
		if !r.atRisk[id] {
			unexplained++
		}
	}
	r.mu.Unlock()
	sum.Accounts = len(expectBal)
	badAccounts := 0
	for acct, want := range expectBal {
		if st.Balances[acct] != want {
			badAccounts++
		}
	}
	sum.Checks = []Check{
		{"effects applied == unique IDs", sum.EffectsApplied == int64(sum.UniqueIDs),
			fmt.Sprintf("%d effects in the ledger for %d unique event IDs", sum.EffectsApplied, sum.UniqueIDs)},
		{"ledger total == expected", sum.LedgerTotal == sum.ExpectedTotal && badAccounts == 0,
			fmt.Sprintf("total %d, expected %d; %d of %d accounts off", sum.LedgerTotal, sum.ExpectedTotal, badAccounts, len(expectBal))},
		{"no silent second run", unexplained == 0,
			fmt.Sprintf("%d re-runs reached the ledger, %d of them for events whose earlier run was not reported as unconfirmed by Process", sum.LedgerRepeatsRefused, unexplained)},
	}
	sum.OK = true
	for _, c := range sum.Checks {
		sum.OK = sum.OK && c.OK
	}
	return sum, nil
}

func (r *demoRun) newClient(ctx context.Context) (*client.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	opts := append([]client.Option{client.WithTimeout(5 * time.Second), client.WithRetry(100, 50*time.Millisecond, time.Second)}, r.cfg.ClientOptions...)
	return client.New(dctx, r.addrs, opts...)
}

func (r *demoRun) ackedCount() int64 { return r.broker.Acked() }

// publish sends every event once in order, each planned producer retry
// 1-3 s after its event, and the replay of an older range when 60% are out.
func (r *demoRun) publish(ctx context.Context, events []event, retryDelay map[int]time.Duration, replayFrom, replayN, replayAt int) error {
	type retry struct {
		due time.Time
		i   int
	}
	retries := make(chan retry, len(retryDelay)+1)
	var failed atomic.Value
	send := func(i int) {
		b, _ := json.Marshal(events[i])
		if err := r.broker.Publish(ctx, b); err != nil {
			failed.Store(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the retrying producer
		defer wg.Done()
		for rt := range retries {
			select {
			case <-time.After(time.Until(rt.due)):
			case <-ctx.Done():
				return
			}
			send(rt.i)
		}
	}()
	for i := range events {
		if ctx.Err() != nil {
			break
		}
		send(i)
		if d, ok := retryDelay[i]; ok {
			retries <- retry{due: time.Now().Add(d), i: i}
		}
		if i+1 == replayAt {
			for j := replayFrom; j < replayFrom+replayN && j < len(events); j++ {
				send(j)
			}
		}
	}
	close(retries)
	wg.Wait()
	if err := r.broker.Flush(ctx); err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	if err, _ := failed.Load().(error); err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	return ctx.Err()
}

// consumer runs one consumer process, restarting it after each crash.
func (r *demoRun) consumer(ctx context.Context, idx int) {
	for gen := 0; ctx.Err() == nil; gen++ {
		if err := r.consumerInstance(ctx, idx, gen); err != nil && ctx.Err() == nil {
			r.log.Warn("consumer stopped", "consumer", idx, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// consumerInstance is one life of a consumer process: it runs until ctx
// ends or it crashes.
func (r *demoRun) consumerInstance(ctx context.Context, idx, gen int) error {
	ictx, die := context.WithCancel(ctx)
	defer die()
	c, err := r.newClient(ictx)
	if err != nil {
		return err
	}
	defer c.Close()
	b := c.NewBatcher()
	defer b.Close()

	var (
		once    sync.Once
		crashed atomic.Bool
		cons    Consumer
	)
	crash := func() {
		once.Do(func() {
			crashed.Store(true)
			r.crashes.Add(1)
			// The process dies: its connections drop, nothing more is
			// acknowledged, released or committed.
			cons.Kill()
			die()
			c.Close()
		})
	}
	cons, err = r.broker.NewConsumer(ictx, ConsumerSpec{
		Name:            fmt.Sprintf("consumer-%d.%d", idx, gen),
		Processor:       b,
		Namespace:       r.ns,
		IDField:         "id",
		Workers:         r.cfg.Workers,
		ProcessOptions:  []client.ProcessOption{client.WithLease(r.cfg.Lease)},
		RetryDelay:      500 * time.Millisecond,
		InProgressDelay: 2 * time.Second,
		Handler:         r.handler(crash),
		Observe:         func(d Delivery) { r.observe(d, crashed.Load()) },
	})
	if err != nil {
		return err
	}
	err = cons.Run(ictx)
	if ictx.Err() != nil {
		return nil // stopped or crashed: restart
	}
	return err
}

// handler applies one event to the ledger, crashing or stalling now and
// then.
func (r *demoRun) handler(crash func()) func(ctx context.Context, body []byte) error {
	return func(ctx context.Context, body []byte) error {
		var ev event
		if err := json.Unmarshal(body, &ev); err != nil {
			return err
		}
		switch roll := r.faults.roll(ev.ID); {
		case roll < r.cfg.CrashRate:
			crash()
			return errCrashed
		case roll < r.cfg.CrashRate+r.cfg.StallRate:
			r.stalls.Add(1)
			select {
			case <-time.After(r.cfg.AckWait * 3 / 2):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		// The lease is lost or the consumer died: the effect must not
		// happen.
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		lease, _ := client.LeaseFrom(ctx)
		err := r.ledger.Apply(ev.ID, lease.FencingToken, ev.Account, ev.Amount)
		if errors.Is(err, ErrAlreadyApplied) {
			return nil // the second layer: already there, commit it
		}
		return err
	}
}

// observe counts one delivery; crashed says whether its consumer had
// crashed by the time the delivery ended.
func (r *demoRun) observe(d Delivery, crashed bool) {
	r.deliveries.Add(1)
	if d.Redelivered {
		r.redeliveries.Add(1)
	}
	switch d.Outcome {
	case client.OutcomeDuplicate:
		r.duplicates.Add(1)
	case client.OutcomeInProgress:
		r.deferred.Add(1)
	case client.OutcomeFailed:
		r.failures.Add(1)
	case client.OutcomeLeaseLost, client.OutcomeError:
		if !d.Ran {
			if crashed {
				r.failures.Add(1) // its claim died with the consumer
			} else {
				r.unavailable.Add(1)
			}
			break
		}
		r.unconfirmed.Add(1)
		r.mu.Lock()
		r.atRisk[string(d.ID)] = true
		r.mu.Unlock()
	}
}

// killLeaders lets each leader lead for KillLeaderEvery, then kills it
// abruptly and restarts it, until ctx ends. The interval counts from the
// moment the cluster is stable again (a ready leader known to every node),
// so the cluster serves between kills however long elections and restarts
// take.
func (r *demoRun) killLeaders(ctx context.Context) {
	for {
		if _, err := r.cl.WaitLeader(ctx); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.KillLeaderEvery):
		}
		i, err := r.cl.KillLeader(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("kill leader", "err", err)
			}
			continue
		}
		r.kills.Add(1)
		r.log.Info("leader killed", "node", r.cl.NodeID(i))
		if err := r.cl.Restart(ctx, i); err != nil && ctx.Err() == nil {
			r.log.Warn("restart node", "node", r.cl.NodeID(i), "err", err)
		}
	}
}
