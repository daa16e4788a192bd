package amqpdedup_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/amqpdedup"
	"github.com/dedupnode/dedupnode/internal/rabbitproc"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// consumerTimeout is the shared broker's consumer_timeout: a handler that
// holds a delivery longer makes the broker close its channel and redeliver.
const consumerTimeout = 2 * time.Second

// broker is one RabbitMQ server shared by the package's tests (it takes
// 5-10 s to start); nil with skipReason set when none could be used.
var (
	broker     *rabbitproc.Server
	skipReason string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	required := os.Getenv(rabbitproc.RequireEnv) == "1"
	switch _, err := rabbitproc.Find(); {
	case err != nil && required:
		fmt.Fprintf(os.Stderr, "amqpdedup: %s=1 but %v\n", rabbitproc.RequireEnv, err)
		return 1
	case err != nil:
		skipReason = err.Error()
		return m.Run()
	case testing.Short() && !required:
		skipReason = "-short: not starting a RabbitMQ broker"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "amqpdedup-rabbitmq-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	broker, err = rabbitproc.Start(ctx, rabbitproc.Config{Dir: dir, ConsumerTimeout: consumerTimeout, TickInterval: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintf(os.Stderr, "amqpdedup: start RabbitMQ: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "amqpdedup: RabbitMQ (pid %d) up in %.1f s at %s\n", broker.PID(), time.Since(start).Seconds(), broker.URL())
	defer broker.Close()
	return m.Run()
}

func needBroker(t *testing.T) string {
	t.Helper()
	if broker == nil {
		t.Skip("no RabbitMQ: " + skipReason)
	}
	return broker.URL()
}

// channel opens a connection and a channel, closed at cleanup.
func channel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func publish(t *testing.T, ch *amqp.Channel, queue string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v", err)
	}
}

// consumer is one consumer process: it dials, consumes until its channel
// closes, and dials again, until stopped.
type consumer struct {
	h      *amqpdedup.Handler
	conn   atomic.Pointer[amqp.Connection]
	mu     sync.Mutex
	closes []error // why each channel ended
	stop   context.CancelFunc
	done   chan struct{}
}

func startConsumer(t *testing.T, url, queue string, h *amqpdedup.Handler, workers int) *consumer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{h: h, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			conn, err := amqp.Dial(url)
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			c.conn.Store(conn)
			ch, err := conn.Channel()
			var brokerClose chan *amqp.Error
			if err == nil {
				// The broker's reason for closing the channel, read here
				// rather than from Consume's error: Consume returns nil once
				// ctx is cancelled, and the test may stop the consumer right
				// after the stalled delivery (whose channel the broker closed
				// long before) took effect.
				brokerClose = ch.NotifyClose(make(chan *amqp.Error, 1))
				err = ch.Qos(2*workers, 0, false)
			}
			if err == nil {
				err = h.Consume(ctx, ch, queue, workers)
			}
			select {
			case e, ok := <-brokerClose:
				if ok && e != nil {
					err = e
				}
			default:
			}
			if err != nil {
				c.mu.Lock()
				c.closes = append(c.closes, err)
				c.mu.Unlock()
			}
			conn.Close()
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *consumer) close() {
	c.stop()
	<-c.done
}

// closedBy counts the channel ends caused by the broker with code.
func (c *consumer) closedBy(code int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, err := range c.closes {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == code {
			n++
		}
	}
	return n
}

