package kafkadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/demo"
	"github.com/dedupnode/dedupnode/integrations/kafkadedup"
	"github.com/dedupnode/dedupnode/integrations/msgid"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

const topic = "payments"

type env struct {
	t     *testing.T
	kafka *demo.Kafka
	addrs []string // dedupnode
	admin *kgo.Client
}

func setup(t *testing.T, partitions int32) *env {
	t.Helper()
	cl := testcluster.Demo(t)
	k, err := demo.StartKafka(topic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	admin, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return &env{t: t, kafka: k, addrs: cl.Addrs(), admin: admin}
}

// produce writes one record per body, synchronously. Not idempotent: a
// retried produce whose first attempt was written after all writes the
// record twice.
func (e *env) produce(ctx context.Context, recs ...*kgo.Record) {
	e.t.Helper()
	p, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...), kgo.DefaultProduceTopic(topic),
		kgo.DisableIdempotentWrite(), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Close()
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// effects is the handlers' side effect: how many times each event took
// effect.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: map[string]int{}} }

func (f *effects) apply(ctx context.Context, rec *kgo.Record) error {
	var ev struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(rec.Value, &ev); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[ev.ID]++
	return nil
}

func (f *effects) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.n)
}

// exactlyOnce fails the test unless each of ids took effect exactly once
// and nothing else did.
func (f *effects) exactlyOnce(t *testing.T, ids []string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if f.n[id] != 1 {
			t.Errorf("event %s took effect %d times", id, f.n[id])
		}
	}
	if len(f.n) != len(ids) {
		t.Errorf("%d events took effect, want %d", len(f.n), len(ids))
	}
}

func event(i int) (string, []byte) {
	id := fmt.Sprintf("pay-%04d", i)
	return id, []byte(fmt.Sprintf(`{"id":%q,"amount":%d}`, id, i))
}

// outcomes counts Observe's results by outcome and action.
type outcomes struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *outcomes) observe(_ *kgo.Record, r kafkadedup.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[r.Outcome.String()]++
	o.n[string(r.Action)]++
}

func (o *outcomes) get(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[k]
}

// member is one consumer process: its own dedupnode Batcher and kgo
// client, with a kill switch on its connections.
type member struct {
	cl   *kgo.Client
	d    *kafkadedup.Consumer
	kill *demo.KillSwitch
	ctx  context.Context
	stop context.CancelFunc
	done chan error
}

func newMember() *member {
	ctx, cancel := context.WithCancel(context.Background())
	return &member{kill: &demo.KillSwitch{}, ctx: ctx, stop: cancel, done: make(chan error, 1)}
}

func (e *env) start(t *testing.T, group string, cfg kafkadedup.Config) *member {
	t.Helper()
	return e.launch(t, group, cfg, newMember())
}

// launch runs m as a member of group.
func (e *env) launch(t *testing.T, group string, cfg kafkadedup.Config, m *member) *member {
	t.Helper()
	cfg.Processor = testcluster.Batcher(t, e.addrs)
	if cfg.Namespace == "" {
		cfg.Namespace = group
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = 100 * time.Millisecond
	}
	d, err := kafkadedup.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.d = d
	m.cl, err = kgo.NewClient(append(d.ClientOpts(),
		kgo.SeedBrokers(e.kafka.Addrs()...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(time.Second),
		kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.Dialer(m.kill.Dial),
		kgo.RetryTimeout(2*time.Second),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.shutdown(t) })
	go func() { m.done <- d.Run(m.ctx, m.cl) }()
	return m
}

// shutdown stops Run, waits for it and closes the client (idempotent).
func (m *member) shutdown(t *testing.T) {
	m.stop()
	if m.done != nil {
		select {
		case err := <-m.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("Run did not return within 60s of its context ending")
		}
		m.done = nil
		m.cl.Close()
	}
}

// waitCommitted waits until group committed every record of the topic
// and the topic holds at least records.
func (e *env) waitCommitted(t *testing.T, group string, records int64) {
	t.Helper()
	testcluster.WaitFor(t, 60*time.Second, "every offset committed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lag, total, err := demo.GroupLag(ctx, e.admin, group, topic)
		return err == nil && lag == 0 && total >= records
	})
}

