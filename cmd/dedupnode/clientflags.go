package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/security"
	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const defaultAddr = "127.0.0.1:7070"

// clientFlags are the flags every command that talks to a cluster shares.
type clientFlags struct {
	addrs   []string
	timeout time.Duration
	output  string
	tlsCA   string
	tlsCert string
	tlsKey  string
	token   string

	// State of the CLI's retry policy (see retryIf).
	answered     atomic.Bool  // some node answered: refusals are outages, not typos
	refusedSince atomic.Int64 // Unix ns of the first refused connection, 0 if none
}

// refusedGrace is how long the CLI retries refused connections while no
// node has answered it yet: enough for a node that is just starting, short
// enough that a stopped cluster or a wrong --addr fails in seconds.
const refusedGrace = 3 * time.Second

// retryIf is the CLI's retry policy on top of the client's: TLS mismatches
// are not retried (they do not heal), and refused connections only for
// refusedGrace unless a node has answered before (then the cluster is
// failing over and retries run until --timeout).
func (f *clientFlags) retryIf(err error) bool {
	if tlsHint(err, f) != "" {
		return false
	}
	if !refused(err) {
		if nodeAnswered(err) {
			f.answered.Store(true)
		}
		return true
	}
	if f.answered.Load() {
		return true
	}
	now := time.Now().UnixNano()
	f.refusedSince.CompareAndSwap(0, now)
	return time.Duration(now-f.refusedSince.Load()) < refusedGrace
}

// grpcStatus returns the innermost gRPC status in err's chain (the one the
// node or the transport produced, without the client's wrapping text).
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus(), true
	}
	return status.FromError(err)
}

// refused: nothing listens at the address (or its name does not resolve).
func refused(err error) bool {
	st, _ := grpcStatus(err)
	m := st.Message()
	return st.Code() == codes.Unavailable && (strings.Contains(m, "connection refused") || strings.Contains(m, "no such host"))
}

// nodeAnswered: err came from a node (a dedupnode error), not from the
// transport (refused, reset, timed out).
func nodeAnswered(err error) bool {
	st, _ := grpcStatus(err)
	switch st.Code() {
	case codes.DeadlineExceeded, codes.Canceled:
		return false
	case codes.Unavailable:
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == "dedupnode" {
				return true
			}
		}
		return false
	}
	return true
}

// tlsHint says what to do about a TLS error or a TLS/plaintext mismatch
// between the CLI and the node, "" for other errors.
func tlsHint(err error, f *clientFlags) string {
	st, _ := grpcStatus(err)
	if st.Code() != codes.Unavailable {
		return ""
	}
	m := st.Message()
	switch {
	case strings.Contains(m, "tls: certificate required"):
		return "the node requires a client certificate: pass --tls-cert and --tls-key (signed by the cluster's client CA)"
	case strings.Contains(m, "remote error: tls: unknown certificate authority"), strings.Contains(m, "remote error: tls: bad certificate"):
		return "the node refuses this client certificate: pass --tls-cert/--tls-key signed by the cluster's client CA"
	case strings.Contains(m, "x509:"):
		return "the node's certificate does not verify against --tls-ca: pass the CA that signed the nodes' certificates"
	case strings.Contains(m, "first record does not look like a TLS handshake"):
		return "the node speaks plaintext: drop --tls-ca, --tls-cert and --tls-key (and the DEDUPNODE_TLS_* variables)"
	case strings.Contains(m, "looked like an HTTP/1.1 header"):
		return "this address serves HTTP/1.1, not gRPC (an admin HTTP port?): pass a node's gRPC address"
	case f.tlsCA == "" && (strings.Contains(m, "error reading server preface") || strings.Contains(m, "connection closed before server preface received")):
		return "the node speaks TLS: pass --tls-ca (and --tls-cert/--tls-key for mutual TLS)"
	case strings.Contains(m, "tls:") || strings.Contains(m, "authentication handshake failed"):
		return "check --tls-ca (the CA that signed the nodes), and --tls-cert/--tls-key if the cluster requires client certificates"
	}
	return ""
}

// clientEnvFlags are the client flags that may also come from DEDUPNODE_*.
var clientEnvFlags = []string{"addr", "tls-ca", "tls-cert", "tls-key", "token"}

