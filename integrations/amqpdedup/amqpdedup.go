// Package amqpdedup runs RabbitMQ (AMQP 0-9-1) message handlers at most
// once per message ID with dedupnode: a redelivery (a channel or
// connection closed before the ack, a consumer_timeout, a requeue), a
// producer retry after a lost publisher confirm, or a replay is
// acknowledged without running the handler again.
//
// RabbitMQ does not deduplicate: every delivery it could not see
// acknowledged comes again, flagged Redelivered. This package runs each
// delivery through dedupnode's Claim → handler → Commit (client.Process)
// and settles it only after that:
//
//	h, _ := amqpdedup.New(amqpdedup.Config{
//		Processor: batcher, // a *client.Batcher (or *client.Client)
//		Namespace: "orders-consumer",
//		Handler: func(ctx context.Context, d *amqp.Delivery) error {
//			return chargeCard(ctx, d.Body)
//		},
//	})
//	_ = ch.Qos(64, 0, false)
//	err := h.Consume(ctx, ch, "orders", 64)
//
// Settlement per outcome: processed or duplicate → Ack (after the commit);
// handler error, lost lease or dedupnode unreachable → Nack with requeue
// after RetryDelay (the claim was released, or will expire); another
// consumer holds the ID (it is processing the message now: a redelivery
// after a channel close or a consumer timeout) → Nack with requeue after
// the time left on its lease, capped by InProgressDelay, never Ack, since
// that consumer may still fail; same ID with another payload digest (with
// DigestPayload) or no usable ID → Reject without requeue (dead-lettered
// if the queue has a dead-letter exchange), because a redelivery cannot
// fix it.
//
// RabbitMQ has no delayed requeue: a requeued message goes back to the
// head of the queue and comes again at once. So a delayed Nack is held on
// a timer (the delivery keeps its prefetch slot meanwhile) and sent when
// it fires; the worker that handled it moves on.
package amqpdedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/internal/settle"
	"github.com/dedupnode/dedupnode/integrations/msgid"
)

// IDFunc returns the dedup ID of a delivery. An error wrapping
// msgid.ErrNoID means the delivery has none.
type IDFunc func(d *amqp.Delivery) ([]byte, error)

// MessageID takes the ID from the message_id property.
func MessageID() IDFunc {
	return func(d *amqp.Delivery) ([]byte, error) {
		if d.MessageId != "" {
			return []byte(d.MessageId), nil
		}
		return nil, fmt.Errorf("%w: no message_id property", msgid.ErrNoID)
	}
}

// HeaderID takes the ID from header name: a string or byte-array value
// as is, an integer as its decimal text. Other types are an error naming
// the type.
func HeaderID(name string) IDFunc {
	return func(d *amqp.Delivery) ([]byte, error) {
		v, ok := d.Headers[name]
		if !ok || v == nil {
			return nil, fmt.Errorf("%w: no %s header", msgid.ErrNoID, name)
		}
		var id []byte
		switch v := v.(type) {
		case string:
			id = []byte(v)
		case []byte:
			id = v
		case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
			id = fmt.Appendf(nil, "%d", v)
		default:
			return nil, fmt.Errorf("%w: header %s is a %T, want a string, bytes or an integer", msgid.ErrNoID, name, v)
		}
		if len(id) == 0 {
			return nil, fmt.Errorf("%w: header %s is empty", msgid.ErrNoID, name)
		}
		return id, nil
	}
}

// JSONFieldID takes the ID from a field of the JSON body (see
// msgid.JSONField for the path syntax).
func JSONFieldID(path string) IDFunc {
	return func(d *amqp.Delivery) ([]byte, error) { return msgid.JSONField(d.Body, path) }
}

// ContentID derives the ID from the body: its hex SHA-256, so that
// identical bodies are duplicates.
func ContentID() IDFunc {
	return func(d *amqp.Delivery) ([]byte, error) { return msgid.Content(d.Body), nil }
}

// FirstID tries each IDFunc in turn and returns the first ID found; it
// fails with the last error when none yields one.
func FirstID(fns ...IDFunc) IDFunc {
	return func(d *amqp.Delivery) ([]byte, error) {
		err := fmt.Errorf("%w: no ID function given", msgid.ErrNoID)
		for _, fn := range fns {
			var id []byte
			if id, err = fn(d); err == nil && len(id) > 0 {
				return id, nil
			}
		}
		return nil, err
	}
}

// DefaultID is the message_id property when the producer set one, else the
// body's content hash.
var DefaultID = FirstID(MessageID(), ContentID())