// A consumer killed after a record's effect (and its dedupnode commit) and
// before its offset commit: the group hands its partition to the next
// consumer from the last committed offset, which receives the record
// again; dedupnode answers duplicate and the effect stays single.
func TestKilledAfterEffectBeforeOffsetCommit(t *testing.T) {
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var ids []string
	var recs []*kgo.Record
	for i := range 20 {
		id, body := event(i)
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Value: body, Headers: []kgo.RecordHeader{{Key: kafkadedup.DefaultHeader, Value: []byte(id)}}})
	}
	e.produce(ctx, recs...)

	fx := newEffects()
	killed := make(chan struct{})
	var once sync.Once
	a := newMember()
	e.launch(t, "g-kill", kafkadedup.Config{
		Handler:        fx.apply,
		Workers:        1,
		CommitInterval: time.Hour, // no commit before the kill
		Observe: func(rec *kgo.Record, r kafkadedup.Result) {
			// Record 9's effect and dedupnode commit are done; its offset
			// (and those before it) is not committed yet: kill.
			if rec.Offset == 9 && r.Action == kafkadedup.ActionCommit {
				once.Do(func() {
					a.kill.Kill()
					a.stop()
					close(killed)
				})
			}
		},
	}, a)
	select {
	case <-killed:
	case <-ctx.Done():
		t.Fatal("record 9 was never processed")
	}
	if got := fx.count(); got != 10 {
		t.Fatalf("%d effects before the kill, want 10", got)
	}
	lag, _, err := demo.GroupLag(ctx, e.admin, "g-kill", topic)
	if err != nil || lag != 20 {
		t.Fatalf("before the next consumer: lag %d (%v), want 20: no offset committed", lag, err)
	}

	var ob outcomes
	e.start(t, "g-kill", kafkadedup.Config{Handler: fx.apply, Workers: 4, Observe: ob.observe})
	e.waitCommitted(t, "g-kill", 20)
	fx.exactlyOnce(t, ids)
	if d := ob.get("duplicate"); d < 10 {
		t.Fatalf("the next consumer saw %d duplicates, want the 10 records redelivered after the kill: %v", d, ob.n)
	}
}

// A rebalance while records are in flight: consumer A is stalled on one
// record of each partition when B joins; the partitions moved to B are
// redelivered to it from A's last commit, including the records A is
// still processing (B finds their IDs in progress and waits), and A's
// later records of those partitions. Every effect happens once.
func TestRebalanceWhileRecordsInFlight(t *testing.T) {
	e := setup(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var ids []string
	var recs []*kgo.Record
	for i := range 80 {
		id, body := event(i)
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Value: body})
	}
	e.produce(ctx, recs...) // round robin: 20 per partition

	fx := newEffects()
	release := make(chan struct{})
	var stalled sync.WaitGroup
	stalled.Add(4)
	var aOut, bOut outcomes
	// A stalls on offset 3 of each partition until B has seen an ID in
	// progress; its handler failing once on offset 5 exercises the retry
	// in place too.
	var failOnce sync.Map
	e.start(t, "g-rebalance", kafkadedup.Config{
		Handler: func(ctx context.Context, rec *kgo.Record) error {
			switch rec.Offset {
			case 3:
				stalled.Done()
				select {
				case <-release:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			case 5:
				if _, again := failOnce.LoadOrStore(rec.Partition, true); !again {
					return errors.New("transient failure")
				}
			}
			return fx.apply(ctx, rec)
		},
		ID:         kafkadedup.IDSources{JSONField: "id"}.Func(),
		Workers:    16,
		RetryDelay: 50 * time.Millisecond,
		Observe:    aOut.observe,
	})
	stallDone := make(chan struct{})
	go func() { stalled.Wait(); close(stallDone) }()
	select {
	case <-stallDone:
	case <-ctx.Done():
		t.Fatal("A never stalled on every partition")
	}

	e.start(t, "g-rebalance", kafkadedup.Config{
		Handler:         fx.apply,
		ID:              kafkadedup.IDSources{JSONField: "id"}.Func(),
		Workers:         16,
		InProgressDelay: 100 * time.Millisecond,
		Observe:         bOut.observe,
	})
	testcluster.WaitFor(t, 60*time.Second, "B to find a record in progress at A", func() bool { return bOut.get("in_progress") > 0 })
	close(release)
	e.waitCommitted(t, "g-rebalance", 80)
	fx.exactlyOnce(t, ids)
	if bOut.get("duplicate") == 0 || aOut.get("failed") < 4 {
		t.Fatalf("A %v, B %v: want B to get duplicates (A's records redelivered) and A's 4 failures retried", aOut.n, bOut.n)
	}
}

