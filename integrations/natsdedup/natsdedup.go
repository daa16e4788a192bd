// Package natsdedup runs NATS JetStream message handlers at most once per
// message ID with dedupnode: a redelivery (AckWait expired, a consumer
// crashed, a Nak), a producer retry that slipped past the stream's
// duplicate window, or a replay of an older range is acknowledged without
// running the handler again.
//
// JetStream's own Nats-Msg-Id window only drops duplicate publishes that
// arrive within the window (2 minutes by default); it does nothing for
// redeliveries to consumers. This package closes that gap on the consumer
// side, with dedupnode's Claim → handler → Commit (client.Process): a
// handler that fails releases its claim, so the redelivery runs it again,
// and a consumer that crashes mid-message holds the ID only until its lease
// expires.
//
//	h, _ := natsdedup.New(natsdedup.Config{
//		Processor: batcher, // a *client.Batcher (or *client.Client)
//		Namespace: "orders-consumer",
//		Handler: func(ctx context.Context, msg jetstream.Msg) error {
//			return chargeCard(ctx, msg.Data())
//		},
//	})
//	cc, _ := consumer.Consume(h.Handle)
//
// Acknowledgement per outcome: processed or duplicate → Ack; another
// consumer holds the ID → NakWithDelay until its lease expires; handler
// error, lost lease or dedupnode unreachable → NakWithDelay(RetryDelay);
// same ID with another payload digest (with DigestPayload) or no usable ID
// → Term, because a redelivery cannot fix it.
package natsdedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/internal/settle"
	"github.com/dedupnode/dedupnode/integrations/msgid"
)

// IDFunc returns the dedup ID of a message. An error wrapping
// msgid.ErrNoID means the message has none.
type IDFunc func(msg jetstream.Msg) ([]byte, error)

// HeaderID takes the ID from header name (e.g. jetstream.MsgIDHeader,
// "Nats-Msg-Id").
func HeaderID(name string) IDFunc {
	return func(msg jetstream.Msg) ([]byte, error) {
		if v := msg.Headers().Get(name); v != "" {
			return []byte(v), nil
		}
		return nil, fmt.Errorf("%w: no %s header", msgid.ErrNoID, name)
	}
}

// JSONFieldID takes the ID from a field of the JSON payload (see
// msgid.JSONField for the path syntax).
func JSONFieldID(path string) IDFunc {
	return func(msg jetstream.Msg) ([]byte, error) { return msgid.JSONField(msg.Data(), path) }
}

// ContentID derives the ID from the payload: its hex SHA-256, so that
// identical payloads are duplicates (SQS FIFO content-based dedup).
func ContentID() IDFunc {
	return func(msg jetstream.Msg) ([]byte, error) { return msgid.Content(msg.Data()), nil }
}

// FirstID tries each IDFunc in turn and returns the first ID found; it
// fails with the last error when none yields one.
func FirstID(fns ...IDFunc) IDFunc {
	return func(msg jetstream.Msg) ([]byte, error) {
		err := fmt.Errorf("%w: no ID function given", msgid.ErrNoID)
		for _, fn := range fns {
			var id []byte
			if id, err = fn(msg); err == nil && len(id) > 0 {
				return id, nil
			}
		}
		return nil, err
	}
}

// DefaultID is the Nats-Msg-Id header when the producer set one, else the
// payload's content hash.
var DefaultID = FirstID(HeaderID(jetstream.MsgIDHeader), ContentID())

// Config configures a Handler.
type Config struct {
	// Processor runs the handler at most once per ID: a *client.Batcher
	// (claims and commits of concurrent messages share RPCs) or a
	// *client.Client. Required.
	Processor client.Processor
	// Namespace is the dedupnode namespace, typically one per consumer
	// group. Required.
	Namespace string
	// Handler applies the message's effect. Its context is cancelled when
	// the claim's lease is lost; check it before making the effect
	// visible. Required.
	Handler func(ctx context.Context, msg jetstream.Msg) error
	// ID extracts the message ID (default DefaultID).
	ID IDFunc
	// DigestPayload sends the payload's SHA-256 with the claim, so that an
	// ID reused for a different payload is reported (and the message
	// terminated) instead of acknowledged as a duplicate.
	DigestPayload bool
	// RetryDelay is the Nak delay after a handler error, a lost lease or
	// an unreachable cluster (default 1 s).
	RetryDelay time.Duration
	// InProgressDelay caps the Nak delay for a message whose ID another
	// consumer is processing; the delay is the time left on that
	// consumer's lease, at least 50 ms and at most InProgressDelay
	// (default 5 s).
	InProgressDelay time.Duration
	// KeepAlive, when positive, tells JetStream every KeepAlive that the
	// handler is still working (msg.InProgress), so that AckWait does not
	// expire for a slow handler. Set it below the consumer's AckWait.
	KeepAlive time.Duration
	// Timeout bounds one handler run (0: no bound).
	Timeout time.Duration
	// ProcessOptions are passed to every Process call (lease, commit TTL).
	ProcessOptions []client.ProcessOption
	// Observe, if set, is called after each message with what was done.
	Observe func(msg jetstream.Msg, r Result)
	// Context is the parent of every handler run (default Background).
	Context context.Context
}

