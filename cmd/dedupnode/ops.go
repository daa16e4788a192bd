package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/spf13/cobra"
)

// opFlags are the flags of mark, check, claim, commit, renew, release and
// forget.
type opFlags struct {
	clientFlags
	namespace    string
	ttl          time.Duration
	lease        time.Duration
	consistency  string
	maxStaleness time.Duration
	held         string
	heldLease    *client.Lease // --held, parsed (ID unset)
	digest       string
	requestToken string
	batch        int
}

// op describes one of the per-ID commands.
type op struct {
	name    string
	short   string
	long    string
	example string
	// flags says which optional flags the command takes; held: the
	// command names leases (ID=LEASE, --held).
	ttl, lease, consistency, held, digest bool
	// token: the command writes with request tokens (--request-token).
	token bool
	// read: the command writes nothing (its batches are answered, not
	// applied).
	read bool
	// run sends one batch of entries (IDs, or ID=LEASE for lease commands),
	// with the request token of the batch (nil unless o.token).
	run func(ctx context.Context, c *client.Client, f *opFlags, entries []string, token []byte) ([]client.Result, []string, error)
}

func newOpCmds(e *env) []*cobra.Command {
	ops := []op{
		{
			name:  "mark",
			short: "Record IDs if absent: new (process it) or duplicate (skip it)",
			long: `Mark atomically records each ID that is not yet recorded, like Redis
SET NX EX but replicated to a majority before it answers. For each ID it
prints "new" (recorded now: process the message), "duplicate" (already
recorded: skip it) or "conflict" (recorded with another --digest: a producer
reused the ID). The record lives --ttl (default: the namespace's TTL).`,
			example: `  dedupnode mark --addr 127.0.0.1:7070 order-1 order-2
  dedupnode mark --namespace payments --ttl 5m evt-42
  seq 1 10000 | dedupnode mark -            # IDs one per line on stdin
  dedupnode mark --digest "$(sha256sum < body.json | cut -d' ' -f1)" evt-42`,
			ttl: true, digest: true, token: true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, ids []string, token []byte) ([]client.Result, []string, error) {
				items, err := f.items(ids, token)
				if err != nil {
					return nil, nil, err
				}
				res, err := c.Mark(ctx, f.namespace, items, f.ttl)
				return res, ids, err
			},
		},
		{
			name:  "check",
			short: "Read-only: is each ID recorded (seen) or not (not_seen)?",
			long: `Check reports for each ID whether it is recorded and not expired ("seen")
or not ("not_seen"), without recording anything. An ID under a live claim
lease (claimed, not yet committed or released) answers "seen" too, with
state=leased in the text output (state "leased" in JSON; "committed" once
committed): someone is processing it. By default check is linearizable: a
check that starts after a mark was acknowledged never answers not_seen for
it. --consistency stale answers from the contacted node alone: faster, but
it may miss the last moments of replication. --consistency bounded
--max-staleness 5s answers from the contacted node (a read replica, say)
when it can show it misses no mark acknowledged more than 5s ago, else
through the leader like linearizable (docs/REGIONS.md).`,
			example: `  dedupnode check --addr 127.0.0.1:7070 order-1 order-3
  #   order-1	seen	expires_at=...
  #   order-3	not_seen
  dedupnode check job-1                     # claimed, not yet committed
  #   job-1	seen	state=leased	expires_at=...
  dedupnode check --consistency stale order-1
  dedupnode check --addr 127.0.0.1:7073 --consistency bounded --max-staleness 5s order-1
  dedupnode check --output json order-1`,
			consistency: true, read: true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, ids []string, _ []byte) ([]client.Result, []string, error) {
				cons, err := client.ParseConsistency(f.consistency)
				if err != nil {
					return nil, nil, usagef("--consistency: %v", err)
				}
				if cons == client.Bounded {
					res, _, err := c.CheckBounded(ctx, f.namespace, bytesOf(ids), f.maxStaleness)
					return res, ids, err
				}
				res, err := c.Check(ctx, f.namespace, bytesOf(ids), cons)
				return res, ids, err
			},
		},
		{
			name:  "claim",
			short: "Take a lease on IDs before processing: acquired, duplicate or in_progress",
			long: `Claim takes a lease on each ID before you process the message. It prints
"acquired" with lease=LEASE (process the message, then commit or release
ID=LEASE), "duplicate" (already committed: skip it), "in_progress" (someone
else holds a live lease: retry later, after its expires_at) or "conflict".
If the holder crashes, the lease expires after --lease (default: the
namespace's lease, 30s) and a redelivery can claim the ID again.

LEASE is FENCING_TOKEN.REQUEST_TOKEN: the lease's fencing token and, in hex,
the claim's request token, which only this claim knows. Commit, renew and
release need both, so only the consumer that claimed can end or extend its
lease: no answer to anyone else carries a live lease's request token or
fencing token (in_progress prints state=leased and expires_at only). Keep
LEASE to yourself; hand the fencing_token to a system that refuses stale
holders. IDs claimed in one command share one LEASE (commit --held LEASE).`,
			example: `  dedupnode claim --lease 1m order-7
  #   order-7	acquired	lease=12.5f0c...	fencing_token=12	expires_at=...
  lease=$(dedupnode claim --lease 1m order-7 | grep -o 'lease=[^[:space:]]*' | cut -d= -f2)
  dedupnode commit "order-7=$lease"     # success: record it as processed
  dedupnode release "order-7=$lease"    # failure: let a redelivery claim it`,
			lease: true, digest: true, token: true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, ids []string, token []byte) ([]client.Result, []string, error) {
				items, err := f.items(ids, token)
				if err != nil {
					return nil, nil, err
				}
				res, err := c.Claim(ctx, f.namespace, items, f.lease)
				return res, ids, err
			},
		},
		{
			name:  "commit",
			short: "Turn leases into committed records: ok or lease_lost",
			long: `Commit turns the leases that claim gave you into committed records that
answer "duplicate" until --ttl passes (default: the namespace's TTL). ` + nameLeasesHelp + ` It
prints "ok", or "lease_lost" when the ID holds no live lease of that LEASE.

` + leaseLostHelp,
			example: `  dedupnode commit "order-7=$lease"       # the lease= value claim printed
  dedupnode commit --held "$lease" --ttl 24h order-7 order-8`,
			ttl: true, held: true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, entries []string, _ []byte) ([]client.Result, []string, error) {
				leases, ids, err := f.leases(entries)
				if err != nil {
					return nil, nil, err
				}
				res, err := c.Commit(ctx, f.namespace, leases, f.ttl)
				return res, ids, err
			},
		},
		{
			name:  "renew",
			short: "Extend held leases: ok or lease_lost",
			long: `Renew extends each lease to --lease from now (default: the namespace's
lease) while processing takes longer than planned. ` + nameLeasesHelp + ` It
prints "ok", or "lease_lost".

` + leaseLostHelp,
			example: `  dedupnode renew --lease 2m "order-7=$lease"`,
			lease:   true, held: true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, entries []string, _ []byte) ([]client.Result, []string, error) {
				leases, ids, err := f.leases(entries)
				if err != nil {
					return nil, nil, err
				}
				res, err := c.Renew(ctx, f.namespace, leases, f.lease)
				return res, ids, err
			},
		},
		{
			name:  "release",
			short: "Drop leases after failed processing so a redelivery can claim at once",
			long: `Release drops each lease so that a redelivery of the message can claim it
at once instead of waiting for the lease to expire. ` + nameLeasesHelp + ` It
prints "ok", or "lease_lost".

` + leaseLostHelp,
			example: `  dedupnode release "order-7=$lease"`,
			held:    true,
			run: func(ctx context.Context, c *client.Client, f *opFlags, entries []string, _ []byte) ([]client.Result, []string, error) {
				leases, ids, err := f.leases(entries)
				if err != nil {
					return nil, nil, err
				}
				res, err := c.Release(ctx, f.namespace, leases)
				return res, ids, err
			},
		},
		{
			name:  "forget",
			short: "Remove IDs so they can be processed again (operator use)",
			long: `Forget removes each ID so that its next mark answers "new" again, for
example to reprocess messages after fixing a bug. It prints "ok" for each ID,
recorded or not.`,
			example: `  dedupnode forget order-1 order-2
  cat ids.txt | dedupnode forget -`,
			run: func(ctx context.Context, c *client.Client, f *opFlags, ids []string, _ []byte) ([]client.Result, []string, error) {
				res, err := c.Forget(ctx, f.namespace, bytesOf(ids))
				return res, ids, err
			},
		},
	}
	cmds := make([]*cobra.Command, 0, len(ops))
	for _, o := range ops {
		cmds = append(cmds, newOpCmd(e, o))
	}
	return cmds
}

