// Package kafkadedup runs Kafka record handlers at most once per message ID
// with dedupnode, on franz-go's kgo consumer groups, and commits a record's
// offset only after its effect.
//
// A Kafka consumer group is at-least-once: a consumer that dies after its
// effect and before its offset commit, a rebalance that moves a partition
// while its records are in flight, and a producer retry that wrote a
// record twice all deliver a record again. Each record goes through
// dedupnode's Claim → handler → Commit (client.Process): a redelivery of a
// processed record is committed without running the handler, a record whose
// ID another consumer is processing waits until that one finishes, and a
// handler that fails releases its claim and is retried in place.
//
//	d, _ := kafkadedup.New(kafkadedup.Config{
//		Processor: batcher, // a *client.Batcher (or *client.Client)
//		Namespace: "payments-consumer",
//		Handler: func(ctx context.Context, rec *kgo.Record) error {
//			return chargeCard(ctx, rec.Value)
//		},
//	})
//	cl, _ := kgo.NewClient(append(d.ClientOpts(),
//		kgo.SeedBrokers("127.0.0.1:9092"),
//		kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments"))...)
//	defer cl.Close()
//	err := d.Run(ctx, cl)
//
// Offsets: ClientOpts disables kgo's autocommit. Run commits, per
// partition, the offset after the longest run of finished records from the
// last commit (so a record still in flight holds its partition's commit
// back, never skipped), every CommitInterval, when a partition is revoked,
// and when Run stops. A record is finished when Process answered processed
// or duplicate, or when it was skipped (no usable ID, or its ID recorded
// with another payload digest: retrying cannot fix those; Observe reports
// them). Up to Workers records are handled at once, across and within
// partitions: set Workers to 1 where the order of effects within a
// partition matters.
package kafkadedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/internal/settle"
	"github.com/dedupnode/dedupnode/integrations/msgid"
)

// IDFunc returns the dedup ID of a record. An error wrapping msgid.ErrNoID
// means the record has none.
type IDFunc func(rec *kgo.Record) ([]byte, error)

// HeaderID takes the ID from the record header name (the first one, if
// the header is repeated).
func HeaderID(name string) IDFunc {
	return func(rec *kgo.Record) ([]byte, error) {
		for _, h := range rec.Headers {
			if h.Key == name && len(h.Value) > 0 {
				return h.Value, nil
			}
		}
		return nil, fmt.Errorf("%w: no %s header", msgid.ErrNoID, name)
	}
}

// KeyID takes the ID from the record key. Use it only when producers key
// each message by its own unique ID: on a topic keyed by entity (customer,
// order), every record of an entity shares the key, and all but the first
// would be taken for duplicates.
func KeyID() IDFunc {
	return func(rec *kgo.Record) ([]byte, error) {
		if len(rec.Key) == 0 {
			return nil, fmt.Errorf("%w: no record key", msgid.ErrNoID)
		}
		return rec.Key, nil
	}
}

// JSONFieldID takes the ID from a field of the JSON value (see
// msgid.JSONField for the path syntax).
func JSONFieldID(path string) IDFunc {
	return func(rec *kgo.Record) ([]byte, error) { return msgid.JSONField(rec.Value, path) }
}

// ContentID derives the ID from the record value: its hex SHA-256, so that
// identical values are duplicates.
func ContentID() IDFunc {
	return func(rec *kgo.Record) ([]byte, error) { return msgid.Content(rec.Value), nil }
}

// DebeziumID derives the ID from a Debezium change event, the record's key
// and value (msgid.DebeziumID): an event that a restarted connector emits
// again gets the same ID. Tombstones and heartbeats have none (skipped).
func DebeziumID() IDFunc {
	return func(rec *kgo.Record) ([]byte, error) { return msgid.DebeziumID(rec.Key, rec.Value) }
}

// FirstID tries each IDFunc in turn and returns the first ID found; it
// fails with the last error when none yields one.
func FirstID(fns ...IDFunc) IDFunc {
	return func(rec *kgo.Record) ([]byte, error) {
		err := fmt.Errorf("%w: no ID function given", msgid.ErrNoID)
		for _, fn := range fns {
			var id []byte
			if id, err = fn(rec); err == nil && len(id) > 0 {
				return id, nil
			}
		}
		return nil, err
	}
}

// DefaultHeader is the header IDSources reads by default.
const DefaultHeader = "message-id"

