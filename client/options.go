package client

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"google.golang.org/grpc"
)

// Defaults used by New.
const (
	// DefaultAttemptTimeout bounds one attempt of a call whose context
	// has no deadline, and caps the automatic attempt timeout of one that
	// has (WithAttemptTimeout).
	DefaultAttemptTimeout = 5 * time.Second
	// MinAttemptTimeout is the least time the automatic attempt timeout
	// gives an attempt: a healthy cluster answers in milliseconds, a
	// loaded one well within it.
	MinAttemptTimeout = 2 * time.Second
	// DefaultTimeout is DefaultAttemptTimeout, its older name.
	DefaultTimeout = DefaultAttemptTimeout
	// DefaultMaxAttempts is how many times a call is tried in all.
	DefaultMaxAttempts = 10
	// DefaultBackoffBase is the wait before the first retry; it doubles
	// after each failed attempt up to DefaultBackoffMax. With the defaults
	// a call keeps retrying for about 10 s, long enough to ride out a Raft
	// election.
	DefaultBackoffBase = 50 * time.Millisecond
	// DefaultBackoffMax caps the wait between two attempts.
	DefaultBackoffMax = 2 * time.Second
)

type options struct {
	// timeout bounds each attempt when fixed (0: the caller's context
	// alone); autoTimeout: derived from the context (attemptTimeout).
	timeout     time.Duration
	autoTimeout bool
	maxAttempts int
	backoffBase time.Duration
	backoffMax  time.Duration
	dialOpts    []grpc.DialOption
	tls         *tls.Config
	logger      *slog.Logger
	retryIf     func(error) bool
	transport   Transport
	window      int
	// maxStaleness is what Check with Bounded accepts (WithMaxStaleness).
	maxStaleness time.Duration
	region       string
	pinned       bool
	clusterID    string // WithClusterID

	// streamIdle bounds each wait of a Backup or Export attempt for data
	// (WithStreamIdleTimeout, ops.go).
	streamIdle time.Duration
}

func defaultOptions() options {
	return options{
		autoTimeout: true,
		maxAttempts: DefaultMaxAttempts,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
		logger:      slog.New(slog.DiscardHandler),
	}
}

// Option configures a Client.
type Option func(*options)

// WithMaxStaleness sets the max staleness of Check with consistency
// Bounded: the contacted node answers from its own state only when it can
// show it misses no write acknowledged more than d ago, else it asks the
// leader for a read index. Check with Bounded fails with InvalidArgument
// unless d is a positive whole number of milliseconds (there is no
// default: pick what your consumers can tolerate, e.g. 5 s).
func WithMaxStaleness(d time.Duration) Option {
	return func(o *options) { o.maxStaleness = d }
}

// WithAttemptTimeout sets the attempt timeout: how long one attempt of a
// call (one RPC to one node) may go unanswered before the client abandons
// it and tries again — on the leader the cluster reports now, or on
// another node — while the caller's context lasts. It is what lets a call
// ride out a node that hears but does not answer (a frozen or stalled
// leader, a black-holed link) within its deadline: the attempt to it is
// abandoned, and the retry finds the new leader. Retrying is safe: Mark
// and Claim send the call's request token with every attempt (a repeat
// answers as the first: new stays new, acquired keeps its fencing token),
// Commit, Release and Forget answer a repeat as they did, a repeated Renew
// extends the lease from its own time, and reads change nothing. The
// caller's context bounds the whole call (and WithRetry its attempts):
// only when it ends is a write's outcome unknown.
//
// d == 0 (the default) is automatic: an attempt gets a third of the time
// left before the caller's deadline, at least MinAttemptTimeout (2 s) and
// at most DefaultAttemptTimeout (5 s), and an attempt that would leave
// less than MinAttemptTimeout for another gets all of it; without a
// deadline, DefaultAttemptTimeout. So a call with a 10 s deadline whose
// leader froze is tried again on the new leader after about 3.3 s.
// Calls that a repeat does not answer as the first (CreateNamespace,
// DeleteNamespace, Remove, Promote, TransferLeadership) keep attempts of
// up to 10 s, so that a slow one is seldom repeated.
// d > 0 bounds every attempt of every call by d (and the caller's
// context); d < 0 leaves attempts bounded by the caller's context alone,
// so that an unanswered attempt is never retried.
//
// Single-attempt calls (StatusOf, HealthOf, DigestOf, the *At calls) are
// bounded alike.
func WithAttemptTimeout(d time.Duration) Option {
	return func(o *options) {
		o.autoTimeout, o.timeout = d == 0, max(d, 0)
	}
}

