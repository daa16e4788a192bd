// Package webhook deduplicates incoming webhooks with dedupnode: an HTTP
// middleware for net/http, and a ready reverse proxy to put in front of a
// webhook endpoint that cannot deduplicate by itself (`dedupnode
// webhook-proxy`).
//
// Webhook senders (payment providers, SaaS platforms, CI systems) deliver
// at least once: they retry on timeouts and non-2xx answers, sometimes
// while the first attempt is still being handled. Per event ID:
//
//   - a request whose signature fails verification (Config.Verify: GitHub,
//     Stripe or a generic HMAC header) gets 401 and marks nothing;
//   - the first delivery goes to the handler (upstream); a 2xx answer
//     commits the ID, any other answer or a panic releases it so the
//     sender's retry can succeed;
//   - a handler slower than Config.Timeout: the sender gets 504 (with
//     "Dedupnode-Status: in-progress") but the delivery goes on, holding
//     its lease (renewed) until the handler answers — then it is committed
//     or released — or until Config.MaxUpstream, when the handler's context
//     ends and the ID is released. The claim is never released while the
//     handler may still be working on the event;
//   - a delivery of an ID already handled gets 200 at once, without
//     reaching the handler, with the header "Dedupnode-Status: duplicate";
//   - a delivery that arrives while the first is still in flight gets 409
//     Conflict with Retry-After and "Dedupnode-Status: in-progress".
//     Retry-After is the time until the earliest moment the ID may be free:
//     the first delivery's Timeout while it has not passed, else its
//     lease's current expiry (when the ID frees if its holder stops
//     renewing), but never past its MaxUpstream when this handler holds it;
//     at least 1 s.
//
// Why 409 and not 425 Too Early: 425 (RFC 8470) means "I will not risk
// processing a request sent in TLS early data, which may be replayed"; HTTP
// clients and proxies that know it retry at once after the handshake,
// ignoring Retry-After, and it describes the wrong condition. 409 says
// what is true — the request conflicts with the current state of the event
// (being processed) — and every webhook sender that retries on failure
// retries it, honouring Retry-After where supported. A sender that treats
// 4xx as final loses nothing either: the first, in-flight delivery still
// answers with the real outcome, and if it fails that sender retries it.
//
// A request without a usable event ID — none, or an ambiguous one such as
// an ID header repeated with different values — gets 400 with
// "Dedupnode-Status: no-id" and reaches neither dedupnode nor the handler.
//
// Every answer carries "Dedupnode-Status": processed, duplicate,
// in-progress, failed, conflict, lease-lost, unavailable, no-id or
// bad-signature.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/msgid"
)

// StatusHeader is the response header naming what the dedup layer did.
const StatusHeader = "Dedupnode-Status"

// IDFunc returns the event ID of a request whose body has been read.
type IDFunc func(r *http.Request, body []byte) ([]byte, error)

// ErrAmbiguousID means a request names more than one event ID, e.g. by
// repeating the ID header with different values.
var ErrAmbiguousID = errors.New("ambiguous event ID")

// HeaderID takes the event ID from a request header (e.g.
// "X-GitHub-Delivery", "Webhook-Id", "Idempotency-Key"). A request that
// repeats the header with different values is refused (ErrAmbiguousID,
// naming the header): the dedup layer and the handler behind it could each
// take another of the values for the event's ID, and a later delivery
// under the other value would be handled again. A header repeated with one
// value is that value.
func HeaderID(name string) IDFunc {
	return func(r *http.Request, _ []byte) ([]byte, error) {
		vals := r.Header.Values(name)
		for _, v := range vals {
			if v != vals[0] {
				return nil, fmt.Errorf("%w: header %s is repeated with different values (%d values); a request must carry one event ID", ErrAmbiguousID, name, len(vals))
			}
		}
		if len(vals) == 0 || vals[0] == "" {
			return nil, fmt.Errorf("%w: no %s header", msgid.ErrNoID, name)
		}
		return []byte(vals[0]), nil
	}
}

// JSONFieldID takes the event ID from a field of the JSON body, e.g. "id"
// or "data.event_id" (see msgid.JSONField).
func JSONFieldID(path string) IDFunc {
	return func(_ *http.Request, body []byte) ([]byte, error) { return msgid.JSONField(body, path) }
}

