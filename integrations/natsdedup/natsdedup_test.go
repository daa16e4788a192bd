package natsdedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/demo"
	"github.com/dedupnode/dedupnode/integrations/natsdedup"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

type env struct {
	cluster *devcluster.Cluster
	js      jetstream.JetStream
	nc      *nats.Conn
}

func setup(t *testing.T) *env {
	t.Helper()
	cl := testcluster.Demo(t)
	ns, err := demo.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{cluster: cl, js: js, nc: nc}
}

func (e *env) batcher(t *testing.T) *client.Batcher {
	t.Helper()
	return testcluster.Batcher(t, e.cluster.Addrs())
}

// publish sends one message; with id it sets Nats-Msg-Id and, should the
// stream's own duplicate window drop it (a producer retry inside the
// window), publishes again until the window has passed: the retry that
// arrives later, which only the consumer side can catch.
func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, id string, body []byte) {
	t.Helper()
	msg := &nats.Msg{Subject: "events.test", Data: body, Header: nats.Header{}}
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	testcluster.WaitFor(t, 30*time.Second, "JetStream to store "+id, func() bool {
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		return !ack.Duplicate
	})
}

type payload struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// Real JetStream redelivers: handler failures (Nak), a handler stalled past
// AckWait (redelivered to another consumer while the first still holds
// the claim), producer retries after the stream's duplicate window, and
// payload-only messages repeated. Two consumer processes, each with its
// own Batcher and four workers. Every unique message takes effect exactly
// once, and the stream ends fully acknowledged.
func TestJetStreamRedeliveriesTakeEffectOnce(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	stream, err := e.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Storage: jetstream.MemoryStorage,
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 500 * time.Millisecond, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	effects := map[string]int{}
	outcomes := map[client.Outcome]int{}
	actions := map[natsdedup.Action]int{}
	stalledSeen := map[string]chan struct{}{}
	redeliveries := 0
	for _, k := range []int{5, 16, 27} {
		stalledSeen[fmt.Sprintf("evt-%d", k)] = make(chan struct{})
	}

	handler := func(ctx context.Context, msg jetstream.Msg) error {
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		id := msg.Headers().Get(jetstream.MsgIDHeader)
		var k int
		if _, err := fmt.Sscanf(id, "evt-%d", &k); err == nil && md.NumDelivered == 1 {
			if k%7 == 3 {
				return errors.New("downstream unavailable")
			}
			mu.Lock()
			ch := stalledSeen[id]
			mu.Unlock()
			if ch != nil {
				// Stall past AckWait until JetStream redelivered the message
				// and the redelivery found our claim in progress.
				select {
				case <-ch:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		mu.Lock()
		effects[idOf(msg)]++
		mu.Unlock()
		return nil
	}
	observe := func(msg jetstream.Msg, r natsdedup.Result) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[r.Outcome]++
		actions[r.Action]++
		if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
			redeliveries++
		}
		if ch := stalledSeen[string(r.ID)]; ch != nil && r.Outcome == client.OutcomeInProgress {
			close(ch)
			stalledSeen[string(r.ID)] = nil
		}
	}
	for range 2 {
		h, err := natsdedup.New(natsdedup.Config{
			Processor:       e.batcher(t),
			Namespace:       "events",
			Handler:         handler,
			DigestPayload:   true,
			RetryDelay:      50 * time.Millisecond,
			InProgressDelay: 100 * time.Millisecond,
			Observe:         observe,
		})
		if err != nil {
			t.Fatal(err)
		}
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- h.Consume(cctx, cons, 4) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("consume: %v", err)
			}
		})
	}

	// 40 events with Nats-Msg-Id, 10 payload-only messages.
	for k := range 40 {
		b, _ := json.Marshal(payload{ID: fmt.Sprintf("evt-%d", k), Amount: k})
		publish(t, ctx, e.js, fmt.Sprintf("evt-%d", k), b)
	}
	for k := range 10 {
		publish(t, ctx, e.js, "", fmt.Appendf(nil, "plain-%d", k))
	}
	// Producer retries after the window, and payload-only repeats.
	for k := range 10 {
		b, _ := json.Marshal(payload{ID: fmt.Sprintf("evt-%d", k), Amount: k})
		publish(t, ctx, e.js, fmt.Sprintf("evt-%d", k), b)
	}
	for k := range 5 {
		publish(t, ctx, e.js, "", fmt.Appendf(nil, "plain-%d", k))
	}
	// The same ID reused for another payload: terminated, not acked.
	testcluster.WaitFor(t, 60*time.Second, "evt-0 to take effect", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return effects["evt-0"] == 1
	})
	conflict, _ := json.Marshal(payload{ID: "evt-0", Amount: 999})
	publish(t, ctx, e.js, "evt-0", conflict)

	testcluster.WaitFor(t, 90*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream == 66
	})

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != 50 {
		t.Fatalf("%d distinct messages took effect, want 50", len(effects))
	}
	for id, n := range effects {
		if n != 1 {
			t.Fatalf("%s took effect %d times, want once", id, n)
		}
	}
	// 10 producer retries + 5 payload repeats are duplicates; redeliveries
	// of stalled messages may add more.
	if outcomes[client.OutcomeDuplicate] < 15 {
		t.Fatalf("outcomes %v: want at least 15 duplicates", outcomes)
	}
	if outcomes[client.OutcomeFailed] < 6 || outcomes[client.OutcomeInProgress] < 3 || outcomes[client.OutcomeConflict] < 1 || actions[natsdedup.ActionTerm] != outcomes[client.OutcomeConflict] {
		t.Fatalf("outcomes %v actions %v: want >= 6 failed, >= 3 in progress (evt-5, 16, 27 stall), the conflict terminated (once per delivery: a slow claim may see a redelivery)", outcomes, actions)
	}
	if redeliveries == 0 {
		t.Fatal("JetStream redelivered nothing")
	}
	t.Logf("outcomes %v, actions %v, redeliveries %d", outcomes, actions, redeliveries)
}

