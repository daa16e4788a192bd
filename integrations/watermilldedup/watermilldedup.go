// Package watermilldedup deduplicates Watermill messages with dedupnode,
// in two ways:
//
//   - Repository implements watermill's middleware.ExpiringKeyRepository
//     (the store behind middleware.Deduplicator) with dedupnode's Mark, so
//     the dedup window is shared by every instance of the service and
//     survives the loss of any minority of dedupnode nodes — where
//     watermill's built-in map repository is local to one process.
//     Deduplicator marks BEFORE the handler runs: if the handler then fails,
//     the redelivery looks like a duplicate and is dropped.
//
//   - Middleware is a router middleware that does not have that flaw: it
//     claims the message ID, runs the handler, commits on success and
//     releases on error (client.Process), so a failed handler's redelivery
//     is processed, and a duplicate is acknowledged without running the
//     handler. Prefer it for handlers with side effects.
package watermilldedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/dedupnode/dedupnode/client"
)

// Marker records IDs with a TTL; *client.Batcher implements it (wrap a
// *client.Client with c.NewBatcher()).
type Marker interface {
	Mark(ctx context.Context, namespace string, item client.Item, ttl time.Duration) (client.Result, error)
}

// Repository is a middleware.ExpiringKeyRepository backed by dedupnode.
type Repository struct {
	m      Marker
	ns     string
	window time.Duration
}

var _ middleware.ExpiringKeyRepository = (*Repository)(nil)

// NewRepository returns a repository that remembers keys in namespace for
// window (0: the namespace's default TTL). The namespace's expiry mode
// decides whether a repeated key extends its window (sliding) or not
// (fixed, the default). dedupnode keeps TTLs in whole milliseconds: a
// window that is negative or not a whole number of them (500µs, 1.5ms) is
// refused here, rather than failing every mark later.
func NewRepository(m Marker, namespace string, window time.Duration) (*Repository, error) {
	if m == nil || namespace == "" {
		return nil, errors.New("watermilldedup: a Marker and a namespace are required")
	}
	if window < 0 || window%time.Millisecond != 0 {
		return nil, fmt.Errorf("watermilldedup: window %v: want 0 (the namespace's default TTL) or a positive whole number of milliseconds", window)
	}
	return &Repository{m: m, ns: namespace, window: window}, nil
}

// IsDuplicate marks key and reports whether it was already marked within
// its window (a key reused with another digest cannot happen here: the
// key is all the repository sees). Its retries inside the dedupnode client
// keep one request token, so a lost reply does not turn the first sighting
// into a duplicate; a new call after an error is a new sighting.
func (r *Repository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	res, err := r.m.Mark(ctx, r.ns, client.Item{ID: []byte(key)}, r.window)
	if err != nil {
		return false, fmt.Errorf("watermilldedup: mark %q: %w", key, err)
	}
	switch res.Code {
	case client.CodeNew:
		return false, nil
	case client.CodeDuplicate, client.CodeConflict:
		return true, nil
	}
	return false, fmt.Errorf("watermilldedup: mark %q: unexpected result %v", key, res.Code)
}

// lenTimeout bounds Len's export of the namespace.
const lenTimeout = 30 * time.Second

// Len returns the number of live keys (recorded, not expired) in the
// repository's namespace, as watermill's in-memory repository does; -1 when
// they cannot be counted (the Marker is not a *client.Batcher, or the
// cluster did not answer). It exports the whole namespace: use it in tests
// and for small namespaces, not on a hot path. Needs the admin right on the
// namespace when the cluster runs with tokens.
func (r *Repository) Len() int {
	b, ok := r.m.(interface{ Client() *client.Client })
	if !ok {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), lenTimeout)
	defer cancel()
	n := 0
	err := b.Client().Export(ctx, r.ns, func(client.ExportedRecord) error { n++; return nil })
	switch {
	case errors.Is(err, client.ErrNamespaceNotFound):
		return 0 // nothing marked yet: the namespace is created on first use
	case err != nil:
		return -1
	}
	return n
}