func (f *clientFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&f.addrs, "addr", []string{defaultAddr},
		"gRPC `HOST:PORT` of one or more nodes, comma-separated (env DEDUPNODE_ADDR); one reachable node is enough, writes are routed to the leader")
	fs.DurationVar(&f.timeout, "timeout", 15*time.Second,
		"give up a request (one batch, with its retries) after this `DURATION`")
	fs.StringVarP(&f.output, "output", "o", "text", "output `FORMAT`: text or json")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "connect over TLS, verifying the nodes with this CA `FILE` (PEM) (env DEDUPNODE_TLS_CA)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate `FILE` (PEM) for clusters that require mutual TLS (env DEDUPNODE_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key `FILE` (PEM) of --tls-cert (env DEDUPNODE_TLS_KEY)")
	fs.StringVar(&f.token, "token", "", "access `TOKEN` for clusters run with --auth-file; prefer env DEDUPNODE_TOKEN, which other users cannot see in the process list")
}

func (f *clientFlags) validate(cmd *cobra.Command) error {
	if err := applyEnv(cmd.Flags(), clientEnvFlags...); err != nil {
		return err
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	if f.tlsCert != "" && f.tlsCA == "" {
		return usagef("--tls-cert needs --tls-ca, the CA that signed the nodes' certificates")
	}
	if f.output != "text" && f.output != "json" {
		return usagef("--output %q: want text or json", f.output)
	}
	if len(f.addrs) == 0 {
		return usagef("--addr is empty: give the gRPC HOST:PORT of a node, e.g. --addr %s", defaultAddr)
	}
	for i, a := range f.addrs {
		a = strings.TrimSpace(a)
		f.addrs[i] = a
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return usagef("--addr %q: want HOST:PORT, e.g. %s", a, defaultAddr)
		}
	}
	if f.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	return nil
}