// nameLeasesHelp says how commit, renew and release name leases.
const nameLeasesHelp = `Name each lease as ID=LEASE, LEASE being the
lease= value your claim printed for the ID (FENCING_TOKEN.REQUEST_TOKEN), or
give --held LEASE for all IDs (one claim command gives its IDs one LEASE).
A fencing token alone is refused: anyone can guess one, only your claim
knows its request token.`

// leaseLostHelp says what lease_lost covers and what its reason= detail
// (the node's LeaseResult.reason) says.
const leaseLostHelp = `lease_lost means the lease you name is not live; the detail after it says
why, as the cluster decided when your request applied:
  reason=expired            your lease expired and nothing replaced it: claim again
  reason=token_mismatch     the ID's lease is not the one you name: a newer claim
                            took it after yours expired, or LEASE is not the one
                            your claim printed (another consumer's lease)
  reason=already_committed  the ID is committed (by your own commit, another
                            holder's, or a mark): do not process it again
  reason=not_claimed        no claim of the ID: never claimed, released, forgotten,
                            or expired long enough ago that it was dropped
(reason=unknown: the node predates reasons.) The other details are the ID's
live record, if it has one: state=leased: another lease holds it, until its
expires_at; expires_at without state=leased: the committed record.
--output json gives the same as "reason".`