// ContentID derives the event ID from the body (hex SHA-256): identical
// bodies are the same event.
func ContentID() IDFunc {
	return func(_ *http.Request, body []byte) ([]byte, error) { return msgid.Content(body), nil }
}

// Config configures the middleware.
type Config struct {
	// Processor is a *client.Batcher (concurrent webhooks share RPCs) or a
	// *client.Client. Required.
	Processor client.Processor
	// Namespace is the dedupnode namespace. Required.
	Namespace string
	// ID extracts the event ID. Required.
	ID IDFunc
	// Methods are the request methods deduplicated (default POST only);
	// others pass through untouched.
	Methods []string
	// MaxBodyBytes bounds the body read to find the ID and to forward
	// (default 1 MiB); a larger body gets 413.
	MaxBodyBytes int64
	// DigestBody sends the body's SHA-256 with the claim, so that an event
	// ID reused for another body answers 422 (conflict) instead of 200
	// (duplicate).
	DigestBody bool
	// Verify, if set, checks each request's signature first: a request
	// that fails gets 401 and nothing is marked (GitHubSignature,
	// StripeSignature, NewHMACSignature).
	Verify Verifier
	// Timeout is how long the sender waits for the handler's answer (0:
	// until it answers, up to MaxUpstream). Past it the sender gets 504
	// with "Dedupnode-Status: in-progress" while the delivery goes on: the
	// handler's context does not end, the lease is renewed, and its answer
	// commits or releases the ID as usual.
	Timeout time.Duration
	// MaxUpstream is the hard limit on one delivery (default
	// DefaultMaxUpstream, at least Timeout): then the handler's context
	// ends and the ID is released, so that a retry can deliver it again.
	MaxUpstream time.Duration
	// ProcessOptions are passed to every Process call (lease, TTL).
	ProcessOptions []client.ProcessOption
	// Logger receives one line per deduplicated request at DEBUG and
	// dedupnode errors at WARN (default: discarded).
	Logger *slog.Logger
}

func (cfg *Config) check() error {
	var errs []error
	if cfg.Processor == nil {
		errs = append(errs, errors.New("Processor is required"))
	}
	if cfg.Namespace == "" {
		errs = append(errs, errors.New("Namespace is required"))
	}
	if cfg.ID == nil {
		errs = append(errs, errors.New("ID is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost}
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout < 0 || cfg.MaxUpstream < 0 {
		return fmt.Errorf("webhook: negative Timeout %v or MaxUpstream %v", cfg.Timeout, cfg.MaxUpstream)
	}
	if cfg.MaxUpstream == 0 {
		cfg.MaxUpstream = max(DefaultMaxUpstream, cfg.Timeout)
	}
	if cfg.MaxUpstream < cfg.Timeout {
		return fmt.Errorf("webhook: MaxUpstream %v is shorter than Timeout %v", cfg.MaxUpstream, cfg.Timeout)
	}
	return nil
}

// DefaultMaxUpstream is Config.MaxUpstream's default.
const DefaultMaxUpstream = 5 * time.Minute

// Middleware returns net/http middleware deduplicating requests per event
// ID (see the package doc for the answers). The wrapped handler's answer is
// buffered until its outcome is recorded, then sent. Deliveries that
// outlive their request (Config.Timeout) go on in the background; use
// NewHandler to be able to wait for them at shutdown.
func Middleware(cfg Config) (func(http.Handler) http.Handler, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return newHandler(cfg, next)
	}, nil
}

// NewHandler returns next behind the dedup middleware, as a Handler whose
// Wait lets a server's shutdown wait for deliveries still in flight.
func NewHandler(next http.Handler, cfg Config) (*Handler, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return newHandler(cfg, next), nil
}

func newHandler(cfg Config, next http.Handler) *Handler {
	return &Handler{cfg: cfg, next: next, inflight: map[string]*flight{}}
}

// Handler is the dedup middleware around one handler.
type Handler struct {
	cfg  Config
	next http.Handler

	mu       sync.Mutex
	inflight map[string]*flight // by event ID: deliveries this handler holds
	wg       sync.WaitGroup
}

// flight is a delivery whose handler is running.
type flight struct {
	soft, hard time.Time // Timeout and MaxUpstream deadlines (soft zero: none)
}

// Wait blocks until every delivery in flight (including those whose
// sender already got 504) has been committed or released, or ctx ends.
func (h *Handler) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("webhook: deliveries still in flight: %w", ctx.Err())
	}
}