// dial validates the flags and creates a client. A client retries for at
// most the request timeout.
func (f *clientFlags) dial(ctx context.Context, cmd *cobra.Command) (*client.Client, error) {
	if err := f.validate(cmd); err != nil {
		return nil, err
	}
	// Discovery at start is bounded by a short deadline: calls retry anyway.
	dctx, cancel := context.WithTimeout(ctx, min(f.timeout, 2*time.Second))
	defer cancel()
	opts := []client.Option{
		client.WithTimeout(min(f.timeout, 10*time.Second)),
		client.WithRetry(1000, 50*time.Millisecond, time.Second),
		client.WithRetryIf(f.retryIf),
	}
	if f.tlsCA != "" {
		cfg, err := security.ClientTLSFiles(f.tlsCA, f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, usagef("%v", err)
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if f.token != "" {
		opts = append(opts, client.WithToken(f.token))
	}
	c, err := client.New(dctx, f.addrs, opts...)
	if err == nil && c.Leader() != "" {
		f.answered.Store(true)
	}
	return c, err
}

// withTimeout bounds one request with its retries.
func (f *clientFlags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.timeout)
}

// explain turns a client error into an operational error: one short line
// saying what happened (the node's own message, without the client's and
// gRPC's wrapping) and a hint saying what to do.
func explain(err error, f *clientFlags, namespace string) error {
	if err == nil {
		return nil
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return err
	}
	st, _ := grpcStatus(err)
	msg := cleanMessage(err)
	addrs := strings.Join(f.addrs, ",")
	switch {
	case errors.Is(err, context.Canceled):
		return &opError{err: errors.New("interrupted"), hint: "nothing more was sent; re-run to finish (writes already sent are safe to repeat)"}
	case errors.Is(err, context.DeadlineExceeded) && st.Code() != codes.Unavailable:
		e := fmt.Errorf("no answer within --timeout %s", f.timeout)
		if msg != context.DeadlineExceeded.Error() && !strings.HasSuffix(msg, ": "+context.DeadlineExceeded.Error()) {
			e = fmt.Errorf("no answer within --timeout %s (%s)", f.timeout, msg)
		}
		return &opError{err: e, hint: fmt.Sprintf("check that a majority of nodes is up with 'dedupnode status --addr %s', or raise --timeout", addrs)}
	}
	switch st.Code() {
	case codes.Unauthenticated:
		what := msg
		switch {
		case strings.HasPrefix(msg, "missing token"):
			what = "the cluster requires a token and none was given"
		case strings.HasPrefix(msg, "invalid token"):
			what = "the token is not in the cluster's auth file"
		}
		return &opError{err: fmt.Errorf("not authenticated: %s", what), hint: "pass a token the cluster's auth file lists, with --token or DEDUPNODE_TOKEN"}
	case codes.PermissionDenied:
		return &opError{err: fmt.Errorf("permission denied: %s", msg), hint: "use a token with that right, or ask an admin to grant it in the auth file"}
	case codes.Unavailable:
		if h := tlsHint(err, f); h != "" {
			return &opError{err: fmt.Errorf("cannot connect to %s: %s", addrs, msg), hint: h}
		}
		if refused(err) {
			if a := dialedAddr(msg); a != "" && !addrIn(a, f.addrs) {
				// --addr answered; the member it sent us (or the call) to,
				// the leader as last known, did not.
				return &opError{err: fmt.Errorf("the cluster's leader as last known, at %s, accepts no connections (%s); the node at %s is up but knows no other leader yet", a, lastPart(msg), addrs),
					hint: fmt.Sprintf("electing a new leader needs a majority of the nodes up: start the stopped ones, and see 'dedupnode status --addr %s'", addrs)}
			}
			return &opError{err: fmt.Errorf("no node at %s accepts connections (%s)", addrs, lastPart(msg)),
				hint: "start one (e.g. 'dedupnode dev') or pass --addr HOST:PORT of a running node"}
		}
		what := fmt.Sprintf("cluster at %s unavailable", addrs)
		if errors.Is(err, context.DeadlineExceeded) {
			what += " for --timeout " + f.timeout.String()
		}
		return &opError{err: fmt.Errorf("%s: %s", what, msg),
			hint: "start nodes (e.g. 'dedupnode dev'), pass --addr HOST:PORT of a running node, or wait for a leader (see 'dedupnode status')"}
	case codes.NotFound:
		if m, ok := strings.CutSuffix(msg, ": "+fsm.ErrNamespaceNotFound.Error()); ok {
			msg = m + " does not exist"
			if namespace != "" {
				return &opError{err: errors.New(msg),
					hint: fmt.Sprintf("create it with 'dedupnode namespace create %s' (list them with 'dedupnode namespace list')", namespace)}
			}
		}
		return &opError{err: errors.New(msg), hint: "check the name"}
	case codes.InvalidArgument, codes.OutOfRange:
		return &opError{err: fmt.Errorf("request rejected, nothing applied: %s", msg), hint: "fix the input and retry"}
	case codes.ResourceExhausted:
		return &opError{err: fmt.Errorf("request rejected, nothing applied: %s", msg), hint: "send fewer IDs per request (--batch)"}
	case codes.AlreadyExists:
		return &opError{err: errors.New(msg), hint: "use 'update' to change it, or pick another name"}
	case codes.FailedPrecondition:
		return &opError{err: errors.New(msg), hint: "see 'dedupnode status' for the cluster's state"}
	case codes.Unimplemented:
		return &opError{err: fmt.Errorf("the node does not support this call: %s", msg), hint: "check that --addr points to a dedupnode gRPC port of the same version"}
	}
	return &opError{err: errors.New(msg), hint: "see 'dedupnode status' and the node logs"}
}

var (
	// "dedupnode mark via 127.0.0.1:7070 (attempt 3, then context deadline
	// exceeded): ", the client's wrapping.
	clientPrefixRE = regexp.MustCompile(`dedupnode [a-z -]+ via \S+( \(attempt \d+(, then [^)]*)?\))?: `)
	// "rpc error: code = Unavailable desc = ", gRPC's.
	rpcPrefixRE = regexp.MustCompile(`rpc error: code = \w+ desc = `)
	// `connection error: desc = "..."`, gRPC's transport wrapping.
	connErrorRE = regexp.MustCompile(`connection error: desc = "(.*)"`)
	// "dial tcp 127.0.0.1:7072: connect: connection refused": the address
	// a failed connection was for.
	dialRE = regexp.MustCompile(`dial tcp (\S+): `)
)

// addrIn reports whether the dialed address a (an IP and port) is one of
// addrs, whose hosts may be names ("localhost:7070").
func addrIn(a string, addrs []string) bool {
	if slices.Contains(addrs, a) {
		return true
	}
	ip, port, err := net.SplitHostPort(a)
	if err != nil {
		return true // cannot tell: assume it is
	}
	for _, x := range addrs {
		h, p, err := net.SplitHostPort(x)
		if err != nil || p != port {
			continue
		}
		if h == "" || h == ip {
			return true
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ips, err := net.DefaultResolver.LookupHost(ctx, h)
		cancel()
		if err != nil || slices.Contains(ips, ip) {
			return true
		}
	}
	return false
}

// dialedAddr is the address a failed dial in msg was for, "" if none.
func dialedAddr(msg string) string {
	if m := dialRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// serverAdvice are the what-to-do suffixes the server adds to its messages
// (server/errors.go); explain gives its own hint instead.
var serverAdvice = []string{
	"; no leader reachable right now; nothing was written, retry is safe with the same request token",
	"; leader is starting its term; nothing was written, retry is safe with the same request token",
	"; node is shutting down; nothing was written, retry is safe with the same request token on another node",
	"; the write may still commit; retry with the same request token",
	"; retry is safe with the same request token",
	"; retry the read on another node",
	"; create it first (dedupnode namespace create)",
	"; nothing was applied",
}

// cleanMessage is err's text without the client's and gRPC's wrapping and
// without the server's advice: what happened, in the node's words.
func cleanMessage(err error) string {
	s := err.Error()
	s = clientPrefixRE.ReplaceAllString(s, "")
	s = rpcPrefixRE.ReplaceAllString(s, "")
	s = connErrorRE.ReplaceAllString(s, "$1")
	s = strings.ReplaceAll(s, `\"`, `"`)
	for _, noise := range []string{"transport: ", "authentication handshake failed: ", "Error while dialing: "} {
		s = strings.ReplaceAll(s, noise, "")
	}
	for _, a := range serverAdvice {
		s = strings.ReplaceAll(s, a, "")
	}
	if i := strings.Index(s, " (possibly because of "); i >= 0 { // crypto/x509's aside
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// lastPart is the innermost cause of a "a: b: c" message ("connection
// refused" of a failed dial).
func lastPart(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// ttlError rewords a TTL or lease out of its namespace's range in the terms
// of the flag the user gave: "--ttl 8d exceeds the max TTL of namespace
// default (7d)". It returns nil when err is something else or the flag was
// not given (the namespace default cannot be out of range).
func ttlError(err error, cmd *cobra.Command) error {
	st, _ := grpcStatus(err)
	if st.Code() != codes.InvalidArgument {
		return nil
	}
	m := ttlRangeRE.FindStringSubmatch(st.Message())
	if m == nil {
		return nil
	}
	flag := map[string]string{"ttl_ms": "ttl", "lease_ms": "lease"}[m[1]]
	fl := cmd.Flags().Lookup(flag)
	if fl == nil || !fl.Changed {
		return nil
	}
	maxMs, perr := strconv.ParseInt(m[2], 10, 64)
	if perr != nil {
		return nil
	}
	limit := fmtDuration(time.Duration(maxMs) * time.Millisecond)
	if m[3] != "" {
		return &opError{err: fmt.Errorf("--%s %s exceeds the max TTL of namespace %s (%s); nothing applied", flag, fl.Value.String(), m[3], limit),
			hint: fmt.Sprintf("pass a shorter --%s, or raise the limit with 'dedupnode namespace update %s --max-ttl DURATION'", flag, m[3])}
	}
	return &opError{err: fmt.Errorf("--%s %s exceeds %s, the largest max TTL a namespace can have; nothing applied", flag, fl.Value.String(), limit),
		hint: fmt.Sprintf("pass a shorter --%s", flag)}
}

// ttlRangeRE matches fsm.Validate's TTL and lease range errors.
var ttlRangeRE = regexp.MustCompile(`^(ttl_ms|lease_ms): -?\d+ ms is outside 0 \(namespace default\) \.\. (\d+) ms \((?:max TTL of namespace "([^"]*)"|[^)]*)\)`)

// durationValue is a pflag.Value for durations that also accepts a "d"
// (24 h) unit, as in "7d" or "1d12h".
type durationValue struct{ d *time.Duration }

// String is "" for zero, so that help shows no "(default 0s)": zero means
// "the namespace's default", which the flag's usage says.
func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return ""
	}
	return fmtDuration(*v.d)
}
func (v durationValue) Type() string { return "duration" }
func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// parseDuration parses a Go duration ("90s", "1h30m") with an optional
// leading whole number of days ("7d", "1d12h"). Negative values are refused.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q: want e.g. 30s, 5m, 24h, 7d", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			s = "0s"
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want e.g. 30s, 5m, 24h, 7d", s)
	}
	d += days
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return d, nil
}

// fmtDuration prints a duration compactly, whole days as "d" and without
// zero trailing units: "7d", "1d12h", "5m", "1h30m", "30s", "1.5s".
func fmtDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var b strings.Builder
	if days := d / (24 * time.Hour); days > 0 {
		b.WriteString(strconv.FormatInt(int64(days), 10) + "d")
		d -= days * 24 * time.Hour
	}
	if d > 0 {
		s := d.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		b.WriteString(s)
	}
	return b.String()
}