// answersNotErrors names, for the exit status paragraph of op's help, the
// answers a user might take for failures.
func answersNotErrors(op string) string {
	if op == "check" {
		return "seen and not_seen"
	}
	return "duplicate, conflict, in_progress, lease_lost"
}

func newOpCmd(e *env, o op) *cobra.Command {
	f := &opFlags{}
	args := "ID..."
	if o.held {
		args = "ID=LEASE... | --held LEASE ID..."
	}
	cmd := &cobra.Command{
		Use:   o.name + " [flags] " + args,
		Short: o.short,
		Long: o.long + `

IDs come as arguments, or one per line on standard input with "-" (blank
lines are skipped; an empty argument is a usage error). Output: one line per
ID: the ID, a tab, the result, then tab-separated details (reason= with
lease_lost, lease= with acquired, state=leased, fencing_token, expires_at). An ID that holds a tab, a newline, another
control character, invalid UTF-8 or a non-printable character, or that
starts with '"', is printed quoted and escaped as Go's strconv.Quote does
("a\tb"), so every line is one ID; other IDs are printed as they are.
--output json prints one JSON object per line with id (id_b64, standard
base64, for an ID that is not valid UTF-8), result and, when they apply,
reason, lease, state, first_seen, expires_at, fencing_token and request_token.

Exit status: 0 when every ID got an answer — whatever the answers are
(` + answersNotErrors(o.name) + ` are results in the output, not
errors); 1 when a request failed (the lines printed before it stand, the
IDs after them got no answer); 2 for a usage error (nothing was sent).

` + clientEnvHelp,
		Example: strings.ReplaceAll(o.example, "dedupnode ", e.progName+" "),
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("no IDs given: pass them as arguments, or - to read them one per line from standard input")
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return runOp(e, cmd, o, f, args)
		}),
	}
	f.clientFlags.register(cmd)
	fs := cmd.Flags()
	fs.StringVarP(&f.namespace, "namespace", "n", "default", "`NAMESPACE` of the IDs (env DEDUPNODE_NAMESPACE)")
	fs.IntVar(&f.batch, "batch", 1000, "send at most `N` IDs per request (at most the server's --max-batch) (env DEDUPNODE_BATCH)")
	if o.ttl {
		fs.Var(durationValue{&f.ttl}, "ttl", "how long the record lives, a `DURATION` such as 10m, 24h, 7d (default: the namespace's TTL)")
	}
	if o.lease {
		fs.Var(durationValue{&f.lease}, "lease", "lease `DURATION`, e.g. 30s, 5m (default: the namespace's lease)")
	}
	if o.consistency {
		fs.StringVar(&f.consistency, "consistency", "linearizable", "`CONSISTENCY`: linearizable (never misses an acknowledged mark), stale (answer from the contacted node alone) or bounded (from the contacted node when provably at most --max-staleness behind) (env DEDUPNODE_CONSISTENCY)")
		fs.Var(durationValue{&f.maxStaleness}, "max-staleness", "with --consistency bounded: the largest staleness (`DURATION`, e.g. 5s) accepted from the contacted node's own state (env DEDUPNODE_MAX_STALENESS)")
	}
	if o.held {
		fs.StringVar(&f.held, "held", "", "the `LEASE` (the lease= value claim printed) of every ID; otherwise give each as ID=LEASE")
	}
	if o.token {
		fs.StringVar(&f.requestToken, "request-token", "", "request token as `HEX` (1-64 bytes) for every ID, instead of a fresh random one per request: "+
			"a write repeated with its token answers as the first did ("+map[string]string{"mark": "new stays new", "claim": "acquired stays acquired, with the same fencing token"}[o.name]+
			"); after an \"outcome unknown\" error, re-run the command it prints, which carries the failed request's token")
	}
	if o.digest {
		fs.StringVar(&f.digest, "digest", "", "payload digest as `HEX` (at most 64 bytes, e.g. a SHA-256) for every ID; the same ID with another digest answers conflict")
	}
	return cmd
}