// IDSources says where a record's ID comes from, in this order of
// preference: the header Header, the record key (if Key), the JSON field
// JSONField of the value (if set), the value's content hash (unless
// NoContent). The zero value reads the "message-id" header, else hashes the
// value.
type IDSources struct {
	// Header is the header holding the ID (default DefaultHeader; "-" for
	// none).
	Header string
	// Key takes the record key when the header is absent (see KeyID for
	// when that is safe).
	Key bool
	// JSONField is a field path in a JSON value ("id", "data.event_id").
	JSONField string
	// NoContent turns the content hash off: a record with no ID from the
	// sources above is skipped instead.
	NoContent bool
}

// Func returns the IDFunc trying the sources in order.
func (s IDSources) Func() IDFunc {
	var fns []IDFunc
	switch s.Header {
	case "":
		fns = append(fns, HeaderID(DefaultHeader))
	case "-":
	default:
		fns = append(fns, HeaderID(s.Header))
	}
	if s.Key {
		fns = append(fns, KeyID())
	}
	if s.JSONField != "" {
		fns = append(fns, JSONFieldID(s.JSONField))
	}
	if !s.NoContent {
		fns = append(fns, ContentID())
	}
	return FirstID(fns...)
}

// Config configures a Consumer.
type Config struct {
	// Processor runs the handler at most once per ID: a *client.Batcher
	// (claims and commits of concurrent records share RPCs) or a
	// *client.Client. Required.
	Processor client.Processor
	// Namespace is the dedupnode namespace, typically one per consumer
	// group. Required.
	Namespace string
	// Handler applies the record's effect. Its context is cancelled when
	// the claim's lease is lost or Run stops; check it before making the
	// effect visible. Required.
	Handler func(ctx context.Context, rec *kgo.Record) error
	// ID extracts the record's ID (default: IDSources{}.Func(), the
	// "message-id" header, else the content hash).
	ID IDFunc
	// DigestPayload sends the value's SHA-256 with the claim, so that an
	// ID reused for another value is reported and skipped instead of
	// committed as a duplicate.
	DigestPayload bool
	// Workers is the number of records handled at once (default 16).
	Workers int
	// MaxInFlight bounds the records polled and not yet finished (default
	// 4 × Workers; at least Workers): a record that cannot finish (its
	// handler fails again and again) stops the consumer from running ahead
	// of it unboundedly.
	MaxInFlight int
	// RetryDelay is the wait before a record is tried again after a
	// handler error, a lost lease or an unreachable cluster (default 1 s).
	RetryDelay time.Duration
	// InProgressDelay caps the wait before a record whose ID another
	// consumer holds is tried again; the wait is the time left on that
	// consumer's lease, at least 50 ms (default 5 s).
	InProgressDelay time.Duration
	// CommitInterval is how often finished records' offsets are committed
	// (default 1 s).
	CommitInterval time.Duration
	// ProcessOptions are passed to every Process call (lease, commit TTL).
	ProcessOptions []client.ProcessOption
	// Observe, if set, is called after each attempt at a record.
	Observe func(rec *kgo.Record, r Result)
	// OnCommit, if set, is called after each successful offset commit with
	// the records whose offsets (plus one) were committed, one per
	// partition.
	OnCommit func(recs []*kgo.Record)
	// Logger receives commit and fetch errors (default: discarded).
	Logger *slog.Logger
}

// Action is what the Consumer did with a record after one attempt.
type Action string

const (
	// ActionCommit: the record is finished (processed, or a duplicate);
	// its offset will be committed.
	ActionCommit Action = "commit"
	// ActionRetry: the record will be tried again after Result.Delay.
	ActionRetry Action = "retry"
	// ActionSkip: the record has no usable ID, or its ID was recorded with
	// another payload digest; retrying cannot fix it, so it is finished
	// without running the handler, and Observe is the place to report it.
	ActionSkip Action = "skip"
)

// Result is what happened in one attempt at a record.
type Result struct {
	// ID is the record's dedup ID (nil when none could be found).
	ID []byte
	// Attempt counts the attempts at this record in this consumer, from 1.
	Attempt int
	// Outcome is Process's outcome (OutcomeUnknown when no ID was found).
	Outcome client.Outcome
	// Ran says whether the handler ran.
	Ran bool
	// Action is what follows; Delay the wait before a retry.
	Action Action
	Delay  time.Duration
	// Err is the handler's or dedupnode's error, if any.
	Err error
}

// Consumer handles the records of one kgo group client at most once per ID.
// Build the client with ClientOpts, then call Run once.
type Consumer struct {
	cfg Config
	log *slog.Logger

	commitMu sync.Mutex // one offset commit at a time

	mu     sync.Mutex
	parts  map[tp]*partState // partitions with records not yet committed
	owned  map[tp]bool       // assigned to this member, as last told by the group
	ranRun bool
}

