package client

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults used by New.
const (
	// DefaultTimeout bounds one RPC attempt.
	DefaultTimeout = 10 * time.Second
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
	timeout     time.Duration
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
}

func defaultOptions() options {
	return options{
		timeout:     DefaultTimeout,
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

// WithTimeout bounds each RPC attempt (not the whole call: that is bounded
// by the caller's context and WithRetry). d <= 0 leaves attempts bounded by
// the caller's context alone. Default DefaultTimeout (10 s). An attempt that
// times out while the caller's context is still live is retried.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
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
// defaults (plaintext transport credentials), so that for example
// grpc.WithTransportCredentials(credentials.NewTLS(cfg)) replaces them.
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

// creds are the transport credentials of the options: TLS or plaintext.
func (o *options) creds() credentials.TransportCredentials {
	if o.tls != nil {
		return credentials.NewTLS(o.tls)
	}
	return insecure.NewCredentials()
}