// ErrInProgress is returned by the Middleware's handler when another
// instance holds the claim on the message ID: the router nacks the message
// and the Pub/Sub redelivers it later. Combine with middleware.Retry or a
// Pub/Sub redelivery delay to avoid a tight loop.
var ErrInProgress = errors.New("watermilldedup: message is being processed by another consumer")

// ErrConflict is returned when the message ID was already recorded with
// another payload digest (a producer reused the ID). Route it to a poison
// queue: middleware.PoisonQueueWithFilter(pub, topic, func(err error) bool
// { return errors.Is(err, watermilldedup.ErrConflict) }).
var ErrConflict = errors.New("watermilldedup: message ID reused for another payload")

// UUID uses the message's UUID as its dedup ID (the default).
func UUID(msg *message.Message) ([]byte, error) {
	if msg.UUID == "" {
		return nil, errors.New("message has no UUID")
	}
	return []byte(msg.UUID), nil
}

// MetadataID uses the metadata value key as the dedup ID.
func MetadataID(key string) func(*message.Message) ([]byte, error) {
	return func(msg *message.Message) ([]byte, error) {
		if v := msg.Metadata.Get(key); v != "" {
			return []byte(v), nil
		}
		return nil, fmt.Errorf("message %s has no %q metadata", msg.UUID, key)
	}
}

// Middleware runs a handler at most once per message ID: claim → handler
// → commit, or release when the handler returns an error.
type Middleware struct {
	// Processor is a *client.Batcher or *client.Client. Required.
	Processor client.Processor
	// Namespace is the dedupnode namespace. Required.
	Namespace string
	// ID returns the message's dedup ID (default UUID).
	ID func(*message.Message) ([]byte, error)
	// DigestPayload sends the payload's SHA-256 with the claim, so that
	// an ID reused for another payload fails with ErrConflict.
	DigestPayload bool
	// ProcessOptions are passed to every Process call.
	ProcessOptions []client.ProcessOption
}

// Middleware returns the message.HandlerMiddleware. While the handler
// runs, msg.Context() is cancelled if the claim's lease is lost (and
// carries the lease: client.LeaseFrom).
//
// Outcomes: processed → the handler's messages are returned (the router
// publishes them; note that they are published after the commit, so a
// publish failure after it loses them — use an outbox when that matters);
// duplicate → no messages, no error (acked, handler not run); in progress
// → ErrInProgress; conflict → ErrConflict; handler error → that error
// (the claim was released, the redelivery will run the handler).
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	idFn := m.ID
	if idFn == nil {
		idFn = UUID
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		if m.Processor == nil || m.Namespace == "" {
			return nil, errors.New("watermilldedup: Middleware needs a Processor and a Namespace")
		}
		id, err := idFn(msg)
		if err != nil {
			return nil, fmt.Errorf("watermilldedup: %w", err)
		}
		opts := m.ProcessOptions
		if m.DigestPayload {
			opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(msg.Payload)))
		}
		var produced []*message.Message
		orig := msg.Context()
		res, err := m.Processor.Process(orig, m.Namespace, id, func(ctx context.Context) error {
			msg.SetContext(ctx)
			defer msg.SetContext(orig)
			var herr error
			produced, herr = h(msg)
			return herr
		}, opts...)
		switch res.Outcome {
		case client.OutcomeProcessed:
			return produced, nil
		case client.OutcomeDuplicate:
			return nil, nil
		case client.OutcomeInProgress:
			return nil, fmt.Errorf("%w: %s", ErrInProgress, id)
		case client.OutcomeConflict:
			return nil, fmt.Errorf("%w: %s", ErrConflict, id)
		}
		if err == nil {
			err = fmt.Errorf("watermilldedup: %s: %v", id, res.Outcome)
		}
		return nil, err
	}
}
