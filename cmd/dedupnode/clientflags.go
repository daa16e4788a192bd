package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/security"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
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
	region  string
	// clusterID is --cluster-id: the only cluster the command may use.
	clusterID string

	// unresolved are the --addr entries whose host name did not resolve
	// while others did (resolve).
	unresolved []string

	// State of the CLI's retry policy (see retryIf).
	answered     atomic.Bool  // some node answered: refusals are outages, not typos
	refusedSince atomic.Int64 // Unix ns of the first refused connection, 0 if none

	// firstBy is the deadline of the first request after dial: --timeout
	// from the start of dial, so that finding the cluster counts against
	// it (firstTimeout).
	firstBy time.Time

	// stream: the command streams (backup, export): --timeout bounds each
	// wait for the node's next chunk (client.WithStreamIdleTimeout), not
	// the call.
	stream bool

	// namespaces lists the cluster's namespaces through the dialled client
	// (nil before dial), for explain to suggest one for a mistyped name.
	namespaces func(ctx context.Context) ([]client.Namespace, error)
}

// refusedGrace is how long the CLI retries refused connections while no
// node has answered it yet: enough for a node that is just starting, short
// enough that a stopped cluster or a wrong --addr fails in seconds.
const refusedGrace = 3 * time.Second

// retryIf is the CLI's retry policy on top of the client's (which already
// stops on errors waiting does not heal: TLS mismatches, bad tokens, wrong
// ports): refused connections are retried only for refusedGrace unless a
// node has answered before (then the cluster is failing over and retries
// run until --timeout). An address whose host name did not resolve
// (f.unresolved) counts as refusing.
func (f *clientFlags) retryIf(err error) bool {
	refused := errors.Is(err, client.ErrRefused) || slices.Contains(f.unresolved, client.AsError(err).Addr)
	if !refused {
		if e := client.AsError(err); e.Reason != "" {
			f.answered.Store(true) // a node's own error: the cluster is there
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

// tlsHint says what to do about a TLS mismatch between the CLI and the
// node, "" for other errors.
func tlsHint(err error) string {
	switch client.TLSProblem(err) {
	case "":
		return ""
	case client.TLSNodeSpeaksTLS:
		return "the node speaks TLS: pass --tls-ca (and --tls-cert/--tls-key for mutual TLS)"
	case client.TLSNodeSpeaksPlaintext:
		return "the node speaks plaintext: drop --tls-ca, --tls-cert and --tls-key (and the DEDUPNODE_TLS_* variables)"
	case client.TLSUnknownAuthority:
		return "the node's certificate does not verify against --tls-ca: pass the CA that signed the nodes' certificates"
	case client.TLSClientCertRequired:
		return "the node requires a client certificate: pass --tls-cert and --tls-key (DEDUPNODE_TLS_CERT/KEY), signed by the cluster's client CA"
	case client.TLSClientCertRefused:
		return "the node refuses this client certificate: pass --tls-cert/--tls-key signed by the cluster's client CA"
	}
	return "check --tls-ca (the CA that signed the nodes), and --tls-cert/--tls-key if the cluster requires client certificates"
}

// clientEnvFlags are the flags of client commands that may also come from
// DEDUPNODE_<FLAG> (applyEnv, as serve's): how to reach the cluster, how
// to print, and for the per-ID commands which namespace, batch size and
// consistency. Flags that say what one request writes (--ttl, --lease,
// --held, --digest, --request-token, a namespace's settings) never
// do: a variable left in a shell would silently change later writes.
// clientEnvHelp says the same in --help.
var clientEnvFlags = []string{"addr", "tls-ca", "tls-cert", "tls-key", "token", "region", "cluster-id", "timeout", "output",
	"namespace", "batch", "consistency", "max-staleness"}

// clientEnvHelp is the --help paragraph on DEDUPNODE_* for client commands.
const clientEnvHelp = `Environment: DEDUPNODE_<FLAG> (upper case, '-' as '_') sets --addr,
--tls-ca, --tls-cert, --tls-key, --token, --region, --timeout, --output and,
for mark, check, claim, commit, renew, release and forget, --namespace,
--batch, --consistency and --max-staleness (DEDUPNODE_ADDR,
DEDUPNODE_NAMESPACE, ...); a flag given on the command line wins. Flags that
say what a request writes (--ttl, --lease, --held, --digest,
--request-token, namespace settings) are never read from the environment.`

// register adds the shared connection flags (registerConn), --timeout
// (one request with its retries) and --output.
func (f *clientFlags) register(cmd *cobra.Command) {
	f.registerConn(cmd)
	f.registerTimeout(cmd, 15*time.Second)
	cmd.Flags().StringVarP(&f.output, "output", "o", "text", "output `FORMAT`: text or json (env DEDUPNODE_OUTPUT)")
}

// registerTimeout adds --timeout with default def.
func (f *clientFlags) registerTimeout(cmd *cobra.Command, def time.Duration) {
	f.timeout = def
	cmd.Flags().Var(durationValue{&f.timeout}, "timeout",
		"give up a request (one batch, with its retries) after this `DURATION`, counted from the start (finding the cluster included; each later batch gets its own); "+
			"a node that leaves an attempt unanswered for a third of the time left (2-5s) is given up on and the request retried on the leader the cluster reports then (env DEDUPNODE_TIMEOUT)")
}

// registerConn adds the flags that say how to reach a cluster — --addr,
// --tls-ca, --tls-cert, --tls-key, --token (and their DEDUPNODE_*
// variables, read by validateConn) — for commands whose --timeout and
// --output mean something of their own (bench, demo).
func (f *clientFlags) registerConn(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&f.addrs, "addr", []string{defaultAddr},
		"gRPC `HOST:PORT` of one or more nodes, comma-separated (env DEDUPNODE_ADDR); one reachable node is enough, writes are routed to the leader")
	// Help shows the default as it is typed, not in pflag's slice syntax
	// ("[127.0.0.1:7070]").
	fs.Lookup("addr").DefValue = defaultAddr
	fs.StringVar(&f.tlsCA, "tls-ca", "", "connect over TLS, verifying the nodes with this CA `FILE` (PEM) (env DEDUPNODE_TLS_CA)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate `FILE` (PEM) for clusters that require mutual TLS (env DEDUPNODE_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key `FILE` (PEM) of --tls-cert (env DEDUPNODE_TLS_KEY)")
	fs.StringVar(&f.token, "token", "", "access `TOKEN` for clusters run with --auth-file; prefer env DEDUPNODE_TOKEN, which other users cannot see in the process list")
	fs.StringVar(&f.region, "region", "", "the `REGION` this command runs in (a node's serve --region): checks go to a node of that region, writes to the leader (env DEDUPNODE_REGION)")
	fs.StringVar(&f.clusterID, "cluster-id", "", "talk only to nodes of the cluster with this `ID` ('dedupnode status' shows it); without it, the first node that answers names the cluster. A node of another cluster fails the command (env DEDUPNODE_CLUSTER_ID)")
}

func (f *clientFlags) validate(cmd *cobra.Command) error {
	if err := f.validateConn(cmd); err != nil {
		return err
	}
	fs := cmd.Flags()
	if f.output != "text" && f.output != "json" {
		return usagef("%s: want text or json", flagValue(fs, "output", f.output))
	}
	if f.timeout <= 0 {
		return usagef("%s must be positive", flagName(fs, "timeout"))
	}
	return nil
}

// validateConn reads the DEDUPNODE_* variables of the connection flags and
// checks them.
func (f *clientFlags) validateConn(cmd *cobra.Command) error {
	fs := cmd.Flags()
	if err := applyEnv(fs, clientEnvFlags...); err != nil {
		return err
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return usagef("%s and %s go together", flagName(fs, "tls-cert"), flagName(fs, "tls-key"))
	}
	if f.tlsCert != "" && f.tlsCA == "" {
		return usagef("%s needs --tls-ca, the CA that signed the nodes' certificates", flagName(fs, "tls-cert"))
	}
	if len(f.addrs) == 0 {
		return usagef("%s is empty: give the gRPC HOST:PORT of a node, e.g. --addr %s", flagName(fs, "addr"), defaultAddr)
	}
	for i, a := range f.addrs {
		a = strings.TrimSpace(a)
		f.addrs[i] = a
		if a == "" {
			return usagef("empty address in %s (trailing comma?): give gRPC HOST:PORT addresses separated by commas, e.g. --addr %s", flagName(fs, "addr"), defaultAddr)
		}
		if scheme, rest, ok := strings.Cut(a, "://"); ok {
			return usagef("%s: drop the %s:// scheme: nodes speak gRPC on HOST:PORT, e.g. --addr %s", flagValue(fs, "addr", a), scheme, strings.TrimSuffix(rest, "/"))
		}
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return usagef("%s: want HOST:PORT, e.g. %s", flagValue(fs, "addr", a), defaultAddr)
		}
		// A port number out of range is a typo the dialer would report as
		// an unreachable node; a name (a service in /etc/services) is the
		// resolver's to judge.
		if _, port, err := net.SplitHostPort(a); err == nil {
			if n, err := strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
				return usagef("%s: port %d is out of range (1-65535)", flagValue(fs, "addr", a), n)
			}
		}
	}
	if err := cluster.CheckRegion(f.region); err != nil {
		return usagef("%s: %v", flagName(fs, "region"), err)
	}
	return nil
}

