// Package metrics is dedupnode's Prometheus instrumentation. Each node owns
// one Metrics with its own registry (no global default registry, so several
// nodes can share a process). Every metric name starts with "dedup_".
//
// What is measured, and where it comes from:
//
//   - Requests: the gRPC interceptors (UnaryServerInterceptor,
//     StreamServerInterceptor) count every call by operation, gRPC code and
//     origin (client, or forwarded by another node), time it, and record
//     the batch size of unary dedup calls. Explicit
//     Observe* functions exist for callers outside gRPC.
//   - Items: per namespace, the result of every item of a client's call
//     (new, duplicate, seen, ...), and for each duplicate Mark or Claim the
//     time since the ID was first recorded (dedup_duplicate_age_seconds):
//     it tells a user how long a dedup window they really need. Calls a
//     follower forwarded to the leader are counted where the client called,
//     not again on the leader.
//   - Node figures (Raft, Bloom filters, storage, Pebble) are read from a
//     Source at scrape time, so they are never stale and cost nothing
//     between scrapes.
package metrics

import (
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Histogram buckets.
var (
	// LatencyBuckets are request durations in seconds: 0.5 ms .. ~8 s.
	LatencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 15)
	// BatchBuckets are items per request.
	BatchBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
	// DuplicateAgeBuckets are seconds since first sighting: 100 ms .. 30 days,
	// at the boundaries people choose dedup windows by.
	DuplicateAgeBuckets = []float64{
		0.1, 1, 10, 60, 5 * 60, 15 * 60, 3600, 4 * 3600, 12 * 3600,
		24 * 3600, 3 * 24 * 3600, 7 * 24 * 3600, 30 * 24 * 3600,
	}
)

// Options configures New.
type Options struct {
	// NodeID labels dedup_node_info.
	NodeID string
	// Version labels dedup_node_info.
	Version string
	// Region labels dedup_node_info ("" when the node has none).
	Region string
	// Source supplies node figures at scrape time; nil leaves them out.
	Source Source
	// NoRuntimeMetrics leaves out the Go runtime and process collectors.
	NoRuntimeMetrics bool
	// Now is the clock for duplicate ages and rates (default time.Now).
	Now func() time.Time
}

// Metrics holds one node's instruments and registry. Safe for concurrent
// use.
type Metrics struct {
	reg *prometheus.Registry
	now func() time.Time

	requests *prometheus.CounterVec   // op, code, origin
	latency  *prometheus.HistogramVec // op
	batch    *prometheus.HistogramVec // op
	items    *prometheus.CounterVec   // namespace, op, result
	dupAge   *prometheus.HistogramVec // namespace

	mu    sync.Mutex
	ops   map[string]*opTally
	ns    map[string]*nsTally
	rates []sample
}

type opTally struct{ total, errors uint64 }

type nsTally struct{ new, duplicate, conflict, inProgress uint64 }