// idOf names a message for the effect ledger: its Nats-Msg-Id, else its
// payload.
func idOf(msg jetstream.Msg) string {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	return string(msg.Data())
}

// A message without a usable ID is terminated (a redelivery cannot add
// one), and the IDFuncs pick the header, a JSON field or the content hash.
func TestIDFuncsAndMissingIDTerminates(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDS", Subjects: []string{"events.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "ids", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, e.js, "hdr-1", []byte(`{"event":{"id":"json-1"}}`))
	publish(t, ctx, e.js, "", []byte(`{"event":{"id":"json-2"}}`))
	publish(t, ctx, e.js, "", []byte(`{"no":"id"}`))

	idFn := natsdedup.FirstID(natsdedup.HeaderID(jetstream.MsgIDHeader), natsdedup.JSONFieldID("event.id"))
	var mu sync.Mutex
	var got []natsdedup.Result
	h, err := natsdedup.New(natsdedup.Config{
		Processor: e.batcher(t), Namespace: "ids", ID: idFn,
		Handler: func(context.Context, jetstream.Msg) error { return nil },
		Observe: func(_ jetstream.Msg, r natsdedup.Result) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	testcluster.WaitFor(t, 30*time.Second, "three deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	if string(got[0].ID) != "hdr-1" || got[0].Action != natsdedup.ActionAck ||
		string(got[1].ID) != "json-2" || got[1].Action != natsdedup.ActionAck ||
		got[2].ID != nil || got[2].Action != natsdedup.ActionTerm || got[2].Err == nil {
		t.Fatalf("results %+v", got)
	}
	if _, err := natsdedup.New(natsdedup.Config{}); err == nil {
		t.Fatal("New accepted an empty config")
	}
}

// Negative durations are refused naming the field, not replaced by the
// defaults (RetryDelay, InProgressDelay) or taken for "off" (KeepAlive,
// Timeout).
func TestNewRefusesNegativeDurations(t *testing.T) {
	_, err := natsdedup.New(natsdedup.Config{RetryDelay: -time.Second, InProgressDelay: -1, KeepAlive: -time.Second, Timeout: -time.Minute})
	if err == nil {
		t.Fatal("New accepted negative durations")
	}
	for _, field := range []string{"Processor", "RetryDelay", "InProgressDelay", "KeepAlive", "Timeout"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}