// connOptions are the client options of the TLS and token flags.
func (f *clientFlags) connOptions() ([]client.Option, error) {
	var opts []client.Option
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
	return opts, nil
}

// dial validates the flags and creates a client. A client retries for at
// most the request timeout.
func (f *clientFlags) dial(ctx context.Context, cmd *cobra.Command) (*client.Client, error) {
	if err := f.validate(cmd); err != nil {
		return nil, err
	}
	// The first request's --timeout runs from here: resolving --addr and
	// finding the leader are part of answering it.
	f.firstBy = time.Now().Add(f.timeout)
	// Discovery at start is bounded by a short deadline: calls retry anyway.
	dctx, cancel := context.WithTimeout(ctx, min(time.Until(f.firstBy), 2*time.Second))
	defer cancel()
	conn, err := f.connOptions()
	if err != nil {
		return nil, err
	}
	if err := f.resolve(ctx); err != nil {
		return nil, err
	}
	// The client's automatic attempt timeout: an attempt unanswered for a
	// third of what is left of --timeout (2-5 s) is abandoned and tried
	// again, on the leader the cluster reports by then.
	opts := append([]client.Option{
		client.WithRetry(1000, 50*time.Millisecond, time.Second),
		client.WithRetryIf(f.retryIf),
	}, conn...)
	if f.region != "" {
		opts = append(opts, client.WithRegion(f.region))
	}
	if f.stream {
		opts = append(opts, client.WithStreamIdleTimeout(f.timeout))
	}
	if f.clusterID != "" {
		opts = append(opts, client.WithClusterID(f.clusterID))
	}
	c, err := client.New(dctx, f.addrs, opts...)
	if err == nil && c.Leader() != "" {
		f.answered.Store(true)
	}
	if err == nil {
		f.namespaces = c.ListNamespaces
	}
	return c, err
}