// New creates a node's metrics and registers them in a fresh registry.
func New(o Options) *Metrics {
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		now: o.Now,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_requests_total",
			Help: "gRPC requests handled by this node, by operation, gRPC status code and origin (client, or forwarded by another node).",
		}, []string{"op", "code", "origin"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedup_request_duration_seconds",
			Help:    "Time to answer a gRPC request, in seconds, by operation (including forwarding to the leader and replication).",
			Buckets: LatencyBuckets,
		}, []string{"op"}),
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedup_batch_items",
			Help:    "Items (message IDs) per request, by operation.",
			Buckets: BatchBuckets,
		}, []string{"op"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_items_total",
			Help: "Item results answered to clients, by namespace, operation and result (new, duplicate, conflict, acquired, in_progress, seen, not_seen, ok, lease_lost). Duplicate rate: duplicate / (new + acquired + duplicate) over mark and claim.",
		}, []string{"namespace", "op", "result"}),
		dupAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedup_duplicate_age_seconds",
			Help:    "For each duplicate Mark or Claim, seconds since the ID was first recorded, by namespace: how long a dedup window the traffic really needs.",
			Buckets: DuplicateAgeBuckets,
		}, []string{"namespace"}),
		ops: map[string]*opTally{},
		ns:  map[string]*nsTally{},
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dedup_node_info",
		Help: "Always 1; labels name the node, its version and its region.",
	}, []string{"node_id", "version", "region"})
	info.WithLabelValues(o.NodeID, o.Version, o.Region).Set(1)
	m.reg.MustRegister(m.requests, m.latency, m.batch, m.items, m.dupAge, info)
	if o.Source != nil {
		m.reg.MustRegister(newNodeCollector(o.Source))
	}
	if !o.NoRuntimeMetrics {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Registry returns the node's registry (to register more collectors, or to
// gather in tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Origins of a request.
const (
	OriginClient    = "client"
	OriginForwarded = "forwarded"
)

// ObserveRequest records one request: its operation (e.g. "mark"), gRPC
// code name (e.g. "OK", "Unavailable"), origin (OriginClient or
// OriginForwarded), duration, and items (< 0: not a batch operation).
func (m *Metrics) ObserveRequest(op, code, origin string, d time.Duration, items int) {
	m.requests.WithLabelValues(op, code, origin).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
	if items >= 0 {
		m.batch.WithLabelValues(op).Observe(float64(items))
	}
	m.mu.Lock()
	t := m.ops[op]
	if t == nil {
		t = &opTally{}
		m.ops[op] = t
	}
	t.total++
	if code != "OK" {
		t.errors++
	}
	m.mu.Unlock()
}

// Item results, as they appear in the result label (the API's names).
const (
	ResultNew        = dedupv1.ResultNew
	ResultDuplicate  = dedupv1.ResultDuplicate
	ResultConflict   = dedupv1.ResultConflict
	ResultAcquired   = dedupv1.ResultAcquired
	ResultInProgress = dedupv1.ResultInProgress
)

// ObserveItems records n item results of one kind in a namespace ("" is
// "default").
func (m *Metrics) ObserveItems(namespace, op, result string, n int) {
	if n <= 0 {
		return
	}
	if namespace == "" {
		namespace = "default"
	}
	m.items.WithLabelValues(namespace, op, result).Add(float64(n))
	if op != "mark" && op != "claim" {
		return
	}
	m.mu.Lock()
	t := m.ns[namespace]
	if t == nil {
		t = &nsTally{}
		m.ns[namespace] = t
	}
	switch result {
	case ResultNew, ResultAcquired:
		t.new += uint64(n)
	case ResultDuplicate:
		t.duplicate += uint64(n)
	case ResultConflict:
		t.conflict += uint64(n)
	case ResultInProgress:
		t.inProgress += uint64(n)
	}
	m.mu.Unlock()
}

// ObserveDuplicate records one duplicate sighting of an ID first recorded
// at firstSeen (the record's first_seen).
func (m *Metrics) ObserveDuplicate(namespace string, firstSeen time.Time) {
	if namespace == "" {
		namespace = "default"
	}
	age := m.now().Sub(firstSeen).Seconds()
	m.dupAge.WithLabelValues(namespace).Observe(max(age, 0))
}

// ForgetNamespace drops a deleted namespace's series.
func (m *Metrics) ForgetNamespace(namespace string) {
	m.items.DeletePartialMatch(prometheus.Labels{"namespace": namespace})
	m.dupAge.DeletePartialMatch(prometheus.Labels{"namespace": namespace})
	m.mu.Lock()
	delete(m.ns, namespace)
	m.mu.Unlock()
}

// OpName turns a gRPC full method name ("/dedup.v1.Dedup/CreateNamespace")
// into an operation label ("create_namespace").
func OpName(fullMethod string) string {
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// NamespaceStats is one namespace's tallies since the node started.
type NamespaceStats struct {
	Name string
	// New counts first sightings (Mark NEW, Claim ACQUIRED); Duplicate
	// counts Mark and Claim DUPLICATE answers; Conflict, CONFLICT answers;
	// InProgress, Claims that found a live lease.
	New, Duplicate, Conflict, InProgress uint64
	// DuplicateRatio is Duplicate / (New + Duplicate), 0 with no traffic.
	DuplicateRatio float64
}

// Namespaces returns per-namespace tallies of client calls seen by this
// node, sorted by name.
func (m *Metrics) Namespaces() []NamespaceStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]NamespaceStats, 0, len(m.ns))
	for name, t := range m.ns {
		s := NamespaceStats{Name: name, New: t.new, Duplicate: t.duplicate, Conflict: t.conflict, InProgress: t.inProgress}
		if d := t.new + t.duplicate; d > 0 {
			s.DuplicateRatio = float64(t.duplicate) / float64(d)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
