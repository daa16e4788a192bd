package adminhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sampleStatus() Status {
	now := time.Now()
	return Status{
		NodeID: "n1", Version: "test", State: "leader", LeaderID: "n1", LeaderGRPCAddr: "127.0.0.1:7071",
		GRPCAddr: "127.0.0.1:7071", RaftAddr: "127.0.0.1:7001", Healthy: true,
		Term: 4, CommitIndex: 1234, AppliedIndex: 1233, LastLogIndex: 1234, LastSnapshotIndex: 1024,
		Members: []Member{
			{ID: "n1", RaftAddr: "127.0.0.1:7001", GRPCAddr: "127.0.0.1:7071", Suffrage: "voter", Role: "leader", AppliedIndex: 1233, Lag: 1},
			{ID: "n2", RaftAddr: "127.0.0.1:7002", GRPCAddr: "127.0.0.1:7072", Suffrage: "voter", Role: "follower", AppliedIndex: 1200, Lag: 34},
			{ID: "n3", RaftAddr: "127.0.0.1:7003", GRPCAddr: "127.0.0.1:7073", Suffrage: "nonvoter", Lag: -1, Error: "connection refused"},
		},
		Requests: []RequestRate{{Op: "check", PerSecond: 120.5, Total: 9000}, {Op: "mark", PerSecond: 812.25, ErrorsPerSecond: 0.5, Total: 50000}},
		Bloom:    Bloom{Filters: 3, MemoryBytes: 3 << 20, IDs: 250000, BitsPerID: 9.6, ConfiguredFPRate: 0.01, ObservedFPRate: 0.0123, Ready: true},
		Storage:  Storage{IDsStored: 250000, Buckets: 12, DiskBytes: 40 << 20, ReadAmp: 3, CompactionDebtBytes: 1 << 20},
		Namespaces: []Namespace{
			{Name: "orders", DefaultTTL: 24 * time.Hour, MaxTTL: 7 * 24 * time.Hour, Mode: "fixed", New: 900, Duplicates: 100, DuplicateRatio: 0.1},
			{Name: "<script>alert(1)</script>", DefaultTTL: time.Hour, MaxTTL: time.Hour, Mode: "sliding", New: 1, Duplicates: 3, DuplicateRatio: 0.75},
		},
		StartedAt:   now.Add(-90 * time.Minute),
		GeneratedAt: now,
	}
}

type fakeSource struct {
	st  Status
	err error
}

func (f *fakeSource) Status(context.Context) (Status, error) { return f.st, f.err }

func start(t *testing.T, cfg Config) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return "http://" + s.Addr()
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestStatusPageRenders(t *testing.T) {
	src := &fakeSource{st: sampleStatus()}
	base := start(t, Config{Status: src, Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "dedup_requests_total 1")
	})})
	code, body, hdr := get(t, base+"/")
	if code != 200 {
		t.Fatalf("status page: %d\n%s", code, body)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("content type %q", ct)
	}
	for _, want := range []string{
		`<code>n1</code>`, `id="state">leader<`, `id="health">serving<`, `id="term">4<`,
		`id="commit-index">1234<`, `id="applied-index">1233<`,
		`<code>n2</code>`, `>34<`, `nonvoter`, `unreachable`, `title="connection refused"`,
		`812.2/s`, `50000`, `<code>orders</code>`, `10.00%`, `75.00%`,
		`id="bloom-memory">3.0 MiB<`, `id="bloom-observed">1.23%<`, `id="disk">40.0 MiB<`,
		`id="ids-stored">250.0k<`, `>24h<`, `>7d<`, `up 1h30m`, `http-equiv="refresh" content="10"`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script>") {
		t.Error("namespace name not escaped")
	}

	code, body, _ = get(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, "dedup_requests_total") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	code, body, _ = get(t, base+"/status.json")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 {
		t.Fatalf("/status.json: %d %v\n%s", code, err, body)
	}
	if st.NodeID != "n1" || len(st.Members) != 3 || st.Members[1].Lag != 34 || st.Namespaces[0].DuplicateRatio != 0.1 {
		t.Errorf("/status.json decoded to %+v", st)
	}
	if code, _, _ := get(t, base+"/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}
}

func TestHealthz(t *testing.T) {
	src := &fakeSource{st: sampleStatus()}
	base := start(t, Config{Status: src})
	if code, body, _ := get(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("healthy: %d %q", code, body)
	}
	src.st.Healthy = false
	src.st.HealthReason = "no leader"
	if code, body, _ := get(t, base+"/healthz"); code != 503 || !strings.Contains(body, "no leader") {
		t.Errorf("unhealthy: %d %q", code, body)
	}
	if code, _, _ := get(t, base+"/livez"); code != 200 {
		t.Errorf("/livez: %d", code)
	}
	if code, _, _ := get(t, base+"/metrics"); code != 404 {
		t.Errorf("/metrics without a handler: %d", code)
	}

	explicit := start(t, Config{Status: src, Health: func(context.Context) error { return errors.New("catching up") }})
	if code, body, _ := get(t, explicit+"/healthz"); code != 503 || !strings.Contains(body, "catching up") {
		t.Errorf("explicit health: %d %q", code, body)
	}
}

func TestStatusPageWithSourceError(t *testing.T) {
	src := &fakeSource{st: Status{NodeID: "n9", State: "candidate", LastContact: -1}, err: errors.New("raft is shutting down")}
	base := start(t, Config{Status: src, Refresh: -1})
	code, body, _ := get(t, base+"/")
	if code != 503 {
		t.Errorf("code %d", code)
	}
	for _, want := range []string{"Status unavailable: raft is shutting down", "none known", "No Raft configuration yet.", "No requests yet.", "No namespaces."} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, "http-equiv=\"refresh\"") {
		t.Error("refresh despite Refresh < 0")
	}
	if code, _, _ := get(t, base+"/status.json"); code != 503 {
		t.Errorf("/status.json code %d", code)
	}
}

// TestStatusPageInChromium renders the page in headless Chromium when it is
// installed and checks that a non-trivial screenshot comes out. Set
// DEDUPNODE_SCREENSHOT_DIR to keep the PNG.
func TestStatusPageInChromium(t *testing.T) {
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("chromium not installed")
	}
	base := start(t, Config{Status: &fakeSource{st: sampleStatus()}, Refresh: -1})
	dir := os.Getenv("DEDUPNODE_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "status.png")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir="+t.TempDir(), "--window-size=1280,1400", "--screenshot="+shot, base+"/")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	st, err := os.Stat(shot)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() < 20_000 {
		t.Errorf("screenshot only %d bytes: page probably blank", st.Size())
	}
	// Chromium can also dump the DOM it rendered: the page must parse into
	// the same content.
	dom, err := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu",
		"--user-data-dir="+t.TempDir(), "--dump-dom", base+"/").Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	for _, want := range []string{"Members", "orders", "Bloom filters and storage"} {
		if !strings.Contains(string(dom), want) {
			t.Errorf("rendered DOM lacks %q", want)
		}
	}
}