func runOp(e *env, cmd *cobra.Command, o op, f *opFlags, args []string) error {
	for i, a := range args {
		if a == "" {
			return usagef("argument %d is an empty ID: an ID is 1 byte or more", i+1)
		}
	}
	if err := f.validate(cmd); err != nil { // DEDUPNODE_* applied from here on
		return err
	}
	fs := cmd.Flags()
	if f.batch < 1 {
		return usagef("%s must be at least 1", flagName(fs, "batch"))
	}
	for _, name := range []string{"ttl", "lease"} {
		if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed && fl.Value.String() == "" {
			return usagef("--%s 0: omit --%s for the namespace's default %s", name, name, name)
		}
	}
	// Limits that hold in every namespace are checked here, so that such
	// input is a usage error and nothing is sent (a namespace's own
	// limits, its max TTL and ID size, only its nodes know).
	for name, d := range map[string]time.Duration{"ttl": f.ttl, "lease": f.lease} {
		if d.Milliseconds() > fsm.MaxTTLLimitMs {
			return usagef("--%s %s exceeds %s, the largest max TTL a namespace can have", name, fmtDuration(d), fmtDuration(time.Duration(fsm.MaxTTLLimitMs)*time.Millisecond))
		}
	}
	if cmd.Flags().Changed("namespace") {
		var inv *fsm.InvalidError
		if err := fsm.ValidateNamespaceName(f.namespace); errors.As(err, &inv) {
			return usagef("%s: %s", flagName(fs, "namespace"), inv.Reason)
		}
	}
	if o.held && cmd.Flags().Changed("held") {
		l, err := parseLease(f.held)
		if err != nil {
			return usagef("--held %q: %v", f.held, err)
		}
		f.heldLease = &l
	}
	if o.consistency {
		cons, err := client.ParseConsistency(f.consistency)
		if err != nil {
			return usagef("%s: %v", flagName(fs, "consistency"), err)
		}
		switch {
		case cons == client.Bounded && (f.maxStaleness <= 0 || f.maxStaleness%time.Millisecond != 0):
			return usagef("%s bounded needs %s, a positive whole number of milliseconds (e.g. 5s); got %v", flagName(fs, "consistency"), flagName(fs, "max-staleness"), f.maxStaleness)
		case cons != client.Bounded && f.maxStaleness != 0:
			return usagef("%s %v: only --consistency bounded takes it", flagName(fs, "max-staleness"), f.maxStaleness)
		}
	}
	if f.digest != "" {
		if _, err := hex.DecodeString(f.digest); err != nil {
			return usagef("--digest %q: not hex: %v", f.digest, err)
		}
	}
	var given []byte
	if f.requestToken != "" || cmd.Flags().Changed("request-token") {
		var err error
		if given, err = hex.DecodeString(f.requestToken); err != nil || len(given) < 1 || len(given) > 64 {
			return usagef("--request-token %q: want 1-64 bytes as hex (2-128 hex digits), as an outcome-unknown error prints it", f.requestToken)
		}
	}
	c, err := f.dial(e.ctx, cmd)
	if err != nil {
		return explain(err, &f.clientFlags, f.namespace)
	}
	defer c.Close()
	out := bufio.NewWriter(e.stdout)
	defer out.Flush()
	return batches(args, e.stdin, f.batch, func(b batch) error {
		timeout := f.withTimeout
		if b.sent == 0 {
			timeout = f.firstTimeout // --timeout counts from dial
		}
		ctx, cancel := timeout(e.ctx)
		defer cancel()
		// The CLI picks each request's token (as the client would, one per
		// call, kept across its retries), so that an outcome-unknown error
		// can print it.
		var token []byte
		if o.token {
			token = given
			if token == nil {
				token = client.NewRequestToken()
			}
		}
		res, ids, err := o.run(ctx, c, f, b.entries, token)
		if err != nil && token != nil && errors.Is(err, client.ErrOutcomeUnknown) {
			return outcomeUnknown(err, e, cmd, &f.clientFlags, b, token)
		}
		if err != nil {
			if te := ttlError(err, cmd); te != nil {
				return te
			}
			if be := batchError(err, cmd, len(b.entries)); be != nil {
				return be
			}
			return explainBatch(err, &f.clientFlags, f.namespace, b, o.read)
		}
		f.answered.Store(true)
		for i, r := range res {
			if err := printResult(out, f.output, ids[i], r); err != nil {
				return err
			}
		}
		return out.Flush()
	})
}

