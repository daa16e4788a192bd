package watermilldedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/watermilldedup"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

func newBatcher(t *testing.T, cl *devcluster.Cluster) *client.Batcher {
	t.Helper()
	return testcluster.Batcher(t, cl.Addrs())
}

// ledger counts effects per message UUID and handled deliveries.
type ledger struct {
	mu       sync.Mutex
	effects  map[string]int
	attempts map[string]int
	acked    int
	errs     map[string]int
}

func newLedger() *ledger {
	return &ledger{effects: map[string]int{}, attempts: map[string]int{}, errs: map[string]int{}}
}

// handler fails the first attempt of every message whose payload ends in
// "fail", and applies the effect otherwise.
func (l *ledger) handler(msg *message.Message) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts[msg.UUID]++
	if string(msg.Payload[len(msg.Payload)-4:]) == "fail" && l.attempts[msg.UUID] == 1 {
		return errors.New("downstream unavailable")
	}
	l.effects[msg.UUID]++
	return nil
}

// observe counts what the router saw from the wrapped handler.
func (l *ledger) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		l.mu.Lock()
		if err == nil {
			l.acked++
		} else {
			switch {
			case errors.Is(err, watermilldedup.ErrInProgress):
				l.errs["in_progress"]++
			default:
				l.errs["failed"]++
			}
		}
		l.mu.Unlock()
		return out, err
	}
}

// startRouters runs n routers (n instances of one service) on pubSub's
// topic "payments", each wrapping the ledger's handler in mw(i).
func startRouters(t *testing.T, pubSub *gochannel.GoChannel, l *ledger, n int, mw func(i int) message.HandlerMiddleware) {
	t.Helper()
	for i := range n {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		h := r.AddConsumerHandler(fmt.Sprintf("ledger-%d", i), "payments", pubSub, l.handler)
		h.AddMiddleware(l.observe, mw(i))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			r.Close()
			if err := <-done; err != nil {
				t.Errorf("router %d: %v", i, err)
			}
		})
		select {
		case <-r.Running():
		case <-time.After(30 * time.Second):
			t.Fatal("router did not start")
		}
	}
}

// publishAll publishes 30 payments, every 5th failing its first attempt,
// then republishes the first 10 (a producer retry: same UUID, same
// payload). It returns the number of messages published.
func publishAll(t *testing.T, pubSub *gochannel.GoChannel) int {
	t.Helper()
	var msgs []*message.Message
	for k := range 30 {
		body := fmt.Sprintf("payment %d", k)
		if k%5 == 0 {
			body += " fail"
		}
		msgs = append(msgs, message.NewMessage(fmt.Sprintf("pay-%02d", k), []byte(body)))
	}
	for _, m := range msgs[:10] {
		msgs = append(msgs, message.NewMessage(m.UUID, m.Payload))
	}
	for _, m := range msgs {
		if err := pubSub.Publish("payments", m); err != nil {
			t.Fatal(err)
		}
	}
	return len(msgs)
}

func newPubSub(t *testing.T) *gochannel.GoChannel {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 128}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	return ps
}

// Two instances of a service receive every message (GoChannel fans out),
// producers retry, and handlers fail their first attempt now and then: with
// the claim/commit middleware every payment takes effect exactly once, the
// failed ones included.
func TestMiddlewareEffectsOnceAcrossInstancesRetriesAndFailures(t *testing.T) {
	cl := testcluster.Demo(t)
	pubSub := newPubSub(t)
	l := newLedger()
	startRouters(t, pubSub, l, 2, func(int) message.HandlerMiddleware {
		mw := &watermilldedup.Middleware{Processor: newBatcher(t, cl), Namespace: "payments", DigestPayload: true}
		return mw.Middleware
	})
	published := publishAll(t, pubSub)

	// Every delivery to each instance ends acked: published × 2.
	testcluster.WaitFor(t, 60*time.Second, "every delivery acked", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.acked == 2*published
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.effects) != 30 {
		t.Fatalf("%d payments took effect, want 30", len(l.effects))
	}
	for id, n := range l.effects {
		if n != 1 {
			t.Fatalf("%s took effect %d times, want once", id, n)
		}
	}
	if l.errs["failed"] < 6 {
		t.Fatalf("errors %v: want the 6 first attempts that failed", l.errs)
	}
	t.Logf("acked %d, errors %v", l.acked, l.errs)
}