// Config configures a Handler.
type Config struct {
	// Processor runs the handler at most once per ID: a *client.Batcher
	// (claims and commits of concurrent deliveries share RPCs) or a
	// *client.Client. Required.
	Processor client.Processor
	// Namespace is the dedupnode namespace, typically one per queue or
	// consumer application. Required.
	Namespace string
	// Handler applies the message's effect. Its context is cancelled when
	// the claim's lease is lost; check it before making the effect
	// visible. It must finish well within the broker's consumer_timeout
	// (30 min by default), else the broker closes the channel and
	// redelivers everything unacknowledged on it. Required.
	Handler func(ctx context.Context, d *amqp.Delivery) error
	// ID extracts the message ID (default DefaultID).
	ID IDFunc
	// DigestPayload sends the body's SHA-256 with the claim, so that an ID
	// reused for a different body is reported (and the delivery rejected)
	// instead of acknowledged as a duplicate.
	DigestPayload bool
	// RetryDelay is how long a delivery is held before its requeue after a
	// handler error, a lost lease or an unreachable cluster (default 1 s).
	RetryDelay time.Duration
	// InProgressDelay caps how long a delivery whose ID another consumer
	// is processing is held before its requeue; the delay is the time left
	// on that consumer's lease, at least 50 ms and at most InProgressDelay
	// (default 5 s).
	InProgressDelay time.Duration
	// Timeout bounds one handler run (0: no bound).
	Timeout time.Duration
	// ProcessOptions are passed to every Process call (lease, commit TTL).
	ProcessOptions []client.ProcessOption
	// Observe, if set, is called once per delivery, after it was settled
	// (for a delayed requeue: when the Nack was sent).
	Observe func(d *amqp.Delivery, r Result)
	// Context is the parent of every handler run started by Handle
	// (default Background).
	Context context.Context
}

// Action is how a delivery was settled.
type Action string

const (
	// ActionAck: acknowledged (processed now or before).
	ActionAck Action = "ack"
	// ActionRequeue: negatively acknowledged with requeue, after Delay.
	ActionRequeue Action = "requeue"
	// ActionReject: rejected without requeue (dead-lettered if the queue
	// has a dead-letter exchange, else dropped).
	ActionReject Action = "reject"
)

// Result is what happened to one delivery.
type Result struct {
	// ID is the message's dedup ID (nil when none could be found).
	ID []byte
	// Outcome is Process's outcome (OutcomeUnknown when no ID was found,
	// or the delivery was requeued unhandled because Consume stopped).
	Outcome client.Outcome
	// Ran says whether the handler ran.
	Ran bool
	// Action is the settlement; Delay the time held before a requeue.
	Action Action
	Delay  time.Duration
	// AckErr is the settlement's error (e.g. amqp.ErrClosed when the
	// channel closed meanwhile: the broker redelivers the message).
	AckErr error
	// Err is the handler's or dedupnode's error, if any.
	Err error
}

// Handler handles deliveries at most once per ID. Safe for concurrent use.
type Handler struct {
	cfg Config

	mu      sync.Mutex
	waiting map[*heldNack]struct{}
}

// heldNack is a requeue waiting for its delay.
type heldNack struct {
	d     *amqp.Delivery
	r     Result
	timer *time.Timer
}

// New checks cfg and returns a Handler.
func New(cfg Config) (*Handler, error) {
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
	if cfg.RetryDelay < 0 {
		errs = append(errs, fmt.Errorf("RetryDelay %v is negative", cfg.RetryDelay))
	}
	if cfg.InProgressDelay < 0 {
		errs = append(errs, fmt.Errorf("InProgressDelay %v is negative", cfg.InProgressDelay))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout %v is negative (0: no bound)", cfg.Timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("amqpdedup: %w", err)
	}
	if cfg.ID == nil {
		cfg.ID = DefaultID
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.InProgressDelay == 0 {
		cfg.InProgressDelay = 5 * time.Second
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	return &Handler{cfg: cfg, waiting: map[*heldNack]struct{}{}}, nil
}

// Handle processes one delivery and settles it; see HandleContext.
func (h *Handler) Handle(d *amqp.Delivery) Result { return h.HandleContext(h.cfg.Context, d) }

// HandleContext processes one delivery under ctx and settles it: Ack and
// Reject are sent before it returns; a requeue is sent after its Delay, on
// a timer, so HandleContext returns at once (Result.AckErr is then nil;
// Observe sees the Nack's error). Flush sends the held requeues at once.
func (h *Handler) HandleContext(ctx context.Context, d *amqp.Delivery) Result {
	r := h.handle(ctx, d)
	switch r.Action {
	case ActionAck:
		r.AckErr = d.Ack(false)
	case ActionReject:
		r.AckErr = d.Reject(false)
	case ActionRequeue:
		if r.Delay > 0 {
			h.hold(d, r)
			return r
		}
		r.AckErr = d.Nack(false, true)
	}
	if h.cfg.Observe != nil {
		h.cfg.Observe(d, r)
	}
	return r
}

func (h *Handler) handle(ctx context.Context, d *amqp.Delivery) Result {
	id, err := h.cfg.ID(d)
	if err == nil && len(id) == 0 {
		err = msgid.ErrNoID
	}
	if err != nil {
		return Result{Action: ActionReject, Err: fmt.Errorf("message ID: %w", err)}
	}
	if h.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.cfg.Timeout)
		defer cancel()
	}
	opts := h.cfg.ProcessOptions
	if h.cfg.DigestPayload {
		opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(d.Body)))
	}
	res, err := h.cfg.Processor.Process(ctx, h.cfg.Namespace, id, func(ctx context.Context) error {
		return h.cfg.Handler(ctx, d)
	}, opts...)
	r := Result{ID: id, Outcome: res.Outcome, Ran: res.Ran, Err: err}
	dec := settle.Decide(res, id, h.cfg.InProgressDelay, h.cfg.RetryDelay)
	switch dec.Action {
	case settle.Done:
		r.Action = ActionAck
	case settle.Drop:
		r.Action, r.Err = ActionReject, dec.Err
	default:
		r.Action, r.Delay = ActionRequeue, dec.Delay
	}
	return r
}