type tp struct {
	topic     string
	partition int32
}

// partState holds one partition's polled records not yet committed, in
// offset order.
type partState struct {
	recs    []*kgo.Record
	done    []bool
	trimmed int  // records committed and dropped from the front
	alive   bool // still assigned: its offsets may be committed
}

// New checks cfg and returns a Consumer.
func New(cfg Config) (*Consumer, error) {
	var errs []error
	if cfg.Processor == nil {
		errs = append(errs, errors.New("Processor is required"))
	}
	if cfg.Namespace == "" {
		errs = append(errs, errors.New("Namespace is required"))
	}
	if cfg.Handler == nil {
		errs = append(errs, errors.New("Handler is required"))
	}
	if cfg.Workers < 0 || cfg.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("Workers (%d) and MaxInFlight (%d) must not be negative", cfg.Workers, cfg.MaxInFlight))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetryDelay", cfg.RetryDelay}, {"InProgressDelay", cfg.InProgressDelay}, {"CommitInterval", cfg.CommitInterval}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative (0: the default)", d.name, d.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kafkadedup: %w", err)
	}
	if cfg.ID == nil {
		cfg.ID = IDSources{}.Func()
	}
	if cfg.Workers == 0 {
		cfg.Workers = 16
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 4 * cfg.Workers
	}
	if cfg.MaxInFlight < cfg.Workers {
		// Raising it to Workers silently would let more records in
		// flight than asked.
		return nil, fmt.Errorf("kafkadedup: MaxInFlight %d is below Workers %d: each worker handles a record in flight", cfg.MaxInFlight, cfg.Workers)
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.InProgressDelay == 0 {
		cfg.InProgressDelay = 5 * time.Second
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Consumer{cfg: cfg, log: cfg.Logger, parts: map[tp]*partState{}, owned: map[tp]bool{}}, nil
}

// ClientOpts are the kgo options the Consumer needs on its client: manual
// offset commits (kgo.DisableAutoCommit) and the group callbacks that
// commit a revoked partition's finished records and stop committing lost
// ones. Add the seed brokers, kgo.ConsumerGroup and the topics.
func (c *Consumer) ClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
	}
}

func (c *Consumer) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range assigned {
		for _, p := range ps {
			c.owned[tp{t, p}] = true
		}
	}
}

// onRevoked commits what the revoked partitions finished, so that their
// next owner starts after it, and stops committing them: the next owner
// commits from now on (a later commit from here could rewind its).
func (c *Consumer) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.commit(ctx, cl, revoked)
	c.drop(revoked)
}

// onLost drops the lost partitions without committing: the member is no
// longer in the group, so its commits would be refused.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) { c.drop(lost) }

func (c *Consumer) drop(parts map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			k := tp{t, p}
			delete(c.owned, k)
			if st := c.parts[k]; st != nil {
				st.alive = false
				delete(c.parts, k)
			}
		}
	}
}

// Run polls cl and handles its records until ctx ends, then waits for the
// records in flight (their handlers see ctx cancelled), commits what
// finished, and returns nil. It returns an error if cl is closed under it.
// cl must be a group consumer built with ClientOpts; Run may be called once.
func (c *Consumer) Run(ctx context.Context, cl *kgo.Client) error {
	c.mu.Lock()
	if c.ranRun {
		c.mu.Unlock()
		return errors.New("kafkadedup: Run called twice")
	}
	c.ranRun = true
	c.mu.Unlock()

	type job struct {
		rec *kgo.Record
		st  *partState
		i   int // index in st counting trimmed records
	}
	work := make(chan job)
	slots := make(chan struct{}, c.cfg.MaxInFlight)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				if c.handle(ctx, j.rec, j.st) {
					c.mu.Lock()
					j.st.done[j.i-j.st.trimmed] = true
					c.mu.Unlock()
				}
				<-slots
			}
		}()
	}
	// The committer: finished records' offsets every CommitInterval.
	stopCommitter := make(chan struct{})
	var cwg sync.WaitGroup
	cwg.Add(1)
	go func() {
		defer cwg.Done()
		t := time.NewTicker(c.cfg.CommitInterval)
		defer t.Stop()
		for {
			select {
			case <-stopCommitter:
				return
			case <-t.C:
				c.commit(ctx, cl, nil)
			}
		}
	}()
	finish := func() {
		close(work)
		wg.Wait()
		close(stopCommitter)
		cwg.Wait()
		// What finished is committed even though ctx ended: its effects
		// happened. A closed (crashed) client simply fails to.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		c.commit(fctx, cl, nil)
	}

	for {
		// Wait for a free slot, then take every free one.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			finish()
			return nil
		}
		n := 1
	take:
		for n < c.cfg.MaxInFlight {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break take
			}
		}
		fetches := cl.PollRecords(ctx, n)
		if fetches.IsClientClosed() {
			for range n {
				<-slots
			}
			finish()
			if ctx.Err() != nil {
				return nil
			}
			return errors.New("kafkadedup: client closed")
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.log.Warn("kafkadedup: fetch", "topic", t, "partition", p, "err", err)
			}
		})
		var jobs []job
		c.mu.Lock()
		fetches.EachRecord(func(rec *kgo.Record) {
			k := tp{rec.Topic, rec.Partition}
			st := c.parts[k]
			if st == nil {
				st = &partState{alive: c.owned[k]}
				if st.alive {
					c.parts[k] = st
				}
			}
			st.recs = append(st.recs, rec)
			st.done = append(st.done, false)
			jobs = append(jobs, job{rec, st, st.trimmed + len(st.recs) - 1})
		})
		c.mu.Unlock()
		for range n - len(jobs) {
			<-slots
		}
		for _, j := range jobs {
			work <- j
		}
		if ctx.Err() != nil {
			finish()
			return nil
		}
	}
}

