// Package adminhttp is a node's HTTP admin listener (serve --admin-addr):
//
//	GET /             server-rendered HTML status page (no JavaScript)
//	GET /status.json  the same figures as JSON
//	GET /metrics      Prometheus exposition (package metrics)
//	GET /healthz      200 "ok" when the node can answer requests (it has a
//	                  leader and is caught up), else 503 with the reason
//	GET /livez        200 while the process serves HTTP at all
//
// The page is fed by a StatusSource the server implements; this package
// knows nothing of Raft or storage and is tested with a fake source.
package adminhttp

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Status is everything the status page shows about one node. Zero values
// are shown as "-" where they mean "unknown".
type Status struct {
	NodeID  string `json:"node_id"`
	Version string `json:"version,omitempty"`
	// Region is this node's region (serve --region); PreferredLeaderRegions
	// the cluster setting.
	Region                 string   `json:"region,omitempty"`
	PreferredLeaderRegions []string `json:"preferred_leader_regions,omitempty"`
	// State is the node's Raft state: leader, follower, candidate, shutdown.
	State          string `json:"state"`
	LeaderID       string `json:"leader_id"`
	LeaderGRPCAddr string `json:"leader_grpc_addr"`
	GRPCAddr       string `json:"grpc_addr"`
	RaftAddr       string `json:"raft_addr"`
	// Healthy is what /healthz answers; HealthReason says why not.
	Healthy      bool   `json:"healthy"`
	HealthReason string `json:"health_reason,omitempty"`

	Term              uint64 `json:"term"`
	CommitIndex       uint64 `json:"commit_index"`
	AppliedIndex      uint64 `json:"applied_index"`
	LastLogIndex      uint64 `json:"last_log_index"`
	LastSnapshotIndex uint64 `json:"last_snapshot_index"`
	// LastContact is the time since the leader was last heard from; 0 on
	// the leader, negative when never.
	LastContact time.Duration `json:"last_contact_ns"`

	Members    []Member      `json:"members"`
	Requests   []RequestRate `json:"requests"`
	Bloom      Bloom         `json:"bloom"`
	Storage    Storage       `json:"storage"`
	Disk       Disk          `json:"disk"`
	Namespaces []Namespace   `json:"namespaces"`

	StartedAt   time.Time `json:"started_at"`
	GeneratedAt time.Time `json:"generated_at"`
}

// Member is one node of the Raft configuration.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	GRPCAddr string `json:"grpc_addr"`
	// Suffrage is voter or nonvoter.
	Suffrage string `json:"suffrage"`
	// Region is the member's region as the node table records it;
	// Preferred says it is one of the preferred leader regions.
	Region    string `json:"region,omitempty"`
	Preferred bool   `json:"preferred,omitempty"`
	// Role is leader, follower, candidate, or "" when unknown.
	Role string `json:"role"`
	// AppliedIndex is the member's applied index when known; Lag is how
	// many entries it trails the leader's commit index (-1: unknown).
	AppliedIndex uint64 `json:"applied_index"`
	Lag          int64  `json:"lag"`
	// Error says why the member's figures are unknown (unreachable, ...).
	Error string `json:"error,omitempty"`
}

// RequestRate is one operation's recent traffic on this node.
type RequestRate struct {
	Op              string  `json:"op"`
	PerSecond       float64 `json:"per_second"`
	ErrorsPerSecond float64 `json:"errors_per_second"`
	Total           uint64  `json:"total"`
}

// Bloom are the node's Bloom filter figures.
type Bloom struct {
	Filters          uint64  `json:"filters"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	IDs              uint64  `json:"ids"`
	BitsPerID        float64 `json:"bits_per_id"`
	ConfiguredFPRate float64 `json:"configured_fp_rate"`
	ObservedFPRate   float64 `json:"observed_fp_rate"`
	Ready            bool    `json:"ready"`
}

// Storage are the state machine's figures.
type Storage struct {
	IDsStored uint64 `json:"ids_stored"`
	Buckets   uint64 `json:"buckets"`
	// DiskBytes is what the data directory's files occupy on disk
	// (allocated blocks); ReadAmp is Pebble's read amplification;
	// CompactionDebtBytes its estimated compaction debt.
	DiskBytes           uint64 `json:"disk_bytes"`
	ReadAmp             int    `json:"read_amp"`
	CompactionDebtBytes uint64 `json:"compaction_debt_bytes"`
}

// Disk is the data directory's filesystem and what the node's files
// occupy on it.
type Disk struct {
	Dir        string `json:"data_dir"`
	FreeBytes  uint64 `json:"free_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// Below MinFreeBytes the node refuses client writes; below
	// ReserveBytes it pauses applying the log.
	MinFreeBytes  uint64 `json:"min_free_bytes"`
	ReserveBytes  uint64 `json:"reserve_bytes"`
	WritesRefused bool   `json:"writes_refused"`
	ApplyPaused   bool   `json:"apply_paused"`
	// LogStoreStalled: a Raft log write has run past its stall limit.
	LogStoreStalled bool `json:"log_store_stalled"`
	// UsedBytes is what the node's files occupy (allocated blocks) by part:
	// fsm (Pebble), raft (log and stable store), snapshots.
	UsedBytes map[string]int64 `json:"used_bytes,omitempty"`
}

