package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/webhook"
)

const webhookLong = `Webhook-proxy is a reverse proxy that deduplicates incoming webhooks by
event ID before they reach your endpoint (--upstream):

  - with --signature, a request whose signature does not verify gets 401
    and marks nothing;
  - the first delivery of an event ID goes upstream; a 2xx answer commits
    the ID, any other answer releases it so the sender's retry can succeed;
  - an upstream slower than --upstream-timeout: the sender gets 504
    ("Dedupnode-Status: in-progress"), but the proxy keeps the event's
    lease (renewing it) while the upstream works, and commits or releases
    when it answers; after --upstream-max-wait it gives up on the upstream
    and releases. The event is never handed to the upstream twice at once;
  - a later delivery of the same ID gets 200 at once, without reaching the
    upstream, with the header "Dedupnode-Status: duplicate";
  - a delivery that arrives while the first one is still upstream gets 409
    Conflict with Retry-After: seconds until the earliest moment the event
    may be free (the first delivery's --upstream-timeout while it has not
    passed, else its lease's current expiry).

409 rather than 425 Too Early: 425 is about TLS early data and is retried
at once by clients that know it; 409 says what is true (the event is being
processed), every sender that retries on failure retries it, and a sender
that gives up on 4xx loses nothing, because the first delivery still
answers with the real outcome.

The event ID comes from a header (--id-header, e.g. Webhook-Id,
X-GitHub-Delivery, Idempotency-Key), a field of the JSON body
(--id-json-field, e.g. id or data.object.id), or the body's SHA-256
(--id-content). A request without an ID, or repeating the --id-header
header with different values (two event IDs), gets 400 ("Dedupnode-Status:
no-id") and goes neither to dedupnode nor upstream. Only POST requests are
deduplicated; other methods pass through. Every answer carries
"Dedupnode-Status".

Signatures (--signature): github (X-Hub-Signature-256), stripe
(Stripe-Signature, timestamp within --stripe-tolerance), or hmac (a
HMAC-SHA256 of the body in --signature-header, --signature-encoding hex or
base64, after an optional --signature-prefix). The secret comes from
--signature-secret-file (one secret per line: several during a rotation)
or --signature-secret-env (the name of an environment variable), never
from a flag value, which any user could read in the process list.`