// handle runs attempts at rec until it is finished (true), or ctx ends or
// its partition is revoked (false: the next owner takes it over).
func (c *Consumer) handle(ctx context.Context, rec *kgo.Record, st *partState) bool {
	for attempt := 1; ; attempt++ {
		r := c.attempt(ctx, rec)
		r.Attempt = attempt
		if c.cfg.Observe != nil {
			c.cfg.Observe(rec, r)
		}
		if r.Action != ActionRetry {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(r.Delay):
		}
		c.mu.Lock()
		alive := st.alive
		c.mu.Unlock()
		if !alive {
			return false
		}
	}
}

func (c *Consumer) attempt(ctx context.Context, rec *kgo.Record) Result {
	id, err := c.cfg.ID(rec)
	if err == nil && len(id) == 0 {
		err = msgid.ErrNoID
	}
	if err != nil {
		return Result{Action: ActionSkip, Err: fmt.Errorf("message ID: %w", err)}
	}
	opts := c.cfg.ProcessOptions
	if c.cfg.DigestPayload {
		opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(rec.Value)))
	}
	res, err := c.cfg.Processor.Process(ctx, c.cfg.Namespace, id, func(ctx context.Context) error {
		return c.cfg.Handler(ctx, rec)
	}, opts...)
	r := Result{ID: id, Outcome: res.Outcome, Ran: res.Ran, Err: err}
	dec := settle.Decide(res, id, c.cfg.InProgressDelay, c.cfg.RetryDelay)
	switch dec.Action {
	case settle.Done:
		r.Action = ActionCommit
	case settle.Drop:
		r.Action, r.Err = ActionSkip, dec.Err
	default:
		r.Action, r.Delay = ActionRetry, dec.Delay
	}
	return r
}

// commit commits, for each partition still owned (only those in only, if
// not nil), the offset after the longest run of finished records from the
// last commit.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, only map[string][]int32) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	type head struct {
		st *partState
		n  int // records committed by this commit
	}
	var heads []head
	var recs []*kgo.Record
	c.mu.Lock()
	for k, st := range c.parts {
		if only != nil && !containsPartition(only, k) {
			continue
		}
		n := 0
		for n < len(st.done) && st.done[n] {
			n++
		}
		if n == 0 || !st.alive {
			continue
		}
		heads = append(heads, head{st, n})
		recs = append(recs, st.recs[n-1])
	}
	c.mu.Unlock()
	if len(recs) == 0 {
		return
	}
	if err := cl.CommitRecords(ctx, recs...); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("kafkadedup: commit offsets", "err", err)
		}
		return
	}
	c.mu.Lock()
	for _, h := range heads {
		h.st.recs = h.st.recs[h.n:]
		h.st.done = h.st.done[h.n:]
		h.st.trimmed += h.n
	}
	c.mu.Unlock()
	if c.cfg.OnCommit != nil {
		c.cfg.OnCommit(recs)
	}
}

func containsPartition(parts map[string][]int32, k tp) bool {
	for _, p := range parts[k.topic] {
		if p == k.partition {
			return true
		}
	}
	return false
}