// source is where an entry (an ID, or ID=TOKEN) came from: line Line of
// standard input, or, when Line is 0, the Arg-th argument after the flags.
type source struct{ arg, line int }

func (s source) String() string {
	if s.line > 0 {
		return "line " + strconv.Itoa(s.line)
	}
	return "argument " + strconv.Itoa(s.arg)
}

// span names the entries from a to b in the input: "line 7", "lines
// 1-1000", "arguments 1-3", "argument 2 to line 998".
func span(a, b source) string {
	switch {
	case a == b:
		return a.String()
	case a.line > 0 && b.line > 0:
		return fmt.Sprintf("lines %d-%d", a.line, b.line)
	case a.line == 0 && b.line == 0:
		return fmt.Sprintf("arguments %d-%d", a.arg, b.arg)
	}
	return a.String() + " to " + b.String()
}

// batch is one request's worth of entries and where in the input they and
// the entries before them came from.
type batch struct {
	entries []string
	from    []source // from[i]: where entries[i] came from
	// sent is how many entries earlier batches carried, all answered;
	// first and prev are where the first and the last of them came from.
	sent        int
	first, prev source
}

// span names the batch's entries in the input.
func (b batch) span() string { return span(b.from[0], b.from[len(b.from)-1]) }

// sentSpan names the entries of the earlier batches: "lines 1-1000".
func (b batch) sentSpan() string { return span(b.first, b.prev) }

