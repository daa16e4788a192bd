package client

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/grpccodec"
	"github.com/dedupnode/dedupnode/internal/headercheck"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// maxRecvBytes bounds one reply: a full batch of 10 000 results with their
// records is a few MiB, above gRPC's default of 4 MiB.
const maxRecvBytes = 64 << 20

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("dedupnode client: closed")

// Client talks to a dedupnode cluster. It is safe for concurrent use by
// many goroutines; create one per process and Close it when done.
type Client struct {
	opts options

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	links  map[string]*link // what the transport saw of each address
	addrs  []string         // known node gRPC addresses: seeds first, then learned
	cursor int              // index into addrs of the node used when no leader is known
	leader string           // gRPC address of the last known leader; "" if unknown
	// lastLeader is the address of the last node seen acting as leader
	// (it served a leader call, or said so itself); errors name it.
	lastLeader string
	// discovering is non-nil while a leader discovery runs; it is closed
	// when the discovery ends.
	discovering chan struct{}
	closed      bool
	pipes       map[*grpc.ClientConn]*Pipeline // TransportStream, per node
	// regions maps node addresses to their regions (from Status members);
	// rtts holds each address's last Status round trip; avoid, when an
	// address last failed a regional read (WithRegion).
	regions map[string]string
	rtts    map[string]time.Duration
	avoid   map[string]time.Time
	// clusterID is the cluster the client talks to (WithClusterID, else
	// the first node's); verified maps an address to the link's dial count
	// when its node last answered with that ID; foreign holds the
	// addresses whose node answered with another (clusterid.go).
	clusterID string
	verified  map[string]uint64
	foreign   map[string]*ClusterMismatchError
}

// New returns a client for the cluster whose nodes listen on addrs
// (host:port gRPC addresses; one reachable node is enough, the others are
// learned from it). It runs one leader discovery bounded by ctx and the
// attempt timeout, but does not fail when no node answers: calls retry, so a
// client may be created before the cluster is up. It fails only on invalid
// arguments.
func New(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{opts: o, conns: map[string]*grpc.ClientConn{}, links: map[string]*link{},
		regions: map[string]string{}, rtts: map[string]time.Duration{}, avoid: map[string]time.Time{},
		clusterID: o.clusterID, verified: map[string]uint64{}, foreign: map[string]*ClusterMismatchError{}}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("dedupnode client: address %q: want host:port: %w", a, err)
		}
		if !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
	}
	if len(c.addrs) == 0 {
		return nil, errors.New("dedupnode client: no addresses given")
	}
	for _, a := range c.addrs {
		if _, err := c.conn(a); err != nil {
			c.Close()
			return nil, err
		}
	}
	if !c.opts.pinned {
		c.discover(ctx)
	}
	return c, nil
}

// Close closes every connection. Calls in flight fail with Canceled; later
// calls fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for cc, p := range c.pipes {
		errs = append(errs, p.Close())
		delete(c.pipes, cc)
	}
	for a, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}

// Leader returns the gRPC address of the last known leader, "" if unknown.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// Addrs returns the node addresses the client knows: the ones given to New,
// then those learned from the cluster's membership.
func (c *Client) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.addrs)
}

// conn returns the connection to addr, creating it on first use. gRPC
// reconnects it by itself when the node restarts.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connLocked(addr)
}