// watermill's own Deduplicator with a dedupnode Repository: one window
// shared by both instances, so each message is handled by one of them
// only. But it marks before handling: a handler failure makes the
// redelivery a "duplicate" and the failed payments never take effect —
// the reason Middleware claims instead.
func TestRepositorySharedWindowAndTheMarkBeforeHandlePitfall(t *testing.T) {
	cl := testcluster.Demo(t)
	pubSub := newPubSub(t)
	l := newLedger()
	repo, err := watermilldedup.NewRepository(newBatcher(t, cl), "payments-window", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	startRouters(t, pubSub, l, 2, func(int) message.HandlerMiddleware {
		d := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }, Repository: repo, Timeout: 30 * time.Second}
		return d.Middleware
	})
	published := publishAll(t, pubSub)
	testcluster.WaitFor(t, 60*time.Second, "every delivery acked", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.acked == 2*published
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range 30 {
		id := fmt.Sprintf("pay-%02d", k)
		want := 1
		if k%5 == 0 {
			want = 0 // lost: marked, failed, redelivery dropped as duplicate
		}
		if l.effects[id] != want {
			t.Fatalf("%s took effect %d times, want %d", id, l.effects[id], want)
		}
	}
	if dup, err := repo.IsDuplicate(context.Background(), "pay-01"); err != nil || !dup {
		t.Fatalf("IsDuplicate(pay-01) = %v, %v; want true", dup, err)
	}
	if dup, err := repo.IsDuplicate(context.Background(), "never-seen"); err != nil || dup {
		t.Fatalf("IsDuplicate(never-seen) = %v, %v; want false", dup, err)
	}
}

// Issue 14: the repository offers Len() (live keys in its namespace), as
// watermill's in-memory repository does.
func TestRepositoryLenCountsLiveKeys(t *testing.T) {
	cl := testcluster.Demo(t)
	repo, err := watermilldedup.NewRepository(newBatcher(t, cl), "len-window", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n := repo.Len(); n != 0 {
		t.Fatalf("Len of an empty namespace = %d, want 0", n)
	}
	for _, k := range []string{"a", "b", "c", "a"} {
		if _, err := repo.IsDuplicate(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	if n := repo.Len(); n != 3 {
		t.Fatalf("Len after marking a, b, c, a = %d, want 3", n)
	}
}

// A message delivered twice whose two sightings leave in one Batcher
// request (README Guarantees (1)): the first is new, the other a
// duplicate, as if they had been sent one after the other.
func TestRepositoryTwoSightingsInOneRequestOneIsNew(t *testing.T) {
	cl := testcluster.Demo(t)
	b := testcluster.Client(t, cl.Addrs()).NewBatcher(client.WithMaxBatch(2), client.WithLinger(time.Minute))
	t.Cleanup(func() { b.Close() })
	repo, err := watermilldedup.NewRepository(b, "one-request", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	dup := make([]bool, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { dup[i], errs[i] = repo.IsDuplicate(ctx, "order-7") })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.RPCs != 1 || st.Items != 2 {
		t.Fatalf("batcher %+v: want both sightings in one request", st)
	}
	if dup[0] == dup[1] {
		t.Fatalf("IsDuplicate answered %v and %v, want one false (new) and one true", dup[0], dup[1])
	}
}

// dedupnode keeps a TTL in whole milliseconds: a window under 1 ms, or
// with a fraction of one, is refused when the repository is built, naming
// the window, instead of failing every mark afterwards. A whole number of
// milliseconds marks.
func TestNewRepositoryRefusesWindowsNotInWholeMilliseconds(t *testing.T) {
	cl := testcluster.Demo(t)
	b := newBatcher(t, cl)
	for _, w := range []time.Duration{time.Microsecond, 500 * time.Microsecond, 1500 * time.Microsecond, -time.Millisecond} {
		repo, err := watermilldedup.NewRepository(b, "sub-ms-window", w)
		if err == nil {
			_, markErr := repo.IsDuplicate(context.Background(), "k")
			t.Fatalf("window %v accepted; then IsDuplicate: %v", w, markErr)
		}
		if !strings.Contains(err.Error(), "window "+w.String()) {
			t.Errorf("window %v: error %q does not name the window", w, err)
		}
	}
	for _, w := range []time.Duration{0, time.Millisecond} {
		repo, err := watermilldedup.NewRepository(b, "sub-ms-window", w)
		if err != nil {
			t.Fatalf("window %v: %v", w, err)
		}
		key := fmt.Sprintf("key-%v", w)
		if dup, err := repo.IsDuplicate(context.Background(), key); err != nil || dup {
			t.Fatalf("window %v: first IsDuplicate = %v, %v; want false, nil", w, dup, err)
		}
	}
}