// resolve looks up the host names of --addr before anything is dialled.
// gRPC reports a name that does not resolve only in the text of an
// UNAVAILABLE status ("produced zero addresses"), retried until --timeout
// like a node that is down. When no entry of --addr resolves, resolve
// fails at once naming them; entries that do not resolve among others
// that do are kept in f.unresolved, for explain to mention.
func (f *clientFlags) resolve(ctx context.Context) error {
	d := 5 * time.Second
	if f.timeout > 0 {
		d = min(f.timeout, d)
	}
	if !f.firstBy.IsZero() {
		d = min(d, time.Until(f.firstBy))
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var bad []string
	var why error
	for _, a := range f.addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil || host == "" || net.ParseIP(host) != nil {
			continue // an IP address, or gRPC's to judge
		}
		if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return ctx.Err() // interrupted
			}
			bad, why = append(bad, a), err
		}
	}
	f.unresolved = bad
	if len(bad) == 0 || len(bad) < len(f.addrs) {
		return nil
	}
	return &opError{err: fmt.Errorf("the host name of %s could not be resolved (%v)", strings.Join(bad, ", "), why),
		hint: fmt.Sprintf("check the host names in --addr (or DEDUPNODE_ADDR): each must be the HOST:PORT of a node's gRPC port, e.g. --addr %s", defaultAddr)}
}

// withTimeout bounds one request with its retries.
func (f *clientFlags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.timeout)
}

// firstTimeout bounds the first request after dial with its retries:
// --timeout from the start of dial, which resolved --addr and found the
// leader for it, so that --timeout bounds the command's wall time.
func (f *clientFlags) firstTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.firstBy.IsZero() {
		return f.withTimeout(ctx)
	}
	return context.WithDeadline(ctx, f.firstBy)
}