// Action is what the Handler told JetStream.
type Action string

const (
	ActionAck  Action = "ack"
	ActionNak  Action = "nak"
	ActionTerm Action = "term"
)

// Result is what happened to one delivery.
type Result struct {
	// ID is the message's dedup ID (nil when none could be found).
	ID []byte
	// Outcome is Process's outcome (OutcomeUnknown when no ID was found).
	Outcome client.Outcome
	// Ran says whether the handler ran.
	Ran bool
	// Action is the acknowledgement sent; AckErr its error, if any.
	Action Action
	// Delay is the Nak delay.
	Delay  time.Duration
	AckErr error
	// Err is the handler's or dedupnode's error, if any.
	Err error
}

// Handler handles JetStream messages at most once per ID. Safe for
// concurrent use; its Handle method is a jetstream.MessageHandler.
type Handler struct {
	cfg  Config
	opts []client.ProcessOption
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
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetryDelay", cfg.RetryDelay}, {"InProgressDelay", cfg.InProgressDelay}, {"KeepAlive", cfg.KeepAlive}, {"Timeout", cfg.Timeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("natsdedup: %w", err)
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
	return &Handler{cfg: cfg, opts: cfg.ProcessOptions}, nil
}

// Handle processes one delivery and acknowledges it; it is a
// jetstream.MessageHandler, for Consumer.Consume.
func (h *Handler) Handle(msg jetstream.Msg) { h.HandleContext(h.cfg.Context, msg) }

// HandleContext is Handle with an explicit parent context; it returns what
// it did.
func (h *Handler) HandleContext(ctx context.Context, msg jetstream.Msg) Result {
	r := h.handle(ctx, msg)
	switch r.Action {
	case ActionAck:
		r.AckErr = msg.Ack()
	case ActionNak:
		r.AckErr = msg.NakWithDelay(r.Delay)
	case ActionTerm:
		reason := "dedupnode: "
		if r.Err != nil {
			reason += r.Err.Error()
		} else {
			reason += r.Outcome.String()
		}
		r.AckErr = msg.TermWithReason(reason)
	}
	if h.cfg.Observe != nil {
		h.cfg.Observe(msg, r)
	}
	return r
}

func (h *Handler) handle(ctx context.Context, msg jetstream.Msg) Result {
	id, err := h.cfg.ID(msg)
	if err == nil && len(id) == 0 {
		err = msgid.ErrNoID
	}
	if err != nil {
		return Result{Action: ActionTerm, Err: fmt.Errorf("message ID: %w", err)}
	}
	if h.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.cfg.Timeout)
		defer cancel()
	}
	opts := h.opts
	if h.cfg.DigestPayload {
		opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(msg.Data())))
	}
	res, err := h.cfg.Processor.Process(ctx, h.cfg.Namespace, id, func(ctx context.Context) error {
		if h.cfg.KeepAlive > 0 {
			stop := h.keepAlive(msg)
			defer stop()
		}
		return h.cfg.Handler(ctx, msg)
	}, opts...)
	r := Result{ID: id, Outcome: res.Outcome, Ran: res.Ran, Err: err}
	dec := settle.Decide(res, id, h.cfg.InProgressDelay, h.cfg.RetryDelay)
	switch dec.Action {
	case settle.Done:
		r.Action = ActionAck
	case settle.Drop:
		r.Action, r.Err = ActionTerm, dec.Err
	default:
		r.Action, r.Delay = ActionNak, dec.Delay
	}
	return r
}

// keepAlive sends msg.InProgress every KeepAlive until stopped.
func (h *Handler) keepAlive(msg jetstream.Msg) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(h.cfg.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Consume handles the messages of cons with up to workers handler runs at
// once (so that their claims and commits share batched RPCs when the
// Processor is a *client.Batcher), until ctx ends or the message iterator
// closes. It returns nil when ctx ended, else the iterator's error. Messages
// fetched but not yet handled when it stops are not acknowledged: JetStream
// redelivers them after AckWait.
func (h *Handler) Consume(ctx context.Context, cons jetstream.Consumer, workers int, opts ...jetstream.PullMessagesOpt) error {
	it, err := cons.Messages(opts...)
	if err != nil {
		return fmt.Errorf("natsdedup: messages: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()

	work := make(chan jetstream.Msg)
	done := make(chan struct{})
	for range max(workers, 1) {
		go func() {
			defer func() { done <- struct{}{} }()
			for msg := range work {
				h.HandleContext(ctx, msg)
			}
		}()
	}
	defer func() {
		close(work)
		for range max(workers, 1) {
			<-done
		}
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("natsdedup: next message: %w", err)
		}
		select {
		case work <- msg:
		case <-ctx.Done():
			return nil
		}
	}
}