// Namespace is one namespace's settings and traffic seen by this node.
type Namespace struct {
	Name       string        `json:"name"`
	DefaultTTL time.Duration `json:"default_ttl_ns"`
	MaxTTL     time.Duration `json:"max_ttl_ns"`
	Mode       string        `json:"mode"`
	// New and Duplicates count Mark/Claim first sightings and duplicates
	// since the node started; DuplicateRatio = Duplicates/(New+Duplicates).
	New            uint64  `json:"new"`
	Duplicates     uint64  `json:"duplicates"`
	Conflicts      uint64  `json:"conflicts"`
	DuplicateRatio float64 `json:"duplicate_ratio"`
}

// StatusSource supplies the status page. Status may do bounded network
// calls (for example asking members for their applied index); it must
// respect ctx.
type StatusSource interface {
	Status(ctx context.Context) (Status, error)
}

// StatusFunc adapts a function to StatusSource.
type StatusFunc func(ctx context.Context) (Status, error)

// Status calls f.
func (f StatusFunc) Status(ctx context.Context) (Status, error) { return f(ctx) }

// Config configures the admin listener.
type Config struct {
	// Addr is the bind address (port 0 picks one). Ignored with Listener.
	Addr     string
	Listener net.Listener
	// Status feeds / and /status.json (required).
	Status StatusSource
	// Metrics serves /metrics; nil answers 404.
	Metrics http.Handler
	// Health answers /healthz: nil error means healthy. Nil: derived from
	// Status().Healthy.
	Health func(ctx context.Context) error
	// StatusTimeout bounds one Status call (default 3 s).
	StatusTimeout time.Duration
	// Refresh is the status page's auto-refresh period (default 10 s;
	// negative turns it off).
	Refresh time.Duration
	Logger  *slog.Logger
}

//go:embed status.html.tmpl
var templates embed.FS

var pageTmpl = template.Must(template.New("status.html.tmpl").Funcs(template.FuncMap{
	"bytes":    humanBytes,
	"dur":      humanDuration,
	"pct":      func(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) },
	"rate":     func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"count":    humanCount,
	"title":    func(s string) string { return strings.ToUpper(s[:min(1, len(s))]) + s[min(1, len(s)):] },
	"lag":      func(l int64) string { return map[bool]string{true: "-", false: fmt.Sprint(l)}[l < 0] },
	"seconds":  func(d time.Duration) int { return int(d.Seconds()) },
	"highDups": func(r float64) bool { return r >= 0.5 },
}).ParseFS(templates, "status.html.tmpl"))

// Handler returns the admin mux for cfg.
func Handler(cfg Config) http.Handler {
	if cfg.StatusTimeout <= 0 {
		cfg.StatusTimeout = 3 * time.Second
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("GET /status.json", h.json)
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	return mux
}

type handler struct{ cfg Config }

func (h *handler) status(r *http.Request) (Status, error) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.StatusTimeout)
	defer cancel()
	st, err := h.cfg.Status.Status(ctx)
	if st.GeneratedAt.IsZero() {
		st.GeneratedAt = time.Now()
	}
	return st, err
}

type pageData struct {
	Status
	Err     string
	Refresh time.Duration
	Uptime  time.Duration
}

func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	st, err := h.status(r)
	d := pageData{Status: st, Refresh: h.cfg.Refresh}
	if err != nil {
		d.Err = err.Error()
	}
	if !st.StartedAt.IsZero() {
		d.Uptime = st.GeneratedAt.Sub(st.StartedAt)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	var buf strings.Builder
	if err := pageTmpl.Execute(&buf, d); err != nil {
		h.cfg.Logger.Error("render status page", "err", err)
		http.Error(w, "render status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprint(w, buf.String())
}

func (h *handler) json(w http.ResponseWriter, r *http.Request) {
	st, err := h.status(r)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(st)
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.StatusTimeout)
	defer cancel()
	var err error
	if h.cfg.Health != nil {
		err = h.cfg.Health(ctx)
	} else {
		var st Status
		if st, err = h.cfg.Status.Status(ctx); err == nil && !st.Healthy {
			err = errors.New(st.HealthReason)
			if st.HealthReason == "" {
				err = errors.New("not healthy")
			}
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready:", err)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Server is a running admin listener.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	err  error
	once sync.Once
}

// Start listens and serves Handler(cfg) in the background.
func Start(cfg Config) (*Server, error) {
	if cfg.Status == nil {
		return nil, errors.New("admin listener needs a status source")
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("listen for admin HTTP on %s: %w", cfg.Addr, err)
		}
	}
	s := &Server{
		srv: &http.Server{
			Handler:           Handler(cfg),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
		},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close shuts the listener down gracefully within ctx, then forcibly.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		if err = s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
		<-s.done
		err = errors.Join(err, s.err)
	})
	return err
}

func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func humanCount(n uint64) string {
	switch {
	case n >= 10_000_000_000:
		return fmt.Sprintf("%.1fG", float64(n)/1e9)
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 100_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "never"
	case d == 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 48*time.Hour:
		return trimZeroUnits(d.Round(time.Second).String())
	}
	days, rest := int(d/(24*time.Hour)), (d % (24 * time.Hour)).Round(time.Hour)
	if rest == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, int(rest.Hours()))
}

// trimZeroUnits turns "24h0m0s" into "24h" and "1h30m0s" into "1h30m".
func trimZeroUnits(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