// hold sends d's requeue after r.Delay.
func (h *Handler) hold(d *amqp.Delivery, r Result) {
	n := &heldNack{d: d, r: r}
	h.mu.Lock()
	h.waiting[n] = struct{}{}
	n.timer = time.AfterFunc(r.Delay, func() { h.release(n) })
	h.mu.Unlock()
}

// release sends a held requeue, unless Flush or the timer already did.
func (h *Handler) release(n *heldNack) {
	h.mu.Lock()
	_, ok := h.waiting[n]
	delete(h.waiting, n)
	h.mu.Unlock()
	if !ok {
		return
	}
	n.timer.Stop()
	n.r.AckErr = n.d.Nack(false, true)
	if h.cfg.Observe != nil {
		h.cfg.Observe(n.d, n.r)
	}
}

// Held returns the number of deliveries waiting for a delayed requeue.
func (h *Handler) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting)
}

// Flush sends every held requeue now, and returns when they are sent.
func (h *Handler) Flush() {
	h.mu.Lock()
	held := make([]*heldNack, 0, len(h.waiting))
	for n := range h.waiting {
		held = append(held, n)
	}
	h.mu.Unlock()
	for _, n := range held {
		h.release(n)
	}
}

// ErrDeliveriesClosed means the broker stopped delivering to Consume: its
// channel or connection closed (the wrapped *amqp.Error says why, e.g. a
// consumer_timeout's PRECONDITION_FAILED) or the consumer was cancelled.
// Open a new channel and Consume again; the deliveries left unacknowledged
// come again, flagged Redelivered.
var ErrDeliveriesClosed = errors.New("amqpdedup: deliveries closed")

// Consume consumes queue on ch (manual acknowledgement) and handles its
// deliveries with up to workers handler runs at once, so that their
// claims and commits share batched RPCs when the Processor is a
// *client.Batcher. Set ch's prefetch (ch.Qos) to at least workers.
//
// It returns nil once ctx ended: the consumer is cancelled, runs in flight
// finish, deliveries not yet handled are requeued at once. It returns an
// error wrapping ErrDeliveriesClosed when the broker stopped delivering
// (channel closed), after the runs in flight finished (their settlements
// then fail: the broker redelivers those messages). Either way it sends
// the Handler's held requeues (Flush) before it returns.
func (h *Handler) Consume(ctx context.Context, ch *amqp.Channel, queue string, workers int) error {
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := fmt.Sprintf("amqpdedup-%p-%d", h, time.Now().UnixNano())
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqpdedup: consume %s: %w", queue, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = ch.Cancel(tag, false) })
	defer stop()

	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				if ctx.Err() != nil {
					// Stopping: hand it back unhandled.
					r := Result{Action: ActionRequeue, AckErr: d.Nack(false, true)}
					if h.cfg.Observe != nil {
						h.cfg.Observe(&d, r)
					}
					continue
				}
				h.HandleContext(ctx, &d)
			}
		}()
	}
	wg.Wait()
	// No timer outlives Consume: held requeues go now (on a closed
	// channel they fail, and the broker requeues those messages anyway).
	h.Flush()
	if ctx.Err() != nil {
		return nil
	}
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return fmt.Errorf("%w: %w", ErrDeliveriesClosed, e)
		}
	default:
	}
	return fmt.Errorf("%w: %w", ErrDeliveriesClosed, amqp.ErrClosed)
}