// call is the preamble of a command that sends one request (with its
// retries): it dials a client from the flags, then runs fn with it under
// one --timeout that started when dialling began (firstTimeout). A dial error comes back
// explained; fn's error comes back as it is, for fn knows which namespace
// or node its request named and explains its own errors.
func (f *clientFlags) call(ctx context.Context, cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	c, err := f.dial(ctx, cmd)
	if err != nil {
		return explain(err, f, "")
	}
	defer c.Close()
	ctx, cancel := f.firstTimeout(ctx)
	defer cancel()
	return fn(ctx, c)
}

// explain turns a client error into an operational error: one short line
// saying what happened (the node's own message, without the client's and
// gRPC's wrapping) and a hint saying what to do. It reads the client's
// typed error, never the text.
func explain(err error, f *clientFlags, namespace string) error {
	return explainIn(err, f, namespace, &progress{})
}

// progress says where a failed request stands in a command's input that
// earlier requests answered in part (batches of IDs), so that an error
// saying nothing was applied says of what. Its zero value: no earlier
// request, nothing of the input was applied.
type progress struct {
	// applied names what the earlier requests applied: "lines 1-1000
	// (1000 IDs) applied"; "" if there were none.
	applied string
	// this names the failed request's part: "the batch of lines
	// 1001-2000"; resume where to send the input again from: "line 1001".
	this, resume string
	// read: the command writes nothing (its requests are answered, not
	// applied).
	read bool
	// used is set by explainIn when its message said what was applied.
	used bool
}

// nothing is the error of a request that what was how ("request",
// "rejected") with nothing of it applied, msg saying why.
func (p *progress) nothing(what, how, msg string) error {
	p.used = true
	if p.applied == "" {
		return fmt.Errorf("%s %s, nothing applied: %s", what, how, msg)
	}
	done := "applied"
	if p.read {
		done = "answered"
	}
	return fmt.Errorf("%s; %s; %s %s, nothing of it %s", msg, p.applied, p.this, how, done)
}

// explainIn is explain for a request at p in the command's input.
func explainIn(err error, f *clientFlags, namespace string, p *progress) error {
	var oe *opError
	if errors.As(err, &oe) {
		return err // explained already
	}
	explained := explainErr(err, f, namespace, p)
	if len(f.unresolved) > 0 && errors.As(explained, &oe) &&
		(errors.Is(err, client.ErrRefused) || errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrNotLeader) || errors.Is(err, context.DeadlineExceeded)) {
		oe.hint = fmt.Sprintf("the host name of %s could not be resolved: check --addr; ", strings.Join(f.unresolved, ", ")) + oe.hint
	}
	return explained
}