func newWebhookProxyCmd(e *env) *cobra.Command {
	var (
		cf                        clientFlags // the connection flags every cluster command shares
		listen, upstream, ns      string
		idHeader, idJSON          string
		idContent, digest, create bool
		lease, ttl, upTimeout     time.Duration
		maxWait                   time.Duration
		maxBody                   int64
		logLevel                  string
		sig                       signatureFlags
	)
	cmd := &cobra.Command{
		Use:   "webhook-proxy --upstream URL (--id-header NAME | --id-json-field PATH | --id-content) [--listen ADDR] [--namespace NS] [--addr HOST:PORT,...]",
		Short: "Reverse proxy that passes each webhook event upstream once",
		Long:  webhookLong,
		Example: strings.ReplaceAll(`  dedupnode webhook-proxy --upstream http://127.0.0.1:9000 --id-header Webhook-Id
  dedupnode webhook-proxy --listen :8088 --upstream http://orders:8080/hooks --id-json-field data.object.id --namespace stripe`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags(), "addr"); err != nil {
				return err
			}
			u, err := url.Parse(upstream)
			if upstream == "" {
				return usagef("--upstream is required: the URL of the endpoint that handles the webhooks, e.g. http://127.0.0.1:9000")
			}
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("--upstream %q: want an http:// or https:// URL with a host", upstream)
			}
			var idFn webhook.IDFunc
			n := 0
			if idHeader != "" {
				n, idFn = n+1, webhook.HeaderID(idHeader)
			}
			if idJSON != "" {
				n, idFn = n+1, webhook.JSONFieldID(idJSON)
			}
			if idContent {
				n, idFn = n+1, webhook.ContentID()
			}
			if n != 1 {
				return usagef("give exactly one of --id-header NAME, --id-json-field PATH or --id-content")
			}
			if err := cf.validate(cmd); err != nil {
				return err
			}
			if upTimeout < 0 || maxWait <= 0 {
				return usagef("--upstream-timeout must not be negative and --upstream-max-wait must be positive")
			}
			if maxWait < upTimeout {
				return usagef("--upstream-max-wait %v is shorter than --upstream-timeout %v", maxWait, upTimeout)
			}
			verifier, err := sig.verifier(os.Getenv)
			if err != nil {
				return err
			}
			logger, err := newLogger(e.stderr, logLevel, "text")
			if err != nil {
				return err
			}

			ctx := e.ctx
			c, err := cf.dial(ctx, cmd)
			if err != nil {
				return explain(err, &cf, ns)
			}
			defer c.Close()
			if err := ensureNamespace(ctx, c, &cf, ns, ttl, create); err != nil {
				return err
			}
			b := c.NewBatcher()
			defer b.Close()

			h, err := webhook.NewProxy(u, webhook.Config{
				Processor:      b,
				Namespace:      ns,
				ID:             idFn,
				MaxBodyBytes:   maxBody,
				DigestBody:     digest,
				Timeout:        upTimeout,
				MaxUpstream:    maxWait,
				Verify:         verifier,
				ProcessOptions: []client.ProcessOption{client.WithLease(lease), client.WithCommitTTL(ttl)},
				Logger:         logger,
			})
			if err != nil {
				return usagef("%v", err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return &opError{err: fmt.Errorf("listen on %s: %w", listen, err), hint: "pick another --listen address"}
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			fmt.Fprintf(e.stdout, "webhook-proxy: listening on http://%s, forwarding to %s (namespace %s)\n", ln.Addr(), u, ns)

			select {
			case err := <-served:
				return &opError{err: fmt.Errorf("serve: %w", err)}
			case <-ctx.Done():
			}
			// Deliveries whose sender already got 504 go on in the
			// background: wait for them too (each ends by --upstream-max-wait).
			sctx, cancel := context.WithTimeout(context.Background(), maxWait+5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return &opError{err: fmt.Errorf("shutdown: %w", err)}
			}
			if err := h.Wait(sctx); err != nil {
				return &opError{err: fmt.Errorf("shutdown: %w", err)}
			}
			fmt.Fprintln(e.stderr, "webhook-proxy: stopped")
			return nil
		}),
	}
	cf.register(cmd)
	// Webhook-proxy prints no results: --output does not apply.
	_ = cmd.Flags().MarkHidden("output")
	fs := cmd.Flags()
	fs.StringVar(&listen, "listen", "127.0.0.1:8088", "`ADDR` to accept webhooks on (HOST:PORT; port 0 picks a free one)")
	fs.StringVar(&upstream, "upstream", "", "`URL` of the endpoint that handles the webhooks (request paths are appended to its path)")
	fs.StringVar(&idHeader, "id-header", "", "take the event ID from header `NAME` (a request repeating it with different values gets 400)")
	fs.StringVar(&idJSON, "id-json-field", "", "take the event ID from JSON body field `PATH` (dots for nesting, e.g. data.object.id)")
	fs.BoolVar(&idContent, "id-content", false, "derive the event ID from the body's SHA-256 (identical bodies are the same event)")
	fs.StringVar(&ns, "namespace", "webhooks", "dedupnode `NAMESPACE` of the event IDs")
	fs.BoolVar(&create, "create-namespace", true, "create the namespace when it does not exist (default TTL --ttl, or 24h)")
	fs.Var(durationValue{&ttl}, "ttl", "how long (`DURATION`) an event ID is remembered after its delivery succeeded (0: the namespace default, 24h unless configured); e.g. 72h, 7d")
	fs.DurationVar(&lease, "lease", 30*time.Second, "how long (`DURATION`) a delivery in flight holds its event ID; renewed while the upstream works")
	fs.DurationVar(&upTimeout, "upstream-timeout", 25*time.Second, "answer the sender 504 when the upstream has not answered within this `DURATION`; the delivery goes on, holding the event ID until the upstream answers (0: the sender waits as long as the upstream)")
	fs.DurationVar(&maxWait, "upstream-max-wait", webhook.DefaultMaxUpstream, "give up on an upstream call after this `DURATION` (cancel it and release the event ID so a retry can deliver it)")
	sig.register(fs)
	fs.Int64Var(&maxBody, "max-body", 1<<20, "largest request body accepted, in `BYTES` (larger: 413)")
	fs.BoolVar(&digest, "digest-body", true, "send the body's SHA-256 with the event ID, so an ID reused for another body answers 422")
	fs.StringVar(&logLevel, "log-level", "warn", "log `LEVEL` on stderr: debug (one line per webhook), info, warn or error")
	return cmd
}