// errStatus is fn's error for a non-2xx answer: the claim is released.
type errStatus struct{ code int }

func (e errStatus) Error() string { return fmt.Sprintf("handler answered %d", e.code) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(h.cfg.Methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, h.cfg.MaxBodyBytes+1))
	r.Body.Close()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, "failed", map[string]any{"error": "read body: " + err.Error()})
		return
	}
	if int64(len(body)) > h.cfg.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, "failed", map[string]any{"error": fmt.Sprintf("body exceeds %d bytes", h.cfg.MaxBodyBytes)})
		return
	}
	if h.cfg.Verify != nil {
		if err := h.cfg.Verify.Verify(r.Header, body, time.Now()); err != nil {
			h.cfg.Logger.Warn("webhook signature rejected", "err", err, "remote", r.RemoteAddr)
			writeJSON(w, http.StatusUnauthorized, "bad-signature", map[string]any{"error": err.Error()})
			return
		}
	}
	id, err := h.cfg.ID(r, body)
	if err == nil && len(id) == 0 {
		err = msgid.ErrNoID
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, "no-id", map[string]any{"error": "event ID: " + err.Error()})
		return
	}
	opts := h.cfg.ProcessOptions
	if h.cfg.DigestBody {
		opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(body)))
	}

	// The delivery runs on its own goroutine, detached from the request:
	// when the sender stops waiting (Timeout, or it hangs up) the handler
	// goes on under its lease, and its answer still commits or releases.
	key := string(id)
	rec := &recorder{header: http.Header{}}
	started, done := make(chan struct{}), make(chan struct{})
	var (
		res      client.ProcessResult
		perr     error
		panicked any
	)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.MaxUpstream)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(done)
		defer cancel()
		var fl *flight
		defer func() {
			if fl != nil {
				h.mu.Lock()
				if h.inflight[key] == fl {
					delete(h.inflight, key)
				}
				h.mu.Unlock()
			}
			if p := recover(); p != nil {
				panicked = p // Process released the lease
			}
		}()
		res, perr = h.cfg.Processor.Process(dctx, h.cfg.Namespace, id, func(ctx context.Context) error {
			now := time.Now()
			fl = &flight{hard: now.Add(h.cfg.MaxUpstream)}
			if h.cfg.Timeout > 0 {
				fl.soft = now.Add(h.cfg.Timeout)
			}
			h.mu.Lock()
			h.inflight[key] = fl
			h.mu.Unlock()
			close(started)
			req := r.Clone(ctx)
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			h.next.ServeHTTP(rec, req)
			if rec.code == 0 {
				rec.code = http.StatusOK
			}
			if rec.code < 200 || rec.code > 299 {
				return errStatus{rec.code}
			}
			return nil
		}, opts...)
	}()

	select {
	case <-done:
	case <-r.Context().Done():
		return // the sender hung up; the delivery goes on
	case <-started:
		var soft <-chan time.Time
		if h.cfg.Timeout > 0 {
			t := time.NewTimer(h.cfg.Timeout)
			defer t.Stop()
			soft = t.C
		}
		select {
		case <-done:
		case <-r.Context().Done():
			return
		case <-soft:
			h.cfg.Logger.Warn("webhook upstream slower than the timeout; holding the event until it answers", "id", key,
				"timeout", h.cfg.Timeout, "max_wait", h.cfg.MaxUpstream)
			w.Header().Set("Retry-After", strconv.Itoa(h.retryAfter(key, nil)))
			writeJSON(w, http.StatusGatewayTimeout, "in-progress", map[string]any{"id": key,
				"error": fmt.Sprintf("the upstream has not answered within %v; the delivery goes on and holds the event until it answers (at most %v); retry later", h.cfg.Timeout, h.cfg.MaxUpstream)})
			return
		}
	}
	if panicked != nil {
		panic(panicked)
	}
	log := h.cfg.Logger.With("id", key, "outcome", res.Outcome.String())

	switch res.Outcome {
	case client.OutcomeProcessed:
		log.Debug("webhook processed", "status", rec.code)
		rec.send(w, "processed")
	case client.OutcomeDuplicate:
		log.Debug("webhook duplicate")
		fields := map[string]any{"id": key}
		if res.Record != nil {
			fields["first_seen"] = res.Record.FirstSeen
		}
		writeJSON(w, http.StatusOK, "duplicate", fields)
	case client.OutcomeInProgress:
		w.Header().Set("Retry-After", strconv.Itoa(h.retryAfter(key, res.Record)))
		writeJSON(w, http.StatusConflict, "in-progress", map[string]any{"id": key, "error": "this event is being processed by an earlier delivery; retry later"})
	case client.OutcomeConflict:
		writeJSON(w, http.StatusUnprocessableEntity, "conflict", map[string]any{"id": key, "error": "this event ID was already delivered with another body"})
	case client.OutcomeFailed:
		log.Debug("webhook failed", "status", rec.code, "err", perr)
		if rec.code == 0 {
			rec.code = http.StatusBadGateway
		}
		rec.send(w, "failed")
	case client.OutcomeLeaseLost:
		log.Warn("webhook handled but its claim was lost before the commit; another delivery may handle it again", "err", perr)
		rec.send(w, "lease-lost")
	default: // OutcomeError
		if res.Ran {
			// The handler ran; only the commit's outcome is unknown. Its
			// answer stands (a retry will find the commit, or claim again
			// once the lease expires).
			log.Warn("webhook handled, commit outcome unknown", "err", perr)
			rec.send(w, "processed")
			return
		}
		log.Warn("dedupnode unavailable", "err", perr)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, "unavailable", map[string]any{"error": "deduplication store unavailable; retry later"})
	}
}