func (c *Client) connLocked(addr string) (*grpc.ClientConn, error) {
	if c.closed {
		return nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	l := c.linkLocked(addr)
	var creds credentials.TransportCredentials = plainCreds{TransportCredentials: insecure.NewCredentials(), l: l}
	if c.opts.tls != nil {
		creds = watchedCreds{TransportCredentials: credentials.NewTLS(watchClientCert(c.opts.tls, l)), l: l}
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(l.dial),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvBytes), grpc.ForceCodecV2(grpccodec.Codec{})),
		grpc.WithChainUnaryInterceptor(headercheck.Unary(c.checkCluster(addr))),
		grpc.WithChainStreamInterceptor(headercheck.Stream(c.checkCluster(addr))),
	}, c.opts.dialOpts...)
	cc, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("dedupnode client: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// linkLocked returns the link of addr, creating it on first use.
func (c *Client) linkLocked(addr string) *link {
	l, ok := c.links[addr]
	if !ok {
		l = &link{addr: addr, tls: c.opts.tls != nil}
		c.links[addr] = l
	}
	return l
}

// downLocked: the last dial to addr failed (a dead leader is not adopted
// again from a follower's stale word until it accepts connections).
func (c *Client) downLocked(addr string) bool {
	l, ok := c.links[addr]
	return ok && l.down()
}

// learn records the membership seen in a Status answer from the node at
// from ("" if unknown).
func (c *Client) learn(from string, st *dedupv1.StatusResponse) {
	if c.opts.pinned {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if from != "" && st.GetNodeId() != "" && st.GetNodeId() == st.GetLeaderId() {
		c.lastLeader = from
	}
	for _, m := range st.GetMembers() {
		if a := m.GetGrpcAddr(); a != "" && !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
		if a := m.GetGrpcAddr(); a != "" && m.GetRegion() != "" {
			c.regions[a] = m.GetRegion()
		}
	}
	if from != "" && st.GetRegion() != "" {
		c.regions[from] = st.GetRegion()
	}
	if a := st.GetLeaderGrpcAddr(); a != "" {
		if !slices.Contains(c.addrs, a) {
			c.addrs = append(c.addrs, a)
		}
		if c.downLocked(a) || c.foreignLocked(a) {
			return
		}
		if c.leader != a {
			c.opts.logger.Debug("dedupnode client: leader", "addr", a, "id", st.GetLeaderId())
		}
		c.leader = a
	}
}

// discover asks every known node for its Status concurrently and adopts the
// first leader address reported. Concurrent callers share one discovery.
// Returns once a leader is known, every node answered or failed, or the
// attempt timeout or ctx ends.
func (c *Client) discover(ctx context.Context) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if ch := c.discovering; ch != nil {
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		return
	}
	done := make(chan struct{})
	c.discovering = done
	// Ask the nodes that accept connections (all of them if none does): a
	// dead leader is not dialled again on every discovery.
	var addrs []string
	for _, a := range c.addrs {
		if !c.downLocked(a) && !c.foreignLocked(a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		addrs = slices.Clone(c.addrs)
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.discovering = nil
		c.mu.Unlock()
		close(done)
	}()

	dctx, cancel := c.attemptCtx(ctx, "status")
	defer cancel()
	type answer struct {
		from string
		st   *dedupv1.StatusResponse
	}
	found := make(chan answer, len(addrs))
	for _, a := range addrs {
		cc, err := c.conn(a)
		if err != nil {
			found <- answer{}
			continue
		}
		go func() {
			start := time.Now()
			st, err := dedupv1.NewAdminClient(cc).Status(dctx, &dedupv1.StatusRequest{})
			if err != nil {
				found <- answer{}
				return
			}
			c.mu.Lock()
			c.rtts[a] = time.Since(start)
			c.mu.Unlock()
			found <- answer{a, st}
		}()
	}
	for range addrs {
		select {
		case ans := <-found:
			if ans.st == nil {
				continue
			}
			c.learn(ans.from, ans.st)
			if c.Leader() != "" {
				return
			}
		case <-dctx.Done():
			return
		}
	}
}

// target is where one attempt goes.
type target int

const (
	toLeader target = iota // writes and linearizable reads
	toAny                  // stale reads, status: the current node
	// toLeaderStream: a stream to the leader; it runs as long as it takes
	// (no per-attempt timeout) and is not retried once it delivered data.
	toLeaderStream
	// toRegionOrLeader, toRegionOrAny: a read; with WithRegion, a node of
	// that region (the fastest to answer Status, not one that just
	// failed), else toLeader or toAny.
	toRegionOrLeader
	toRegionOrAny
)

// readTarget is where a read of consistency cons goes.
func (c *Client) readTarget(stale bool) target {
	switch {
	case c.opts.region != "" && stale:
		return toRegionOrAny
	case c.opts.region != "":
		return toRegionOrLeader
	case stale:
		return toAny
	}
	return toLeader
}

// regionalLocked returns the address of the region's node to read from,
// "" if none is known and reachable: the fastest Status round trip among
// those not failed within the last second (all of them if each did).
func (c *Client) regionalLocked() string {
	var best, bestAvoided string
	for _, a := range c.addrs {
		if c.regions[a] != c.opts.region || c.downLocked(a) {
			continue
		}
		faster := func(cur string) bool {
			if cur == "" {
				return true
			}
			ra, oka := c.rtts[a]
			rc, okc := c.rtts[cur]
			return oka && (!okc || ra < rc)
		}
		if time.Since(c.avoid[a]) < time.Second {
			if faster(bestAvoided) {
				bestAvoided = a
			}
			continue
		}
		if faster(best) {
			best = a
		}
	}
	if best == "" {
		return bestAvoided
	}
	return best
}

// pick returns the address for the next attempt: the leader when known and
// wanted, else the current node of the rotation.
func (c *Client) pick(ctx context.Context, t target) (string, *grpc.ClientConn, *link, error) {
	if t == toLeaderStream {
		t = toLeader
	}
	if c.opts.pinned {
		c.mu.Lock()
		defer c.mu.Unlock()
		addr := c.addrs[0]
		cc, err := c.connLocked(addr)
		return addr, cc, c.linkLocked(addr), err
	}
	if t == toRegionOrLeader || t == toRegionOrAny {
		c.mu.Lock()
		addr := c.regionalLocked()
		if addr != "" {
			cc, err := c.connLocked(addr)
			l := c.linkLocked(addr)
			c.mu.Unlock()
			return addr, cc, l, err
		}
		c.mu.Unlock()
		t = map[target]target{toRegionOrLeader: toLeader, toRegionOrAny: toAny}[t]
	}
	if t == toLeader && c.Leader() == "" {
		c.discover(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := c.leader
	if t == toAny || addr == "" {
		// The next node of the rotation that does not refuse connections
		// (all of them if every one does).
		n := len(c.addrs)
		for i := range n {
			if a := c.addrs[(c.cursor+i)%n]; !c.downLocked(a) && !c.foreignLocked(a) {
				c.cursor += i
				break
			}
		}
		addr = c.addrs[c.cursor%n]
	}
	cc, err := c.connLocked(addr)
	return addr, cc, c.linkLocked(addr), err
}

// served notes that addr answered a leader call: it acted as leader.
func (c *Client) served(addr string) {
	c.mu.Lock()
	c.lastLeader = addr
	c.mu.Unlock()
}

// hasOthers reports whether an attempt may go to another node than the
// one that just failed: the client is not pinned and knows more than one.
func (c *Client) hasOthers() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.opts.pinned && len(c.addrs) > 1
}

// failed notes a failed attempt against addr: it is no longer trusted as
// leader, and the rotation moves on to the next node.
func (c *Client) failed(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == addr {
		c.leader = ""
	}
	if c.opts.region != "" && c.regions[addr] == c.opts.region {
		c.avoid[addr] = time.Now()
	}
	if c.addrs[c.cursor%len(c.addrs)] == addr {
		c.cursor++
	}
}

// attemptCtx bounds one attempt of op under ctx by the attempt timeout
// (attemptTimeout).
func (c *Client) attemptCtx(ctx context.Context, op string) (context.Context, context.CancelFunc) {
	if d := c.attemptTimeout(ctx, op); d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// unsafeRepeats are the calls a repeat does not answer as the first did
// (a second create answers AlreadyExists, a second delete or remove
// NotFound, a second transfer moves leadership again): their attempts are
// not cut short by the automatic attempt timeout.
var unsafeRepeats = map[string]bool{
	"create namespace": true, "delete namespace": true, "remove": true, "promote": true, "transfer leadership": true,
}

// unsafeAttemptTimeout bounds an attempt of an unsafeRepeats call under
// the automatic attempt timeout (the attempt timeout of old).
const unsafeAttemptTimeout = 10 * time.Second

// attemptTimeout is how long an attempt of op started now under ctx may
// go unanswered before it is abandoned (and retried while ctx lasts); 0:
// ctx alone bounds it. See WithAttemptTimeout.
func (c *Client) attemptTimeout(ctx context.Context, op string) time.Duration {
	if !c.opts.autoTimeout {
		return c.opts.timeout
	}
	if unsafeRepeats[op] {
		return unsafeAttemptTimeout
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return DefaultAttemptTimeout
	}
	return autoAttemptTimeout(time.Until(dl))
}

// autoAttemptTimeout is the automatic attempt timeout with left before the
// caller's deadline: a third of it within [MinAttemptTimeout,
// DefaultAttemptTimeout], or 0 (all of it) when the attempt would leave
// less than MinAttemptTimeout for another.
func autoAttemptTimeout(left time.Duration) time.Duration {
	d := min(max(left/3, MinAttemptTimeout), DefaultAttemptTimeout)
	if left-d < MinAttemptTimeout {
		return 0
	}
	return d
}

// retryable says whether an attempt that failed with err may be tried again
// while the caller's ctx is live.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	case codes.DeadlineExceeded, codes.Canceled:
		// The attempt's own timeout, not the caller's (checked above).
		return true
	}
	return false
}

// hint adopts the leader named in a NOT_LEADER error's details, so the next
// attempt goes there without a discovery round.
func (c *Client) hint(err error) {
	st, ok := status.FromError(err)
	if !ok || c.opts.pinned {
		return
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != dedupv1.ErrorDomain {
			continue
		}
		if a := info.GetMetadata()[dedupv1.MetaLeaderGRPCAddr]; a != "" {
			c.mu.Lock()
			if !slices.Contains(c.addrs, a) {
				c.addrs = append(c.addrs, a)
			}
			if !c.downLocked(a) && !c.foreignLocked(a) {
				c.leader = a
			}
			c.mu.Unlock()
		}
	}
}

// IsRetryable reports whether err is one the client itself retries
// (Unavailable, Aborted, an attempt timeout): seeing it from a call means
// the attempts or the caller's deadline ran out, and trying again later may
// succeed. A write that failed so may or may not have been applied; a
// later Mark with new items answers duplicate for the ones that were.
func IsRetryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// backoff returns the wait before retry number n (1-based): base·2^(n-1)
// capped at max, jittered to [d/2, d].
func (c *Client) backoff(n int) time.Duration {
	d := c.opts.backoffBase
	for i := 1; i < n && d < c.opts.backoffMax; i++ {
		d *= 2
	}
	d = min(d, c.opts.backoffMax)
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// readOps are the calls that write nothing: their failures never leave an
// outcome unknown.
var readOps = map[string]bool{
	"check": true, "status": true, "describe namespace": true, "list namespaces": true,
	"digest": true, "backup": true, "export": true,
}

// invoke runs one logical call: attempts fn against the picked node, retrying
// retryable failures with backoff until success, maxAttempts, or ctx's end.
// fn must be safe to repeat (writes carry their request token). Its error is
// an *Error; a write that may have been applied by some attempt fails with
// ErrOutcomeUnknown, whatever the last attempt saw.
func (c *Client) invoke(ctx context.Context, op string, t target, fn func(ctx context.Context, cc *grpc.ClientConn) error) error {
	write := !readOps[op]
	var (
		last      *Error
		uncertain bool // some attempt of a write may have been applied
		attempt   int
	)
	for attempt = 1; ; attempt++ {
		addr, cc, l, err := c.pick(ctx, t)
		if err != nil {
			return err
		}
		before := l.state()
		var (
			actx   context.Context
			cancel context.CancelFunc
		)
		if t == toLeaderStream {
			actx, cancel = context.WithCancel(ctx)
		} else {
			actx, cancel = c.attemptCtx(ctx, op)
		}
		err = c.vet(actx, addr, cc, l)
		if err == nil {
			err = fn(actx, cc)
		}
		cancel()
		if err == nil {
			if t != toAny {
				c.served(addr)
			}
			return nil
		}
		e, maybeApplied := c.classify(op, addr, l, before, err)
		last = e
		if write && maybeApplied {
			uncertain = true
		}
		// A removed node never serves again, but the others may: an
		// unpinned client with other nodes moves on (as from a refused
		// dial), and fails with ErrNodeRemoved only when it has none.
		moveOn := e.Kind == ErrNodeRemoved && c.hasOthers() && ctx.Err() == nil
		if !moveOn && (errors.Is(err, errPartial) || errors.Is(err, ErrBackupDamaged) || !retryable(ctx, err) || !Heals(e) || (c.opts.retryIf != nil && !c.opts.retryIf(e))) {
			break
		}
		c.failed(addr)
		c.hint(err)
		if attempt >= c.opts.maxAttempts {
			break
		}
		wait := c.backoff(attempt)
		c.opts.logger.Debug("dedupnode client: retry", "op", op, "addr", addr, "attempt", attempt, "wait", wait, "err", err)
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			last.ctxErr = ctx.Err()
			return c.finish(last, attempt, uncertain)
		}
	}
	if ctx.Err() != nil {
		last.ctxErr = ctx.Err()
	}
	return c.finish(last, attempt, uncertain)
}

// classify turns one attempt's error into an *Error, and says whether the
// attempt may have been applied (for writes).
func (c *Client) classify(op, addr string, l *link, before linkState, err error) (*Error, bool) {
	e := &Error{Op: op, Addr: addr, err: err}
	var mm *ClusterMismatchError
	if errors.As(err, &mm) {
		// The answer was another cluster's: nothing of this cluster's
		// changed.
		e.Kind, e.Cause, e.Code, e.Message = ErrClusterMismatch, mm, codes.FailedPrecondition, mm.Error()
		return e, false
	}
	decodeStatus(e, err)
	if e.Reason != "" {
		// A node answered: it says what happened.
		return e, e.Kind == ErrOutcomeUnknown
	}
	switch e.Code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
		kind, cause, maybeSent := l.transportError(before)
		if kind != nil {
			e.Kind, e.Cause = kind, cause
			if cause != nil {
				e.Message = cause.Error()
			}
			return e, maybeSent && kind != ErrTLSMismatch && kind != ErrNotGRPC
		}
		if e.Code == codes.Unavailable {
			e.Kind = ErrUnavailable
		}
		return e, maybeSent
	}
	return e, false
}

// finish completes the error of a failed call.
func (c *Client) finish(e *Error, attempts int, uncertain bool) error {
	e.Attempts = attempts
	c.mu.Lock()
	e.LastLeader = c.lastLeader
	c.mu.Unlock()
	if uncertain {
		switch e.Kind {
		case nil, ErrUnavailable, ErrNotLeader, ErrRefused, ErrOutcomeUnknown:
			e.Kind = ErrOutcomeUnknown
		}
	}
	return e
}

// NewRequestToken returns a fresh random 16-byte request token. The client
// makes one per logical call itself; this is for callers that keep a token
// across process restarts.
func NewRequestToken() []byte {
	b := make([]byte, 16)
	if _, err := cryptorand.Read(b); err != nil {
		panic("dedupnode client: crypto/rand: " + err.Error())
	}
	return b
}