func explainErr(err error, f *clientFlags, namespace string, p *progress) error {
	if err == nil {
		return nil
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return err
	}
	e := client.AsError(err)
	msg := e.Message
	addrs := strings.Join(f.addrs, ",")
	statusHint := fmt.Sprintf("see 'dedupnode status --addr %s'", addrs)
	switch {
	case errors.Is(err, context.Canceled) && !errors.Is(err, client.ErrOutcomeUnknown) && p.read:
		return &opError{err: errors.New("interrupted"), hint: "this command only reads: nothing was changed; re-run it"}
	case errors.Is(err, context.Canceled) && !errors.Is(err, client.ErrOutcomeUnknown):
		return &opError{err: errors.New("interrupted"), hint: "nothing more was sent; re-run to finish (writes already sent are safe to repeat)"}
	case errors.Is(err, client.ErrOutcomeUnknown):
		where := ""
		if e.LastLeader != "" {
			where = fmt.Sprintf(" (last known leader %s)", e.LastLeader)
		}
		// Writes with request tokens (mark, claim) are explained by
		// outcomeUnknown, with the token; commit, renew, release and
		// forget answer a repeat as they did (ok).
		if errors.Is(err, context.DeadlineExceeded) {
			// The call's own --timeout ended it (an interrupt is
			// context.Canceled): repeating it could end the same way.
			return &opError{err: fmt.Errorf("outcome unknown: no answer within --timeout %s: the write may or may not have been applied%s: %s", fmtDuration(f.timeout), where, msg),
				hint: fmt.Sprintf("re-run the same command with a longer --timeout (e.g. --timeout %s)", fmtDuration(longerTimeout(f.timeout)))}
		}
		return &opError{err: fmt.Errorf("outcome unknown: the write may or may not have been applied%s: %s", where, msg),
			hint: "re-run the same command once the cluster has a leader (" + statusHint + ")"}
	case errors.Is(err, context.DeadlineExceeded) && e.Kind == nil:
		e := fmt.Errorf("no answer within --timeout %s", f.timeout)
		if msg != "" && msg != context.DeadlineExceeded.Error() {
			e = fmt.Errorf("no answer within --timeout %s (%s)", f.timeout, msg)
		}
		return &opError{err: e, hint: fmt.Sprintf("check that a majority of nodes is up with 'dedupnode status --addr %s', or raise --timeout", addrs)}
	}
	switch e.Kind {
	case client.ErrUnauthenticated:
		what := "the token is not accepted: " + msg
		if f.token == "" {
			what = "the cluster requires a token and none was given"
		}
		return &opError{err: fmt.Errorf("not authenticated: %s", what), hint: "pass a token the cluster's auth file lists, with --token or DEDUPNODE_TOKEN"}
	case client.ErrClusterMismatch:
		var mm *client.ClusterMismatchError
		if !errors.As(err, &mm) {
			break
		}
		if e.Reason != "" {
			// A node refused a peer (join): the cluster at --addr is Want.
			return &opError{err: fmt.Errorf("cluster mismatch: the node at %s belongs to cluster %s, not to cluster %s at %s; nothing changed", mm.Addr, mm.Got, mm.Want, addrs),
				hint: "a node keeps its cluster for life: remove it from its cluster and wipe its data dir before joining it to another"}
		}
		return &opError{err: fmt.Errorf("cluster mismatch: the node at %s belongs to cluster %s, not to cluster %s; refused to use it", mm.Addr, mm.Got, mm.Want),
			hint: "check --addr (a stale address of another cluster?), or --cluster-id / DEDUPNODE_CLUSTER_ID if you meant that cluster"}
	case client.ErrPermissionDenied:
		return &opError{err: fmt.Errorf("permission denied: %s", msg), hint: "use a token with that right, or ask an admin to grant it in the auth file"}
	case client.ErrTLSMismatch:
		return &opError{err: fmt.Errorf("cannot connect to %s: %s", e.Addr, msg), hint: tlsHint(err)}
	case client.ErrNotGRPC:
		return &opError{err: fmt.Errorf("%s is not a dedupnode gRPC port: %s", e.Addr, msg),
			hint: "pass a node's gRPC address (serve --grpc-addr, 7070 for 'dedupnode dev'), not its Raft or HTTP port"}
	case client.ErrRefused:
		if e.Addr != "" && !slices.Contains(f.addrs, e.Addr) {
			// --addr answered; the member it sent us to did not.
			who := fmt.Sprintf("the member at %s, learned from the cluster,", e.Addr)
			if e.Addr == e.LastLeader {
				who = fmt.Sprintf("the last known leader, at %s,", e.Addr)
			}
			return &opError{err: fmt.Errorf("%s accepts no connections (%s); the node at %s is up but knows no other leader yet", who, msg, addrs),
				hint: "electing a new leader needs a majority of the nodes up: start the stopped ones, and " + statusHint}
		}
		return &opError{err: fmt.Errorf("no node at %s accepts connections (%s)", addrs, msg),
			hint: "check --addr (HOST:PORT of a running node's gRPC port), or start a cluster (e.g. 'dedupnode dev')"}
	case client.ErrNotLeader, client.ErrUnavailable:
		what := fmt.Sprintf("cluster at %s unavailable", addrs)
		if errors.Is(err, context.DeadlineExceeded) {
			what += " for --timeout " + f.timeout.String()
		}
		return &opError{err: fmt.Errorf("%s: %s", what, msg),
			hint: "a majority of the nodes must be up to elect a leader: start the stopped ones, or wait and " + statusHint}
	case client.ErrNamespaceNotFound:
		name := cmp.Or(e.Namespace, namespace)
		m := fmt.Sprintf("namespace %q does not exist", name)
		if name != "" {
			hint := fmt.Sprintf("create it with 'dedupnode namespace create %s' (list them with 'dedupnode namespace list')", name)
			if near := f.nearNamespace(name); near != "" {
				hint = fmt.Sprintf("did you mean %q? Or %s", near, hint)
			}
			return &opError{err: errors.New(m), hint: hint}
		}
		return &opError{err: errors.New(msg), hint: "check the name"}
	case client.ErrNodeNotFound:
		return &opError{err: errors.New(msg), hint: "check the node ID (see 'dedupnode members')"}
	case client.ErrNotCaughtUp:
		return &opError{err: fmt.Errorf("%s; nothing changed", msg),
			hint: "start the node and let it catch up (see 'dedupnode members' and 'dedupnode status --addr NODE'), or pass --force to promote it anyway"}
	case client.ErrInvalidArgument:
		return &opError{err: p.nothing("request", "rejected", msg), hint: "fix the input and retry"}
	case client.ErrTooLarge:
		return &opError{err: p.nothing("request", "rejected", msg), hint: "send fewer IDs per request (--batch)"}
	case client.ErrDiskFull:
		return &opError{err: p.nothing("write", "refused", msg),
			hint: "free space on the leader's data volume (or grow it, or let expiry drop old IDs); writes resume by themselves, reads still work"}
	case client.ErrNamespaceExists:
		return &opError{err: errors.New(msg), hint: "use 'update' to change it, or pick another name"}
	case client.ErrUnsupported:
		return &opError{err: fmt.Errorf("the node does not support this call: %s", msg), hint: "check that --addr points to a dedupnode gRPC port of the same version"}
	}
	if e.Code == codes.FailedPrecondition {
		return &opError{err: errors.New(msg), hint: statusHint + " for the cluster's state"}
	}
	if msg == "" {
		msg = err.Error()
	}
	return &opError{err: errors.New(msg), hint: "see 'dedupnode status' and the node logs"}
}