// batches calls fn with the entries of args in order, at most n at a time;
// an argument "-" stands for the lines of stdin (blank lines skipped). Each
// batch says where its entries came from, so that an error can name the
// input line rather than the position in the request.
func batches(args []string, stdin io.Reader, n int, fn func(batch) error) error {
	b := batch{entries: make([]string, 0, min(n, 4096)), from: make([]source, 0, min(n, 4096))}
	flush := func() error {
		if err := fn(b); err != nil {
			return err
		}
		if b.sent == 0 {
			b.first = b.from[0]
		}
		b.sent += len(b.entries)
		b.prev = b.from[len(b.from)-1]
		b.entries, b.from = b.entries[:0], b.from[:0]
		return nil
	}
	add := func(s string, from source) error {
		b.entries = append(b.entries, s)
		b.from = append(b.from, from)
		if len(b.entries) < n {
			return nil
		}
		return flush()
	}
	readStdin := false
	for i, a := range args {
		if a != "-" {
			if err := add(a, source{arg: i + 1}); err != nil {
				return err
			}
			continue
		}
		if readStdin {
			return usagef(`"-" given twice: standard input can be read once`)
		}
		readStdin = true
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for line := 1; sc.Scan(); line++ {
			text := strings.TrimRight(sc.Text(), "\r")
			if strings.TrimSpace(text) == "" {
				continue // blank: IDs keep their spaces, but a line of only spaces is no ID
			}
			if err := add(text, source{arg: i + 1, line: line}); err != nil {
				return err
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("reading IDs from standard input: %w", err)
		}
	}
	if len(b.entries) > 0 {
		return fn(b)
	}
	return nil
}

// explainBatch is explain for a batch of a per-ID command. An error about
// one entry names its input line or argument and the entry, never its
// position in the request (the typed client.Error.Item, or the entry a
// usage error is about); after earlier batches, the error says which lines
// they applied (or answered, for read) and where to send the input again
// from.
func explainBatch(err error, f *clientFlags, namespace string, b batch, read bool) error {
	p := &progress{this: "the batch of " + b.span(), resume: b.from[0].String(), read: read}
	if b.sent > 0 {
		done := "applied"
		if read {
			done = "answered"
		}
		p.applied = fmt.Sprintf("%s (%d IDs) %s", b.sentSpan(), b.sent, done)
	}
	var be *badEntryError
	if errors.As(err, &be) && be.i < len(b.entries) {
		// A malformed entry (ID=TOKEN): found before its batch was sent.
		what := fmt.Sprintf("%s (%s): %v", b.from[be.i], quoteEntry(b.entries[be.i]), be.err)
		if b.sent == 0 {
			return usagef("%s", what)
		}
		return &opError{err: fmt.Errorf("%s; %s; %s not sent", what, p.applied, p.this),
			hint: fmt.Sprintf("fix %s, then send the input again from %s on (the IDs before it were answered above)", b.from[be.i], p.resume)}
	}
	e := client.AsError(err)
	if e != nil && e.Kind == client.ErrInvalidArgument && e.Item > 0 && e.Item <= len(b.entries) {
		i := e.Item - 1
		msg := fmt.Sprintf("%s (%s), %s: %s", b.from[i], quoteEntry(b.entries[i]), itemField(e), cmp.Or(e.Violation, e.Message))
		hint := fmt.Sprintf("fix %s and retry", b.from[i])
		if b.sent > 0 {
			hint = fmt.Sprintf("fix %s, then send the input again from %s on (the IDs before it were answered above)", b.from[i], p.resume)
		}
		return &opError{err: p.nothing("request", "rejected", msg), hint: hint}
	}
	explained := explainIn(err, f, namespace, p)
	var oe *opError
	if b.sent == 0 || !errors.As(explained, &oe) {
		return explained
	}
	if !p.used {
		oe.err = fmt.Errorf("%w; %s before %s failed", oe.err, p.applied, p.this)
	}
	switch {
	case errors.Is(err, context.Canceled):
	case errors.Is(err, client.ErrOutcomeUnknown):
		oe.hint = fmt.Sprintf("once the cluster has a leader (see 'dedupnode status --addr %s'), send the input again from %s on",
			strings.Join(f.addrs, ","), p.resume)
	default:
		oe.hint += fmt.Sprintf("; then send the input again from %s on (the IDs before it were answered above)", p.resume)
	}
	return oe
}

// outcomeUnknown explains a write of batch b, sent with token, whose
// outcome is unknown: it names the token and prints the command to run
// again with it (this run's command line with --request-token), whose
// answers are the ones this run would have printed.
func outcomeUnknown(err error, e *env, cmd *cobra.Command, f *clientFlags, b batch, token []byte) error {
	ce := client.AsError(err)
	where := ""
	if ce.LastLeader != "" {
		where = fmt.Sprintf(" (last known leader %s)", ce.LastLeader)
	}
	hexTok := hex.EncodeToString(token)
	head, timeout := "outcome unknown", ""
	if timedOut(err, e) {
		// The call's own deadline ended it: a re-run with the same
		// --timeout could end the same way.
		head = fmt.Sprintf("outcome unknown: no answer within --timeout %s", fmtDuration(f.timeout))
		timeout = fmtDuration(longerTimeout(f.timeout))
	}
	msg := fmt.Sprintf("%s: the write of %s, request token %s, may or may not have been applied%s: %s", head, b.span(), hexTok, where, ce.Message)
	if b.sent > 0 {
		msg += fmt.Sprintf("; %s (%d IDs) applied before", b.sentSpan(), b.sent)
	}
	again := "re-run"
	if b.sent > 0 || b.from[0].line > 0 {
		again = "send the input again from " + b.from[0].String() + " on to"
	}
	when := fmt.Sprintf("once the cluster has a leader (see 'dedupnode status --addr %s'), ", strings.Join(f.addrs, ","))
	if timeout != "" {
		when = "with a longer --timeout, "
	}
	return &opError{err: errors.New(msg),
		hint: fmt.Sprintf("%s%s %s, and each ID answers as this run would have (new stays new; a run without the token would answer duplicate for the IDs applied)",
			when, again, rerunWith(e, cmd, hexTok, timeout))}
}

// timedOut: err ended at the call's own deadline (--timeout), not at an
// interrupt of the whole command.
func timedOut(err error, e *env) bool {
	return errors.Is(err, context.DeadlineExceeded) && e.ctx.Err() == nil
}

// longerTimeout is the --timeout a re-run after a call that ran out of
// timeout is suggested: twice it, and at least the default (15s).
func longerTimeout(d time.Duration) time.Duration {
	return max(2*d, 15*time.Second)
}

// rerunWithToken is this run's command line with --request-token tok (in
// place of the one given, if any), quoted for a POSIX shell.
func rerunWithToken(e *env, cmd *cobra.Command, tok string) string {
	return rerunWith(e, cmd, tok, "")
}

// rerunWith is rerunWithToken with --timeout timeout too, in place of the
// one given, if any (timeout "": keep the command's).
func rerunWith(e *env, cmd *cobra.Command, tok, timeout string) string {
	var args []string
	inserted := false
	for i := 0; i < len(e.args); i++ {
		a := e.args[i]
		switch {
		case a == "--request-token" && i+1 < len(e.args):
			i++
			continue
		case strings.HasPrefix(a, "--request-token="):
			continue
		case timeout != "" && a == "--timeout" && i+1 < len(e.args):
			i++
			continue
		case timeout != "" && strings.HasPrefix(a, "--timeout="):
			continue
		}
		args = append(args, a)
		if !inserted && a == cmd.Name() {
			args = append(args, "--request-token", tok)
			if timeout != "" {
				args = append(args, "--timeout", timeout)
			}
			inserted = true
		}
	}
	if !inserted {
		head := []string{cmd.Name(), "--request-token", tok}
		if timeout != "" {
			head = append(head, "--timeout", timeout)
		}
		args = append(head, args...)
	}
	out := []string{e.progName}
	for _, a := range args {
		out = append(out, shellQuote(a))
	}
	return strings.Join(out, " ")
}

// shellQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and - _ . / : = , @ % +.
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-_./:=,@%+", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// itemField is the field, within its item, of an invalid request about one
// item: e.Field is the field in the request ("items[7].id", or "ids[7]" for
// a list of IDs), and the part after the item is kept ("id").
func itemField(e *client.Error) string {
	i := e.Item - 1
	field := strings.TrimPrefix(strings.TrimPrefix(e.Field, fmt.Sprintf("items[%d]", i)), fmt.Sprintf("ids[%d]", i))
	return cmp.Or(strings.TrimPrefix(field, "."), "id")
}

// quoteEntry quotes an entry of the input for an error message, cut to 40
// bytes.
func quoteEntry(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:40]) + "..."
	}
	return strconv.Quote(s)
}

