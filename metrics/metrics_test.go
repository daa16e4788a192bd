package metrics

import (
	"context"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

func testSnapshot(t *testing.T) Snapshot {
	t.Helper()
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Set([]byte("k"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	return Snapshot{
		Raft: RaftStats{State: "follower", LeaderKnown: true, Term: 3, CommitIndex: 42, AppliedIndex: 41,
			LastLogIndex: 42, LastSnapshotIndex: 10, LastContact: 150 * time.Millisecond, Voters: 3},
		Bloom:   BloomStats{Filters: 2, MemoryBytes: 1 << 20, IDs: 1000, BitsPerID: 9.6, ConfiguredFPRate: 0.01, ObservedFPRate: 0.012, MaybeLookups: 50, FalsePositives: 3, Ready: true},
		Storage: StorageStats{IDsStored: 1000, Buckets: 4, Namespaces: 2, DiskBytes: 4096},
		Pebble:  db.Metrics(),
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExpositionHasEveryMetricAndLints(t *testing.T) {
	snap := testSnapshot(t)
	m := New(Options{NodeID: "n1", Version: "test", Source: SourceFunc(func() Snapshot { return snap })})
	m.Registry().MustRegister(CertExpiry("node", func() time.Time { return time.Unix(1_900_000_000, 0) }))
	m.ObserveRequest("mark", "OK", OriginClient, 3*time.Millisecond, 10)
	m.ObserveItems("orders", "mark", ResultDuplicate, 2)
	m.ObserveDuplicate("orders", time.Now().Add(-time.Hour))
	text := scrape(t, m)
	want := []string{
		`dedup_requests_total{code="OK",op="mark",origin="client"} 1`,
		`dedup_request_duration_seconds_bucket{op="mark",le="0.004"} 1`,
		`dedup_batch_items_bucket{op="mark",le="10"} 1`,
		`dedup_items_total{namespace="orders",op="mark",result="duplicate"} 2`,
		`dedup_duplicate_age_seconds_bucket{namespace="orders",le="3600"} 0`,
		`dedup_duplicate_age_seconds_bucket{namespace="orders",le="14400"} 1`,
		`dedup_node_info{node_id="n1",region="",version="test"} 1`,
		`dedup_raft_state{state="follower"} 1`,
		`dedup_raft_state{state="leader"} 0`,
		`dedup_raft_term 3`,
		`dedup_raft_commit_index 42`,
		`dedup_raft_applied_index 41`,
		`dedup_raft_last_contact_seconds 0.15`,
		`dedup_raft_voters 3`,
		`dedup_bloom_memory_bytes 1.048576e+06`,
		`dedup_bloom_observed_fp_rate 0.012`,
		`dedup_bloom_false_positives_total 3`,
		`dedup_storage_ids 1000`,
		`dedup_storage_disk_bytes 4096`,
		`dedup_pebble_disk_usage_bytes`,
		`dedup_pebble_read_amplification`,
		`dedup_pebble_compaction_debt_bytes`,
		`dedup_pebble_block_cache_hits_total`,
		`dedup_pebble_range_deletion_garbage_bytes`,
		`dedup_pebble_flush_written_bytes_total`,
		`dedup_pebble_compaction_read_bytes_total`,
		`dedup_pebble_compaction_written_bytes_total`,
		`dedup_pebble_wal_written_bytes_total`,
		`go_goroutines`,
		`dedup_tls_cert_expiry_timestamp_seconds{cert="node"} 1.9e+09`,
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("exposition lacks %q", w)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "go_") || strings.HasPrefix(line, "process_") ||
			strings.HasPrefix(line, "promhttp_") {
			continue
		}
		if !strings.HasPrefix(line, "dedup_") {
			t.Errorf("metric without the dedup_ prefix: %s", line)
		}
	}

	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ours []*dto.MetricFamily
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "dedup_") {
			ours = append(ours, mf)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric == "dedup_bloom_bits_per_id" {
			continue // a density (filter bits per stored ID), not a size: "bits" is the customary unit
		}
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestPebbleMetricsLeftOutWithoutPebble(t *testing.T) {
	m := New(Options{NoRuntimeMetrics: true, Source: SourceFunc(func() Snapshot {
		return Snapshot{Raft: RaftStats{State: "leader", LastContact: -1}}
	})})
	text := scrape(t, m)
	if strings.Contains(text, "dedup_pebble_") {
		t.Error("pebble metrics exported without a Pebble snapshot")
	}
	if strings.Contains(text, "dedup_raft_last_contact_seconds ") {
		t.Error("last contact exported although never contacted")
	}
	if !strings.Contains(text, `dedup_raft_state{state="leader"} 1`) {
		t.Error("raft state missing")
	}
	if strings.Contains(text, "go_goroutines") {
		t.Error("runtime metrics despite NoRuntimeMetrics")
	}
}

// fakeDedup answers Mark with one result per item: items whose ID starts
// with "dup" are DUPLICATE, first seen two minutes before now.
type fakeDedup struct {
	dedupv1.UnimplementedDedupServer
	now time.Time
}

func (f *fakeDedup) Mark(_ context.Context, r *dedupv1.MarkRequest) (*dedupv1.MarkResponse, error) {
	out := &dedupv1.MarkResponse{}
	for _, it := range r.Items {
		res := &dedupv1.MarkResult{Code: dedupv1.MarkResult_NEW, Record: &dedupv1.Record{FirstSeenUnixMs: f.now.UnixMilli()}}
		if strings.HasPrefix(string(it.Id), "dup") {
			res = &dedupv1.MarkResult{Code: dedupv1.MarkResult_DUPLICATE, Record: &dedupv1.Record{FirstSeenUnixMs: f.now.Add(-2 * time.Minute).UnixMilli()}}
		}
		out.Results = append(out.Results, res)
	}
	return out, nil
}

func TestInterceptorCountsRequestsItemsAndDuplicateAge(t *testing.T) {
	now := time.Now()
	m := New(Options{NoRuntimeMetrics: true, Now: func() time.Time { return now }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor()))
	dedupv1.RegisterDedupServer(srv, &fakeDedup{now: now})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dedupv1.NewDedupClient(cc)
	items := []*dedupv1.MarkItem{{Id: []byte("a")}, {Id: []byte("dup1")}, {Id: []byte("dup2")}, {Id: []byte("b")}}
	if _, err := c.Mark(ctx, &dedupv1.MarkRequest{Namespace: "orders", Items: items}); err != nil {
		t.Fatal(err)
	}
	// A forwarded call counts as a request but not again as items.
	fctx := metadata.AppendToOutgoingContext(ctx, ForwardedHeader, "n2")
	if _, err := c.Mark(fctx, &dedupv1.MarkRequest{Namespace: "orders", Items: items}); err != nil {
		t.Fatal(err)
	}
	// An unimplemented call counts with its code.
	if _, err := c.Check(ctx, &dedupv1.CheckRequest{Ids: [][]byte{[]byte("x")}}); err == nil {
		t.Fatal("Check on the fake succeeded")
	}
	text := scrape(t, m)
	for _, w := range []string{
		`dedup_requests_total{code="OK",op="mark",origin="client"} 1`,
		`dedup_requests_total{code="OK",op="mark",origin="forwarded"} 1`,
		`dedup_requests_total{code="Unimplemented",op="check",origin="client"} 1`,
		`dedup_items_total{namespace="orders",op="mark",result="new"} 2`,
		`dedup_items_total{namespace="orders",op="mark",result="duplicate"} 2`,
		`dedup_duplicate_age_seconds_bucket{namespace="orders",le="60"} 0`,
		`dedup_duplicate_age_seconds_bucket{namespace="orders",le="300"} 2`,
		`dedup_duplicate_age_seconds_sum{namespace="orders"} 240`,
		`dedup_batch_items_bucket{op="mark",le="2"} 0`,
		`dedup_batch_items_bucket{op="mark",le="5"} 2`,
	} {
		if !strings.Contains(text, w) {
			t.Errorf("exposition lacks %q", w)
		}
	}
	ns := m.Namespaces()
	if len(ns) != 1 || ns[0].Name != "orders" || ns[0].New != 2 || ns[0].Duplicate != 2 || ns[0].DuplicateRatio != 0.5 {
		t.Errorf("namespace stats %+v", ns)
	}
	m.ForgetNamespace("orders")
	if strings.Contains(scrape(t, m), `namespace="orders"`) {
		t.Error("forgotten namespace still exported")
	}
}

func TestRequestRates(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	m := New(Options{NoRuntimeMetrics: true, Now: clock})
	m.Sample()
	for range 100 {
		m.ObserveRequest("mark", "OK", OriginClient, time.Millisecond, 1)
	}
	for range 10 {
		m.ObserveRequest("mark", "Unavailable", OriginClient, time.Millisecond, 1)
	}
	advance(10 * time.Second)
	r := m.RequestRates()
	if len(r) != 1 || r[0].Op != "mark" || r[0].Total != 110 || r[0].PerSecond != 11 || r[0].ErrorsPerSecond != 1 {
		t.Fatalf("rates %+v", r)
	}
	// Old samples leave the window: with no new requests the rate drops to 0.
	for range 8 {
		advance(10 * time.Second)
		m.Sample()
	}
	r = m.RequestRates()
	if r[0].PerSecond != 0 || r[0].Total != 110 || r[0].Window > RateWindow {
		t.Fatalf("rates after the window %+v", r)
	}
}

func TestOpName(t *testing.T) {
	for in, want := range map[string]string{
		"/dedup.v1.Dedup/Mark":               "mark",
		"/dedup.v1.Admin/CreateNamespace":    "create_namespace",
		"/dedup.v1.Admin/TransferLeadership": "transfer_leadership",
		"/dedup.v1.Internal/ReadIndex":       "read_index",
	} {
		if got := OpName(in); got != want {
			t.Errorf("OpName(%q) = %q, want %q", in, got, want)
		}
	}
}

type fakeOps struct {
	dedupv1.UnimplementedOpsServer
}

func (fakeOps) Export(_ *dedupv1.ExportRequest, st grpc.ServerStreamingServer[dedupv1.ExportChunk]) error {
	return st.Send(&dedupv1.ExportChunk{Records: []*dedupv1.ExportedRecord{{Id: []byte("a")}}})
}

func TestStreamInterceptorCountsStreamingCalls(t *testing.T) {
	m := New(Options{NoRuntimeMetrics: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(m.StreamServerInterceptor()))
	dedupv1.RegisterOpsServer(srv, fakeOps{})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dedupv1.NewOpsClient(cc)
	drain := func(ctx context.Context, open func(context.Context) (interface{ RecvMsg(any) error }, error)) error {
		st, err := open(ctx)
		if err != nil {
			return err
		}
		for {
			if err := st.RecvMsg(&dedupv1.ExportChunk{}); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	export := func(ctx context.Context) (interface{ RecvMsg(any) error }, error) {
		return c.Export(ctx, &dedupv1.ExportRequest{Namespace: "orders"})
	}
	backup := func(ctx context.Context) (interface{ RecvMsg(any) error }, error) {
		return c.Backup(ctx, &dedupv1.BackupRequest{})
	}
	if err := drain(ctx, export); err != nil {
		t.Fatal(err)
	}
	if err := drain(metadata.AppendToOutgoingContext(ctx, ForwardedHeader, "n2"), export); err != nil {
		t.Fatal(err)
	}
	if err := drain(ctx, backup); err == nil {
		t.Fatal("Backup on the fake succeeded")
	}
	text := scrape(t, m)
	for _, w := range []string{
		`dedup_requests_total{code="OK",op="export",origin="client"} 1`,
		`dedup_requests_total{code="OK",op="export",origin="forwarded"} 1`,
		`dedup_requests_total{code="Unimplemented",op="backup",origin="client"} 1`,
		`dedup_request_duration_seconds_count{op="export"} 2`,
	} {
		if !strings.Contains(text, w) {
			t.Errorf("exposition lacks %q", w)
		}
	}
	if strings.Contains(text, `dedup_batch_items_bucket{op="export"`) {
		t.Error("a stream recorded a batch size")
	}
}

func checkResponse(seen, notSeen int) *dedupv1.CheckResponse {
	r := &dedupv1.CheckResponse{}
	for i, n := 0, seen+notSeen; i < n; i++ {
		code := dedupv1.CheckResult_NOT_SEEN
		if i%2 == 0 && seen > 0 {
			code, seen = dedupv1.CheckResult_SEEN, seen-1
		}
		r.Results = append(r.Results, &dedupv1.CheckResult{Code: code})
	}
	return r
}

func TestObserveResponseCountsCheckResultsByCode(t *testing.T) {
	m := New(Options{NoRuntimeMetrics: true})
	m.observeResponse("check", &dedupv1.CheckRequest{Namespace: "orders"}, checkResponse(6, 10))
	m.observeResponse("check", &dedupv1.CheckRequest{}, checkResponse(0, 3))
	text := scrape(t, m)
	for _, w := range []string{
		`dedup_items_total{namespace="orders",op="check",result="seen"} 6`,
		`dedup_items_total{namespace="orders",op="check",result="not_seen"} 10`,
		`dedup_items_total{namespace="default",op="check",result="not_seen"} 3`,
	} {
		if !strings.Contains(text, w) {
			t.Errorf("exposition lacks %q", w)
		}
	}
	if strings.Contains(text, `namespace="default",op="check",result="seen"`) {
		t.Error("a result code no item had was exported")
	}
}

// BenchmarkObserveCheckResponse: the metrics interceptor's work per
// answered Check of 16 IDs (go test ./metrics -run '^$' -bench
// ObserveCheck -benchmem).
func BenchmarkObserveCheckResponse(b *testing.B) {
	m := New(Options{NoRuntimeMetrics: true})
	req := &dedupv1.CheckRequest{Namespace: "bench"}
	resp := checkResponse(0, 16)
	b.ReportAllocs()
	for b.Loop() {
		m.observeResponse("check", req, resp)
	}
}