// retryAfter is the Retry-After (whole seconds, at least 1) for a delivery
// of id that finds it in flight: the time until the earliest moment it may
// be free. For a delivery this handler holds, that is its Timeout while it
// has not passed (the sender's wait, within which the handler usually
// answers), else the lease's current expiry, and never past its
// MaxUpstream; for one held elsewhere, the lease's expiry (rec).
func (h *Handler) retryAfter(id string, rec *client.Record) int {
	now := time.Now()
	var until time.Time
	if rec != nil {
		until = rec.Expires
	}
	h.mu.Lock()
	fl := h.inflight[id]
	h.mu.Unlock()
	if fl != nil {
		end := fl.hard
		if !fl.soft.IsZero() && now.Before(fl.soft) {
			end = fl.soft
		}
		if until.IsZero() || end.Before(until) {
			until = end
		}
	}
	if until.IsZero() {
		return 1
	}
	return max(1, int(math.Ceil(until.Sub(now).Seconds())))
}

// recorder buffers the wrapped handler's answer.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *recorder) send(w http.ResponseWriter, status string) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.Header().Set(StatusHeader, status)
	w.Header().Del("Content-Length")
	w.WriteHeader(r.code)
	_, _ = w.Write(r.body.Bytes())
}

func writeJSON(w http.ResponseWriter, code int, status string, fields map[string]any) {
	fields["status"] = status
	w.Header().Set(StatusHeader, status)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(fields)
}

// NewProxy returns a reverse proxy to upstream (scheme://host[:port][/base
// path]) behind the dedup middleware: the ready webhook-proxy. Requests
// keep their path and query, appended to upstream's path. An upstream that
// cannot be reached answers 502 and releases the claim so the sender's
// retry can succeed; one slower than cfg.Timeout keeps the claim until it
// answers or cfg.MaxUpstream passes (then 504, released).
func NewProxy(upstream *url.URL, cfg Config) (*Handler, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("webhook: upstream %v: want an absolute URL such as http://127.0.0.1:8080", upstream)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			code := http.StatusBadGateway
			if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				code = http.StatusGatewayTimeout
			}
			cfg.Logger.Warn("webhook upstream", "err", err, "status", code)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(code)
			fmt.Fprintf(w, "upstream: %v\n", err)
		},
	}
	return newHandler(cfg, rp), nil
}