// badEntryError is a usage error about entries[i] of a batch.
type badEntryError struct {
	i   int
	err error
}

func (e *badEntryError) Error() string { return e.err.Error() }
func (e *badEntryError) Unwrap() error { return &usageError{e.err} }

func bytesOf(ids []string) [][]byte {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		out[i] = []byte(id)
	}
	return out
}

// items are the IDs as items with --digest and the request token.
func (f *opFlags) items(ids []string, token []byte) ([]client.Item, error) {
	var dg []byte
	if f.digest != "" {
		var err error
		if dg, err = hex.DecodeString(f.digest); err != nil {
			return nil, usagef("--digest: %v", err)
		}
	}
	items := make([]client.Item, len(ids))
	for i, id := range ids {
		items[i] = client.Item{ID: []byte(id), Digest: dg, RequestToken: token}
	}
	return items, nil
}

// leases parses entries as IDs (with --held) or ID=LEASE, split at the
// last '='. It returns the leases and the bare IDs.
func (f *opFlags) leases(entries []string) ([]client.Lease, []string, error) {
	leases := make([]client.Lease, len(entries))
	ids := make([]string, len(entries))
	for i, e := range entries {
		if f.heldLease != nil {
			// An entry that already carries a lease is a mix of the two
			// forms, not an ID: refuse it rather than send it as one. An ID
			// that does end in =LEASE goes through as ID=LEASE=LEASE.
			if k := strings.LastIndexByte(e, '='); k >= 0 {
				if _, err := parseLease(e[k+1:]); err == nil {
					return nil, nil, &badEntryError{i, fmt.Errorf("%q gives its own lease, and so does --held: use one form (an ID that ends in =%s: give it as %s=%s)", e, e[k+1:], e, f.held)}
				}
			}
			l := *f.heldLease
			l.ID = []byte(e)
			leases[i], ids[i] = l, e
			continue
		}
		k := strings.LastIndexByte(e, '=')
		if k < 0 {
			return nil, nil, &badEntryError{i, errors.New("no lease: give ID=LEASE with the lease= value your claim printed, or --held LEASE")}
		}
		if k == 0 {
			return nil, nil, &badEntryError{i, errors.New("empty ID: give ID=LEASE")}
		}
		l, err := parseLease(e[k+1:])
		if err != nil {
			return nil, nil, &badEntryError{i, err}
		}
		l.ID = []byte(e[:k])
		leases[i], ids[i] = l, e[:k]
	}
	return leases, ids, nil
}

// leaseText is the LEASE the CLI prints for a lease (claim's lease=) and
// reads back (ID=LEASE, --held): FENCING_TOKEN.REQUEST_TOKEN, the fencing
// token in decimal and the claim's request token in hex.
func leaseText(l client.Lease) string {
	return strconv.FormatUint(l.FencingToken, 10) + "." + hex.EncodeToString(l.RequestToken)
}