// WithTimeout is WithAttemptTimeout, its older name, except that d <= 0
// leaves attempts bounded by the caller's context alone (it never means
// automatic): d > 0 bounds each RPC attempt (not the whole call: that is
// bounded by the caller's context and WithRetry), and an attempt that
// times out while the caller's context is still live is retried.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.autoTimeout, o.timeout = false, max(d, 0) }
}

// WithRetry sets the retry policy: maxAttempts tries in all (1 disables
// retries; values < 1 mean 1), waiting base before the first retry and
// doubling up to maxBackoff, each wait jittered to a random value in
// [wait/2, wait]. Defaults: 10 attempts, 50 ms, 2 s.
func WithRetry(maxAttempts int, base, maxBackoff time.Duration) Option {
	return func(o *options) {
		o.maxAttempts = max(maxAttempts, 1)
		o.backoffBase = max(base, 0)
		o.backoffMax = max(maxBackoff, o.backoffBase)
	}
}

// WithRetryIf narrows the retry policy: an attempt that failed with a
// retryable error is tried again only while fn(err) returns true. Use it to
// stop early on errors that waiting will not heal in your setting (the
// dedupnode CLI stops on TLS mismatches, and on refused connections when no
// node has answered it yet). Default: every retryable error is retried.
func WithRetryIf(fn func(err error) bool) Option {
	return func(o *options) { o.retryIf = fn }
}

// WithDialOptions adds gRPC dial options, applied after the client's
// defaults (plaintext transport credentials, its dialer), which they may
// replace: grpc.WithContextDialer, for example, to reach nodes through a
// proxy. The client sees a node's connections open and close through its
// dialer or, when that is replaced, through its transport credentials
// (plaintext, or WithTLS's), and checks a node's cluster once per
// connection; with both replaced it cannot, and asks the node for its
// Status before every call, so use WithTLS for TLS. A replaced dialer's
// refusals are not told apart: ErrUnavailable instead of ErrRefused.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithTLS connects over TLS with cfg (roots to verify the nodes, and a
// client certificate when the cluster requires mutual TLS); see package
// security for builders.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg }
}

// WithToken sends token on every call as "authorization: Bearer <token>",
// for clusters that run with an auth file. Use it with WithTLS outside a
// trusted network: over plaintext anyone on the path can read the token.
func WithToken(token string) Option {
	return WithDialOptions(grpc.WithPerRPCCredentials(bearerToken(token)))
}

type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (t bearerToken) RequireTransportSecurity() bool { return false }

// WithTransport sets how the Client sends Dedup calls: TransportUnary (the
// default: one RPC per call) or TransportStream (calls from all goroutines
// share one Dedup.Stream per node, with at most window in flight on it;
// window < 1 means DefaultPipelineWindow). Retries, errors and answers are
// the same either way. A Batcher uses TransportStream unless told
// otherwise (WithBatchTransport).
func WithTransport(t Transport, window int) Option {
	return func(o *options) { o.transport, o.window = t, window }
}

// WithLogger makes the client log retries and leader changes at DEBUG level.
// Default: no logging.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithRegion names the region the client runs in (a node's serve
// --region). Checks, of every consistency, then go to a node of that
// region — the one that answered the client's status probes fastest —
// so that a stale check (and a Bloom "definitely not") never crosses a
// WAN link, and a linearizable one crosses it once, inside the cluster,
// in a read-index round shared with the region's other checks. Writes
// still go to the leader; send them through a Batcher so that one WAN
// round trip carries many IDs. When no node of the region is known or
// reachable, checks go where they would without the option (linearizable
// to the leader, stale to any node). Default: no region.
func WithRegion(name string) Option {
	return func(o *options) { o.region = name }
}

// WithPinnedNode sends every call to the first address given to New: no
// leader discovery, no routing to the leader, no other node learned. The
// node forwards writes and linearizable reads to its leader itself. For
// tools that choose the node of every call, such as chaos, which makes one
// pinned client per node; applications want the default routing.
func WithPinnedNode() Option {
	return func(o *options) { o.pinned = true }
}
