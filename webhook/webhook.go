// Package webhook deduplicates incoming webhooks with dedupnode: an HTTP
// middleware for net/http, and a ready reverse proxy to put in front of a
// webhook endpoint that cannot deduplicate by itself (`dedupnode
// webhook-proxy`).
//
// Webhook senders (payment providers, SaaS platforms, CI systems) deliver
// at least once: they retry on timeouts and non-2xx answers, sometimes
// while the first attempt is still being handled. Per event ID:
//
//   - the first delivery goes to the handler (upstream); a 2xx answer
//     commits the ID, any other answer, a timeout or a panic releases it so
//     the sender's retry can succeed;
//   - a delivery of an ID already handled gets 200 at once, without
//     reaching the handler, with the header "Dedupnode-Status: duplicate";
//   - a delivery that arrives while the first is still in flight gets 409
//     Conflict with Retry-After (seconds until the first one's lease
//     expires) and "Dedupnode-Status: in-progress".
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
// Every answer carries "Dedupnode-Status": processed, duplicate,
// in-progress, failed, conflict, lease-lost, unavailable or no-id.
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
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/integrations/msgid"
)

// StatusHeader is the response header naming what the dedup layer did.
const StatusHeader = "Dedupnode-Status"

// IDFunc returns the event ID of a request whose body has been read.
type IDFunc func(r *http.Request, body []byte) ([]byte, error)

// HeaderID takes the event ID from a request header (e.g.
// "X-GitHub-Delivery", "Webhook-Id", "Idempotency-Key").
func HeaderID(name string) IDFunc {
	return func(r *http.Request, _ []byte) ([]byte, error) {
		if v := r.Header.Get(name); v != "" {
			return []byte(v), nil
		}
		return nil, fmt.Errorf("%w: no %s header", msgid.ErrNoID, name)
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
	// Timeout bounds the handler's run (0: the request's own context
	// only). The handler's context ends then; the proxy answers 504.
	Timeout time.Duration
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
	return nil
}

// Middleware returns net/http middleware deduplicating requests per event
// ID (see the package doc for the answers). The wrapped handler's answer is
// buffered until its outcome is recorded, then sent.
func Middleware(cfg Config) (func(http.Handler) http.Handler, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &handler{cfg: cfg, next: next}
	}, nil
}

type handler struct {
	cfg  Config
	next http.Handler
}

// errStatus is fn's error for a non-2xx answer: the claim is released.
type errStatus struct{ code int }

func (e errStatus) Error() string { return fmt.Sprintf("handler answered %d", e.code) }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	id, err := h.cfg.ID(r, body)
	if err == nil && len(id) == 0 {
		err = msgid.ErrNoID
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, "no-id", map[string]any{"error": "no event ID: " + err.Error()})
		return
	}
	opts := h.cfg.ProcessOptions
	if h.cfg.DigestBody {
		opts = append(opts[:len(opts):len(opts)], client.WithDigest(client.Digest(body)))
	}

	rec := &recorder{header: http.Header{}}
	res, perr := h.cfg.Processor.Process(r.Context(), h.cfg.Namespace, id, func(ctx context.Context) error {
		if h.cfg.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, h.cfg.Timeout)
			defer cancel()
		}
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
	log := h.cfg.Logger.With("id", string(id), "outcome", res.Outcome.String())

	switch res.Outcome {
	case client.OutcomeProcessed:
		log.Debug("webhook processed", "status", rec.code)
		rec.send(w, "processed")
	case client.OutcomeDuplicate:
		log.Debug("webhook duplicate")
		fields := map[string]any{"id": string(id)}
		if res.Record != nil {
			fields["first_seen"] = res.Record.FirstSeen
		}
		writeJSON(w, http.StatusOK, "duplicate", fields)
	case client.OutcomeInProgress:
		retry := 1
		if res.Record != nil {
			retry = max(1, int(math.Ceil(time.Until(res.Record.Expires).Seconds())))
		}
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		writeJSON(w, http.StatusConflict, "in-progress", map[string]any{"id": string(id), "error": "this event is being processed by an earlier delivery; retry later"})
	case client.OutcomeConflict:
		writeJSON(w, http.StatusUnprocessableEntity, "conflict", map[string]any{"id": string(id), "error": "this event ID was already delivered with another body"})
	case client.OutcomeFailed:
		log.Debug("webhook failed", "status", rec.code, "err", perr)
		if rec.code == 0 { // panicked before answering: not reached (re-panicked)
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
// cannot be reached answers 502, one that exceeds cfg.Timeout 504; both
// release the claim so the sender's retry can succeed.
func NewProxy(upstream *url.URL, cfg Config) (http.Handler, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("webhook: upstream %v: want an absolute URL such as http://127.0.0.1:8080", upstream)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	mw, err := Middleware(cfg)
	if err != nil {
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
	return mw(rp), nil
}