// A produce answered REQUEST_TIMED_OUT after the broker wrote the batch:
// the (non-idempotent) producer retries and the topic holds the record
// twice, at two offsets. The consumer runs its effect once and commits
// past both.
func TestProducerRetryWritesRecordTwice(t *testing.T) {
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	fault := e.kafka.Cluster().Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: topic,
		Err:   kerr.RequestTimedOut,
		Count: 1,
	})
	var ids []string
	var recs []*kgo.Record
	for i := range 10 {
		id, body := event(i)
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Value: body})
	}
	e.produce(ctx, recs...)
	if fault.Hits() != 1 {
		t.Fatalf("fault hit %d times, want 1", fault.Hits())
	}
	_, total, err := demo.GroupLag(ctx, e.admin, "g-retry", topic)
	if err != nil || total <= 10 {
		t.Fatalf("topic holds %d records (%v): the retried produce did not write twice", total, err)
	}

	fx := newEffects()
	var ob outcomes
	e.start(t, "g-retry", kafkadedup.Config{
		Handler: fx.apply,
		ID:      kafkadedup.IDSources{JSONField: "id"}.Func(),
		Observe: ob.observe,
	})
	e.waitCommitted(t, "g-retry", total)
	fx.exactlyOnce(t, ids)
	if d := ob.get("duplicate"); int64(d) != total-10 {
		t.Fatalf("%d duplicates suppressed, want %d (the records written twice): %v", d, total-10, ob.n)
	}
	t.Logf("topic holds %d records for 10 events", total)
}

// A record without a usable ID is skipped (its offset committed, Observe
// told), not retried forever, and does not hold the partition back.
func TestRecordWithoutIDIsSkipped(t *testing.T) {
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, body := event(1)
	e.produce(ctx, &kgo.Record{Value: []byte(`{"amount":5}`)}, &kgo.Record{Value: body})
	fx := newEffects()
	var ob outcomes
	e.start(t, "g-noid", kafkadedup.Config{
		Handler: fx.apply,
		ID:      kafkadedup.IDSources{JSONField: "id", NoContent: true}.Func(),
		Observe: ob.observe,
	})
	e.waitCommitted(t, "g-noid", 2)
	fx.exactlyOnce(t, []string{id})
	if ob.get("skip") != 1 {
		t.Fatalf("outcomes %v, want one skip", ob.n)
	}
}