// batchError blames --batch when the user raised it and a node refused the
// request's item list as a whole (field "items" or "ids" with no index: a
// non-empty list is refused only for its size): the IDs were fine, the
// batches too large. It returns nil otherwise.
func batchError(err error, cmd *cobra.Command, n int) error {
	e := client.AsError(err)
	fl := cmd.Flags().Lookup("batch")
	if e.Kind != client.ErrInvalidArgument || (e.Field != "items" && e.Field != "ids") || fl == nil || !fl.Changed {
		return nil
	}
	return &opError{err: fmt.Errorf("--batch %s: the node refused a batch of %d IDs (%s); nothing of it applied", fl.Value.String(), n, e.Violation),
		hint: "pass a smaller --batch (the node's limit is its serve --max-batch)"}
}

// ttlError rewords a TTL or lease out of its namespace's range in the terms
// of the flag the user gave: "--ttl 8d exceeds the max TTL of namespace
// default (7d)". It returns nil when err is something else or the flag was
// not given (the namespace default cannot be out of range).
func ttlError(err error, cmd *cobra.Command) error {
	e := client.AsError(err)
	if e.Kind != client.ErrInvalidArgument || e.MaxMs == 0 {
		return nil
	}
	flag := map[string]string{"ttl_ms": "ttl", "lease_ms": "lease"}[e.Field]
	fl := cmd.Flags().Lookup(flag)
	if flag == "" || fl == nil || !fl.Changed {
		return nil
	}
	if e.Namespace == "" {
		return nil // over every namespace's limit: refused before sending (runOp)
	}
	limit := fmtDuration(time.Duration(e.MaxMs) * time.Millisecond)
	return &opError{err: fmt.Errorf("--%s %s exceeds the max TTL of namespace %s (%s); nothing applied", flag, fl.Value.String(), e.Namespace, limit),
		hint: fmt.Sprintf("pass a shorter --%s, or raise the limit with 'dedupnode namespace update %s --max-ttl DURATION'", flag, e.Namespace)}
}

// durationValue is a pflag.Value for durations that also accepts a "d"
// (24 h) unit, as in "7d" or "1d12h"; a bad value reads alike from a flag
// and from DEDUPNODE_*.
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
	if d%time.Millisecond != 0 {
		// The store counts in whole milliseconds: never round a value
		// (500us would become 0, the namespace default).
		return fmt.Errorf("%q is not a whole number of milliseconds (the store counts in ms)", s)
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
		if n > math.MaxInt64/int(24*time.Hour) {
			return 0, fmt.Errorf("duration %q is out of range", s) // never wrapped around
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

// nearNamespace is the existing namespace a mistyped name most likely
// meant: the same but for case, or within two edits; "" if none is, or
// the list cannot be read within a second.
func (f *clientFlags) nearNamespace(name string) string {
	if f.namespaces == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	all, err := f.namespaces(ctx)
	if err != nil {
		return ""
	}
	names := make([]string, len(all))
	for i, ns := range all {
		names[i] = ns.Name
	}
	return nearest(name, names)
}