func queueDepth(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// Real RabbitMQ redeliveries: handler failures (released, requeued), a
// handler stalled past the broker's consumer_timeout (the broker closes
// its channel and redelivers everything unacknowledged on it to the other
// consumer, which finds the stalled claim in progress and requeues with a
// delay), a consumer whose connection dies after its effect and before its
// ack, and producer retries of the same message_id. Two consumers with
// their own connections and Batchers against a real three-node cluster.
// Every message takes effect exactly once and every publish is acked.
func TestRedeliveriesTakeEffectOnce(t *testing.T) {
	url := needBroker(t)
	cl := testcluster.Demo(t)
	admin := channel(t, url)
	if err := admin.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const queue = "orders-once"
	if _, err := admin.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	effects := map[string]int{}
	outcomes := map[client.Outcome]int{}
	acked := 0       // successful acks: each removes one published message
	redelivered := 0 // deliveries flagged Redelivered
	ackFailed := 0   // settlements refused because the channel had closed
	stalls := map[string]chan struct{}{}
	runs := [2]int{} // handler runs per consumer
	stalled := 0     // stalls started by consumer 0
	injected := 0    // handler failures returned
	var consumers [2]*consumer

	effect := func(d *amqp.Delivery) {
		mu.Lock()
		effects[idOf(d)]++
		mu.Unlock()
	}
	handler := func(idx int) func(ctx context.Context, d *amqp.Delivery) error {
		return func(ctx context.Context, d *amqp.Delivery) error {
			var k int
			fmt.Sscanf(d.MessageId, "evt-%d", &k)
			fail := !d.Redelivered && d.MessageId != "" && k%7 == 3
			mu.Lock()
			runs[idx]++
			n := runs[idx]
			// Only a message published once may stall: a producer retry's
			// second copy (evt-0, evt-10, ...) or a header-only message
			// (counted as evt-0 here) could reach the other consumer and find
			// the claim in progress before consumer_timeout closed anything.
			once := d.MessageId != "" && k%10 != 0
			stall := idx == 0 && once && !d.Redelivered && !fail && (n >= 3 && stalled == 0 || n >= 40 && stalled == 1)
			if stall {
				stalled++
			}
			if fail {
				injected++
			}
			mu.Unlock()
			switch {
			case fail:
				return errors.New("downstream unavailable")
			case stall:
				// Stall past consumer_timeout until the broker closed our
				// channel and the other consumer found our claim in
				// progress; then take effect and commit: our ack fails.
				ch := make(chan struct{})
				mu.Lock()
				stalls[idOf(d)] = ch
				mu.Unlock()
				select {
				case <-ch:
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(30 * time.Second):
					return errors.New("stalled delivery never seen in progress elsewhere")
				}
				effect(d)
				return nil
			case idx == 1 && n == 25:
				// Take effect, then lose the connection before the ack
				// (the commit still lands: dedupnode is reachable).
				effect(d)
				consumers[1].conn.Load().Close()
				return nil
			}
			effect(d)
			return nil
		}
	}
	observe := func(d *amqp.Delivery, r amqpdedup.Result) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[r.Outcome]++
		if d.Redelivered {
			redelivered++
		}
		if r.Action == amqpdedup.ActionAck && r.AckErr == nil {
			acked++
		}
		if r.AckErr != nil {
			ackFailed++
		}
		if ch := stalls[idOf(d)]; ch != nil && r.Outcome == client.OutcomeInProgress {
			close(ch)
			stalls[idOf(d)] = nil
		}
	}
	handlers := [2]*amqpdedup.Handler{}
	for i := range 2 {
		h, err := amqpdedup.New(amqpdedup.Config{
			Processor:       testcluster.Batcher(t, cl.Addrs()),
			Namespace:       "orders",
			Handler:         handler(i),
			ID:              amqpdedup.FirstID(amqpdedup.MessageID(), amqpdedup.HeaderID("x-event-id")),
			DigestPayload:   true,
			RetryDelay:      50 * time.Millisecond,
			InProgressDelay: 200 * time.Millisecond,
			ProcessOptions:  []client.ProcessOption{client.WithLease(5 * time.Second)},
			Observe:         observe,
		})
		if err != nil {
			t.Fatal(err)
		}
		handlers[i] = h
	}
	for i := range 2 {
		consumers[i] = startConsumer(t, url, queue, handlers[i], 4)
	}

	// 200 messages with message_id, 10 with only an x-event-id header,
	// then 20 producer retries (same message_id, same body).
	published := 0
	body := func(k int) []byte { return fmt.Appendf(nil, `{"order":%d}`, k) }
	for k := range 200 {
		publish(t, admin, queue, amqp.Publishing{MessageId: fmt.Sprintf("evt-%d", k), Body: body(k)})
		published++
	}
	for k := range 10 {
		publish(t, admin, queue, amqp.Publishing{Headers: amqp.Table{"x-event-id": fmt.Sprintf("hdr-%d", k)}, Body: body(1000 + k)})
		published++
	}
	for k := 0; k < 200; k += 10 {
		publish(t, admin, queue, amqp.Publishing{MessageId: fmt.Sprintf("evt-%d", k), Body: body(k)})
		published++
	}

	testcluster.WaitFor(t, 60*time.Second, "every message to take effect and the queue to empty", func() bool {
		mu.Lock()
		done := len(effects) == 210
		mu.Unlock()
		return done && queueDepth(t, admin, queue) == 0 && handlers[0].Held() == 0 && handlers[1].Held() == 0
	})
	for _, c := range consumers {
		c.close()
	}
	// Deliveries the consumers held unacknowledged when they stopped (an
	// ack sent as the broker closed the channel is lost too) are back in
	// the queue: drain it one basic.get at a time. Each must be a
	// duplicate: every effect has happened.
	drained := map[client.Outcome]int{}
	drain, err := amqpdedup.New(amqpdedup.Config{
		Processor: testcluster.Client(t, cl.Addrs()), Namespace: "orders", Handler: handler(1),
		ID:         amqpdedup.FirstID(amqpdedup.MessageID(), amqpdedup.HeaderID("x-event-id")),
		RetryDelay: 50 * time.Millisecond, InProgressDelay: 200 * time.Millisecond,
		Observe: func(_ *amqp.Delivery, r amqpdedup.Result) { drained[r.Outcome]++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	drainCh := channel(t, url)
	testcluster.WaitFor(t, 30*time.Second, "the queue drained", func() bool {
		d, ok, err := drainCh.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			drain.Handle(&d)
			return false
		}
		return drain.Held() == 0 && queueDepth(t, admin, queue) == 0
	})
	if err := drainCh.Close(); err != nil {
		t.Fatal(err)
	}
	if n := queueDepth(t, admin, queue); n != 0 {
		t.Fatalf("%d messages back in the queue after the drain", n)
	}
	for o, n := range drained {
		if o != client.OutcomeDuplicate {
			t.Fatalf("drained %d deliveries with outcome %v, want only duplicates (%v)", n, o, drained)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != 210 {
		t.Fatalf("%d distinct messages took effect, want 210", len(effects))
	}
	for id, n := range effects {
		if n != 1 {
			t.Fatalf("%s took effect %d times, want once", id, n)
		}
	}
	timeouts := consumers[0].closedBy(amqp.PreconditionFailed)
	t.Logf("published %d, acked %d, outcomes %v, redelivered %d, settlements refused %d, consumer-timeout closes %d, runs %v, drained after stop %v",
		published, acked, outcomes, redelivered, ackFailed, timeouts, runs, drained)
	switch {
	case timeouts < 1:
		t.Fatal("the broker never closed a channel for consumer_timeout")
	case outcomes[client.OutcomeInProgress] < 1:
		t.Fatal("no redelivery found a claim in progress")
	case injected < 10 || outcomes[client.OutcomeFailed] < injected:
		// 29 messages fail their first delivery (fewer when it was
		// already a redelivery: a channel closed before it was handled).
		t.Fatalf("%d failed runs for %d injected failures, want >= 10 and all seen", outcomes[client.OutcomeFailed], injected)
	case outcomes[client.OutcomeDuplicate]+drained[client.OutcomeDuplicate] < 20+2:
		t.Fatalf("%d+%d duplicates, want >= 22 (20 producer retries, the stalled and the lost-connection redeliveries)", outcomes[client.OutcomeDuplicate], drained[client.OutcomeDuplicate])
	case redelivered == 0 || ackFailed == 0:
		t.Fatal("no redelivery or no refused settlement")
	}
}

// idOf names a message for the effect ledger.
func idOf(d *amqp.Delivery) string {
	if d.MessageId != "" {
		return d.MessageId
	}
	return fmt.Sprint(d.Headers["x-event-id"])
}

// The IDFuncs take the message_id property, a header (string or integer)
// or a JSON field; a delivery without a usable ID, and an ID reused for
// another body (with DigestPayload), are rejected without requeue, so the
// queue's dead-letter exchange receives them.
func TestIDsRejectsAndDeadLetters(t *testing.T) {
	url := needBroker(t)
	cl := testcluster.Demo(t)
	admin := channel(t, url)
	if err := admin.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const queue, dlq = "ids", "ids-dead"
	if _, err := admin.QueueDeclare(dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Rejected messages go to dlq through the default exchange.
	if _, err := admin.QueueDeclare(queue, false, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
	}); err != nil {
		t.Fatal(err)
	}
	publish(t, admin, queue, amqp.Publishing{MessageId: "prop-1", Body: []byte(`{"id":"ignored"}`)})
	publish(t, admin, queue, amqp.Publishing{Headers: amqp.Table{"x-id": int64(42)}, Body: []byte(`{}`)})
	publish(t, admin, queue, amqp.Publishing{Body: []byte(`{"event":{"id":"json-1"}}`)})
	publish(t, admin, queue, amqp.Publishing{Body: []byte(`{"no":"id"}`)})
	publish(t, admin, queue, amqp.Publishing{MessageId: "prop-1", Body: []byte(`{"id":"other body"}`)})

	var mu sync.Mutex
	var got []amqpdedup.Result
	h, err := amqpdedup.New(amqpdedup.Config{
		Processor: testcluster.Batcher(t, cl.Addrs()), Namespace: "ids", DigestPayload: true,
		ID:      amqpdedup.FirstID(amqpdedup.MessageID(), amqpdedup.HeaderID("x-id"), amqpdedup.JSONFieldID("event.id")),
		Handler: func(context.Context, *amqp.Delivery) error { return nil },
		Observe: func(_ *amqp.Delivery, r amqpdedup.Result) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// One worker, so the results come in queue order.
	startConsumer(t, url, queue, h, 1)
	testcluster.WaitFor(t, 30*time.Second, "five deliveries settled and two dead-lettered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 5 && queueDepth(t, admin, dlq) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		id     string
		action amqpdedup.Action
	}{{"prop-1", amqpdedup.ActionAck}, {"42", amqpdedup.ActionAck}, {"json-1", amqpdedup.ActionAck}, {"", amqpdedup.ActionReject}, {"prop-1", amqpdedup.ActionReject}}
	for i, w := range want {
		if string(got[i].ID) != w.id || got[i].Action != w.action || got[i].AckErr != nil {
			t.Fatalf("delivery %d: %+v, want ID %q %s", i, got[i], w.id, w.action)
		}
	}
	if got[3].Err == nil || got[4].Outcome != client.OutcomeConflict {
		t.Fatalf("rejections without their reason: %+v %+v", got[3], got[4])
	}
	if queueDepth(t, admin, queue) != 0 {
		t.Fatal("queue not empty")
	}
}

func TestNewValidates(t *testing.T) {
	_, err := amqpdedup.New(amqpdedup.Config{RetryDelay: -time.Second, InProgressDelay: -1, Timeout: -time.Second})
	if err == nil {
		t.Fatal("New accepted an empty config")
	}
	for _, field := range []string{"Processor", "Namespace", "Handler", "RetryDelay", "InProgressDelay", "Timeout"} {
		if !strings.Contains(err.Error(), field) {
			t.Fatalf("error %q does not name %s", err, field)
		}
	}
	d := &amqp.Delivery{Headers: amqp.Table{"f": 1.5, "e": ""}}
	for _, fn := range []amqpdedup.IDFunc{amqpdedup.MessageID(), amqpdedup.HeaderID("f"), amqpdedup.HeaderID("e"), amqpdedup.HeaderID("missing"), amqpdedup.FirstID()} {
		if id, err := fn(d); err == nil {
			t.Fatalf("got ID %q from %+v", id, d)
		}
	}
}