func TestIDSourcesOrder(t *testing.T) {
	rec := func(header, key, value string) *kgo.Record {
		r := &kgo.Record{Key: []byte(key), Value: []byte(value)}
		if header != "" {
			r.Headers = []kgo.RecordHeader{{Key: "other", Value: []byte("x")}, {Key: kafkadedup.DefaultHeader, Value: []byte(header)}}
		}
		return r
	}
	all := kafkadedup.IDSources{Key: true, JSONField: "id"}
	for _, tc := range []struct {
		name string
		src  kafkadedup.IDSources
		rec  *kgo.Record
		want string
		noID bool
	}{
		{"header first", all, rec("h-1", "k-1", `{"id":"j-1"}`), "h-1", false},
		{"then key", all, rec("", "k-1", `{"id":"j-1"}`), "k-1", false},
		{"then JSON field", all, rec("", "", `{"id":"j-1"}`), "j-1", false},
		{"then content", all, rec("", "", `{"n":1}`), string(msgid.Content([]byte(`{"n":1}`))), false},
		{"key off by default", kafkadedup.IDSources{}, rec("", "k-1", `x`), string(msgid.Content([]byte(`x`))), false},
		{"own header", kafkadedup.IDSources{Header: "other"}, rec("h-1", "", ``), "x", false},
		{"no header, no content", kafkadedup.IDSources{Header: "-", NoContent: true}, rec("h-1", "k", `{}`), "", true},
	} {
		got, err := tc.src.Func()(tc.rec)
		if tc.noID {
			if !errors.Is(err, msgid.ErrNoID) {
				t.Errorf("%s: got %q, %v; want ErrNoID", tc.name, got, err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := kafkadedup.New(kafkadedup.Config{Workers: -1, RetryDelay: -time.Second, InProgressDelay: -1, CommitInterval: -time.Millisecond})
	if err == nil {
		t.Fatal("New accepted an empty config")
	}
	for _, want := range []string{"Processor", "Namespace", "Handler", "Workers", "RetryDelay", "InProgressDelay", "CommitInterval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	// A bound below Workers is refused, not raised to Workers.
	// New does not call the Processor: a typed nil stands for one.
	valid := kafkadedup.Config{Processor: (*client.Batcher)(nil), Namespace: "ns", Handler: func(context.Context, *kgo.Record) error { return nil }}
	for _, tc := range []struct{ workers, maxInFlight int }{{0, 8}, {4, 3}} {
		cfg := valid
		cfg.Workers, cfg.MaxInFlight = tc.workers, tc.maxInFlight
		if _, err := kafkadedup.New(cfg); err == nil || !strings.Contains(err.Error(), "MaxInFlight") || !strings.Contains(err.Error(), "below Workers") {
			t.Errorf("Workers %d, MaxInFlight %d: %v", tc.workers, tc.maxInFlight, err)
		}
	}
	cfg := valid
	cfg.Workers, cfg.MaxInFlight = 4, 4
	if _, err := kafkadedup.New(cfg); err != nil {
		t.Errorf("MaxInFlight = Workers: %v", err)
	}
}

// A Debezium connector that restarts re-emits the change events after its
// last recorded offset: the topic holds them twice, with new processing
// times. DebeziumID gives the copies the IDs of the originals, so each
// change takes effect once; the tombstone after a delete is skipped.
func TestDebeziumReEmittedEventsTakeEffectOnce(t *testing.T) {
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	change := func(lsn, id int, op, processedAt string) *kgo.Record {
		v := fmt.Sprintf(`{"schema":{"type":"struct"},"payload":{"before":null,"after":{"id":%d},`+
			`"source":{"connector":"postgresql","name":"dbserver1","ts_ms":1701423000000,"db":"inventory",`+
			`"schema":"public","table":"customers","txId":556,"lsn":%d},"op":%q,"ts_ms":%s}}`, id, lsn, op, processedAt)
		return &kgo.Record{Key: []byte(fmt.Sprintf(`{"id":%d}`, id)), Value: []byte(v)}
	}
	var first, again []*kgo.Record
	for i := range 5 {
		first = append(first, change(1000+i, 1001+i, "c", "1701423000100"))
		again = append(again, change(1000+i, 1001+i, "c", "1701423999999")) // after the restart
	}
	tombstone := &kgo.Record{Key: []byte(`{"id":1001}`)}
	e.produce(ctx, append(append(first, tombstone), again...)...)

	var mu sync.Mutex
	applied := map[string]int{}
	var ob outcomes
	e.start(t, "g-cdc", kafkadedup.Config{
		Handler: func(ctx context.Context, rec *kgo.Record) error {
			mu.Lock()
			defer mu.Unlock()
			applied[string(rec.Key)]++
			return nil
		},
		ID:      kafkadedup.DebeziumID(),
		Observe: ob.observe,
	})
	e.waitCommitted(t, "g-cdc", 11)
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 5 {
		t.Fatalf("applied %v, want 5 changes", applied)
	}
	for k, n := range applied {
		if n != 1 {
			t.Errorf("change %s took effect %d times", k, n)
		}
	}
	if ob.get("duplicate") != 5 || ob.get("skip") != 1 {
		t.Fatalf("outcomes %v: want the 5 re-emitted events duplicate and the tombstone skipped", ob.n)
	}
}

// A table without a primary key: its records have no key, and a snapshot
// reads every row at the snapshot's position. Each of 1,000 rows takes
// effect once, and the events a restarted connector re-emits are
// duplicates.
func TestDebeziumKeylessSnapshotRowsTakeEffectOnce(t *testing.T) {
	const rows = 1000
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	read := func(i int, processedAt string) *kgo.Record {
		v := fmt.Sprintf(`{"before":null,"after":{"actor":"user-%d","action":"login","at":%d},`+
			`"source":{"version":"2.5.0.Final","connector":"postgresql","name":"dbserver1","ts_ms":1701423000000,`+
			`"snapshot":"true","db":"inventory","sequence":"[null,\"24023064\"]","schema":"public",`+
			`"table":"audit_log","txId":555,"lsn":24023064,"xmin":null},"op":"r","ts_ms":%s,"transaction":null}`,
			i%37, 1701423000000+i, processedAt)
		return &kgo.Record{Value: []byte(v)}
	}
	var recs []*kgo.Record
	for i := range rows {
		recs = append(recs, read(i, "1701423000100"))
	}
	for i := range rows {
		recs = append(recs, read(i, "1701423999999")) // re-emitted after a restart
	}
	e.produce(ctx, recs...)

	var mu sync.Mutex
	applied := map[string]int{}
	var ob outcomes
	e.start(t, "g-cdc-keyless", kafkadedup.Config{
		Handler: func(ctx context.Context, rec *kgo.Record) error {
			var ev struct {
				After json.RawMessage `json:"after"`
			}
			if err := json.Unmarshal(rec.Value, &ev); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			applied[string(ev.After)]++
			return nil
		},
		ID:      kafkadedup.DebeziumID(),
		Observe: ob.observe,
	})
	e.waitCommitted(t, "g-cdc-keyless", 2*rows)
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != rows {
		t.Fatalf("%d rows took effect, want %d (outcomes %v)", len(applied), rows, ob.n)
	}
	for row, n := range applied {
		if n != 1 {
			t.Errorf("row %s took effect %d times", row, n)
		}
	}
	if ob.get("duplicate") != rows {
		t.Fatalf("outcomes %v: want the %d re-emitted events duplicate", ob.n, rows)
	}
}