// parseLease parses a LEASE (leaseText); the Lease has no ID. Its errors
// say what the value lacks, for the bare fencing token that a LEASE used to
// be and for the empty value a script gets from an in_progress answer.
func parseLease(s string) (client.Lease, error) {
	if s == "" {
		return client.Lease{}, errors.New(`no LEASE: give the lease= value your claim printed (a claim that did not print one, e.g. "in_progress", took no lease: the ID is someone else's)`)
	}
	fence, tok, ok := strings.Cut(s, ".")
	n, err := strconv.ParseUint(fence, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return client.Lease{}, fmt.Errorf("fencing token %q overflows: fencing tokens are 64-bit, at most %d (give the lease= value your claim printed)", fence, uint64(math.MaxUint64))
	case err != nil || n == 0:
		return client.Lease{}, fmt.Errorf("LEASE %q does not start with a positive fencing token: give the lease= value your claim printed (FENCING_TOKEN.REQUEST_TOKEN)", s)
	case !ok:
		return client.Lease{}, fmt.Errorf("%q is a fencing token alone, not a LEASE: give the lease= value your claim printed (FENCING_TOKEN.REQUEST_TOKEN); a fencing token does not prove the lease is yours", s)
	}
	b, err := hex.DecodeString(tok)
	if err != nil || len(b) < 1 || len(b) > fsm.MaxTokenBytes {
		return client.Lease{}, fmt.Errorf("LEASE %q: the request token after the '.' must be 1-%d bytes as hex, as claim prints it", s, fsm.MaxTokenBytes)
	}
	return client.Lease{FencingToken: n, RequestToken: b}, nil
}

const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// resultJSON is the --output json shape of one item.
type resultJSON struct {
	ID           string `json:"id,omitempty"`
	IDB64        string `json:"id_b64,omitempty"` // an ID that is not valid UTF-8, standard base64
	Result       string `json:"result"`
	Reason       string `json:"reason,omitempty"` // lease_lost only
	Lease        string `json:"lease,omitempty"`  // acquired only
	State        string `json:"state,omitempty"`
	FirstSeen    string `json:"first_seen,omitempty"`
	ExpiresAt    string `json:"expires_at,omitempty"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	Digest       string `json:"digest,omitempty"`
	RequestToken string `json:"request_token,omitempty"`
}

// textID is id as the text output prints it: as it is, or quoted as Go's
// strconv.Quote does when printing it as it is would be ambiguous — a tab
// or newline would split the line, other control characters, invalid
// UTF-8 and non-printable runes would not read back — or when it starts
// with a double quote (so that a line's first field starting with '"' is
// always a quoted ID: strconv.Unquote gives the ID back).
func textID(id string) string {
	if needsQuote(id) {
		return strconv.Quote(id)
	}
	return id
}

func needsQuote(id string) bool {
	if id == "" || id[0] == '"' || !utf8.ValidString(id) {
		return true
	}
	for _, r := range id {
		if !strconv.IsPrint(r) {
			return true
		}
	}
	return false
}

func printResult(w io.Writer, format, id string, r client.Result) error {
	if format == "json" {
		j := resultJSON{ID: id, Result: r.Code.String(), Reason: string(r.LostReason)}
		if l, ok := r.Lease(); ok {
			j.Lease = leaseText(l)
		}
		if !utf8.ValidString(id) {
			// JSON strings are UTF-8: encoding/json would replace the bad
			// bytes with U+FFFD, losing the ID. As export does: id_b64.
			j.ID, j.IDB64 = "", base64.StdEncoding.EncodeToString([]byte(id))
		}
		if rec := r.Record; rec != nil {
			if rec.State != client.StateUnknown {
				j.State = rec.State.String()
			}
			if !rec.FirstSeen.IsZero() {
				j.FirstSeen = rec.FirstSeen.Format(timeLayout)
			}
			if !rec.Expires.IsZero() {
				j.ExpiresAt = rec.Expires.Format(timeLayout)
			}
			j.FencingToken = rec.FencingToken
			j.Digest = hex.EncodeToString(rec.Digest)
			j.RequestToken = hex.EncodeToString(rec.RequestToken)
		}
		b, err := json.Marshal(j)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	line := textID(id) + "\t" + r.Code.String()
	if r.LostReason != "" {
		// A detail of its own (the result column stays lease_lost for
		// scripts that cut it), first so it reads as the why.
		line += "\treason=" + string(r.LostReason)
	}
	if l, ok := r.Lease(); ok {
		line += "\tlease=" + leaseText(l)
	}
	if rec := r.Record; rec != nil {
		if rec.State == client.StateLeased && r.Code != client.CodeAcquired {
			line += "\tstate=leased"
		}
		if rec.FencingToken != 0 {
			line += "\tfencing_token=" + strconv.FormatUint(rec.FencingToken, 10)
		}
		if !rec.Expires.IsZero() {
			line += "\texpires_at=" + rec.Expires.Format(timeLayout)
		}
	}
	_, err := fmt.Fprintln(w, line)
	return err
}