// signatureFlags select the webhook signature verification.
type signatureFlags struct {
	kind, secretFile, secretEnv string
	header, prefix, encoding    string
	stripeTolerance             time.Duration
}

func (f *signatureFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.kind, "signature", "", "verify each request's signature: github, stripe or hmac (a request that fails gets 401 and marks nothing)")
	fs.StringVar(&f.secretFile, "signature-secret-file", "", "read the signing secret from `FILE` (one per line; several during a rotation)")
	fs.StringVar(&f.secretEnv, "signature-secret-env", "", "read the signing secret from environment variable `NAME`")
	fs.StringVar(&f.header, "signature-header", "", "--signature hmac: the `HEADER` holding the body's HMAC-SHA256")
	fs.StringVar(&f.prefix, "signature-prefix", "", "--signature hmac: a `PREFIX` the header value starts with, e.g. sha256=")
	fs.StringVar(&f.encoding, "signature-encoding", "hex", "--signature hmac: `ENCODING` of the HMAC, hex or base64")
	fs.DurationVar(&f.stripeTolerance, "stripe-tolerance", webhook.DefaultStripeTolerance, "--signature stripe: how far (`DURATION`) the signed timestamp may be from now")
}

// verifier builds the Verifier the flags ask for (nil for none).
func (f *signatureFlags) verifier(getenv func(string) string) (webhook.Verifier, error) {
	if f.kind == "" {
		if f.secretFile != "" || f.secretEnv != "" || f.header != "" || f.prefix != "" {
			return nil, usagef("--signature-* flags given without --signature github|stripe|hmac")
		}
		return nil, nil
	}
	var secrets [][]byte
	switch {
	case f.secretFile != "" && f.secretEnv != "":
		return nil, usagef("give --signature-secret-file or --signature-secret-env, not both")
	case f.secretFile != "":
		data, err := os.ReadFile(f.secretFile)
		if err != nil {
			return nil, usagef("--signature-secret-file: %v", err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				secrets = append(secrets, []byte(l))
			}
		}
		if len(secrets) == 0 {
			return nil, usagef("--signature-secret-file %s holds no secret", f.secretFile)
		}
	case f.secretEnv != "":
		v := strings.TrimSpace(getenv(f.secretEnv))
		if v == "" {
			return nil, usagef("--signature-secret-env %s: the variable is empty or not set", f.secretEnv)
		}
		secrets = append(secrets, []byte(v))
	default:
		return nil, usagef("--signature %s needs a secret: --signature-secret-file FILE or --signature-secret-env NAME (a secret in a flag value would show in the process list)", f.kind)
	}
	if f.kind != "hmac" && (f.header != "" || f.prefix != "") {
		return nil, usagef("--signature-header and --signature-prefix apply to --signature hmac only")
	}
	var v webhook.Verifier
	var err error
	switch f.kind {
	case "github":
		v, err = webhook.GitHubSignature(secrets...)
	case "stripe":
		if f.stripeTolerance <= 0 {
			return nil, usagef("--stripe-tolerance must be positive")
		}
		v, err = webhook.StripeSignature(f.stripeTolerance, secrets...)
	case "hmac":
		if f.header == "" {
			return nil, usagef("--signature hmac needs --signature-header NAME")
		}
		v, err = webhook.NewHMACSignature(f.header, f.prefix, f.encoding, secrets...)
	default:
		return nil, usagef("--signature %q: want github, stripe or hmac", f.kind)
	}
	if err != nil {
		return nil, usagef("%v", err)
	}
	return v, nil
}

// ensureNamespace checks that ns exists and creates it when allowed.
func ensureNamespace(ctx context.Context, c *client.Client, cf *clientFlags, ns string, ttl time.Duration, create bool) error {
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	_, err := c.DescribeNamespace(ctx, ns)
	if errors.Is(err, client.ErrNamespaceNotFound) && create {
		_, err = c.CreateNamespace(ctx, client.Namespace{Name: ns, DefaultTTL: ttl, MaxTTL: max(ttl, 7*24*time.Hour)})
		if errors.Is(err, client.ErrNamespaceExists) {
			err = nil
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrNamespaceNotFound):
		return &opError{err: fmt.Errorf("namespace %q does not exist", ns), hint: fmt.Sprintf("create it with 'dedupnode namespace create %s', or pass --create-namespace", ns)}
	}
	// The shared explanation: a cluster that is down, a wrong address, TLS
	// or token trouble, each with its own hint.
	return explain(err, cf, ns)
}
