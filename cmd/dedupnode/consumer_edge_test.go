package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/demo"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// edgeBuffer is a goroutine-safe output buffer.
type edgeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *edgeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *edgeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// `dedupnode demo --output json` runs end to end on its own in-process
// cluster and embedded NATS, prints one JSON object and exits 0 when ok.
func TestDemoCommandJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr edgeBuffer
	code := run(ctx, []string{"demo", "--messages", "1500", "--consumers", "2", "--workers", "8",
		"--lease", "2s", "--ack-wait", "1s", "--crash-rate", "0.002", "--stall-rate", "0.002",
		"--output", "json", "--data-dir", t.TempDir()}, strings.NewReader(""), &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	var sum map[string]any
	if err := json.Unmarshal([]byte(stdout.String()), &sum); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
	}
	for _, k := range []string{"unique_ids", "deliveries", "effects_applied", "duplicates_suppressed", "ok"} {
		if _, ok := sum[k]; !ok {
			t.Fatalf("summary lacks %q: %s", k, stdout.String())
		}
	}
	if sum["ok"] != true || sum["unique_ids"] != float64(1500) || sum["effects_applied"] != float64(1500) {
		t.Fatalf("summary: %s", stdout.String())
	}
}

func TestDemoAndWebhookUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"demo", "--output", "yaml"},
		{"demo", "--messages", "0"},
		{"demo", "--addr", "127.0.0.1:1", "--kill-leader-every", "5s"},
		{"demo", "--crash-rate", "2"},
		{"demo", "--broker", "kafak"},
		{"webhook-proxy", "--id-header", "Webhook-Id"},
		{"webhook-proxy", "--upstream", "ftp://x", "--id-header", "Webhook-Id"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--id-content"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature", "github"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature", "gitlab", "--signature-secret-env", "PATH"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature", "hmac", "--signature-secret-env", "PATH"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature", "github", "--signature-secret-env", "DEDUPNODE_TEST_UNSET_SECRET"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature", "github", "--signature-secret-file", "/nonexistent/secret"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--signature-secret-env", "PATH"},
		{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "A", "--upstream-timeout", "1m", "--upstream-max-wait", "30s"},
	} {
		var stdout, stderr edgeBuffer
		if code := run(ctx, args, strings.NewReader(""), &stdout, &stderr); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr.String())
		}
		if s := stderr.String(); strings.Count(strings.TrimSpace(s), "\n") != 0 {
			t.Errorf("%v: stderr not one line: %q", args, s)
		}
	}
}

// webhookProxyCmd is a `dedupnode webhook-proxy` run in this process.
type webhookProxyCmd struct {
	base   string // http://host:port it listens on
	done   chan int
	cancel context.CancelFunc
	stderr edgeBuffer
}

// startWebhookProxyCmd runs `dedupnode webhook-proxy args...` until stop,
// and waits until it listens.
func startWebhookProxyCmd(t *testing.T, args ...string) *webhookProxyCmd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &webhookProxyCmd{done: make(chan int, 1), cancel: cancel}
	t.Cleanup(func() { p.stop(t) })
	var stdout edgeBuffer
	go func() {
		p.done <- run(ctx, append([]string{"webhook-proxy", "--listen", "127.0.0.1:0"}, args...),
			strings.NewReader(""), &stdout, &p.stderr)
	}()
	re := regexp.MustCompile(`listening on (http://\S+),`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			p.base = m[1]
			return p
		}
		select {
		case code := <-p.done:
			p.done <- code
			t.Fatalf("webhook-proxy exited %d: %s", code, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook-proxy did not start: %s %s", stdout.String(), p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop cancels the command (Ctrl-C) and checks that it exits 0.
func (p *webhookProxyCmd) stop(t *testing.T) {
	t.Helper()
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	select {
	case code := <-p.done:
		if code != exitOK {
			t.Errorf("exit %d after cancel: %s", code, p.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Error("webhook-proxy did not stop")
	}
}

// `dedupnode webhook-proxy` in front of a real upstream, against a real
// cluster: first delivery forwarded, repeats answered as duplicates, a
// delivery repeating the ID header with different values refused, Ctrl-C
// (context cancel) stops it with exit 0.
func TestWebhookProxyCommand(t *testing.T) {
	cl := testcluster.New(t, devcluster.Config{Nodes: 3})
	var mu sync.Mutex
	hits := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path != "/hooks/stripe" && r.URL.Path != "/hooks/github" {
			http.Error(w, "wrong path "+r.URL.Path, http.StatusNotFound)
			return
		}
		io.WriteString(w, "thanks")
	}))
	t.Cleanup(up.Close)
	upstreamHits := func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return hits[path]
	}

	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("rotated-out\nwhsec_cmd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startWebhookProxyCmd(t, "--upstream", up.URL+"/hooks",
		"--id-json-field", "id", "--namespace", "stripe-events", "--addr", strings.Join(cl.Addrs(), ","),
		"--signature", "stripe", "--signature-secret-file", secretFile)

	const body = `{"id":"evt_1","type":"charge.succeeded"}`
	sign := func(secret string) string {
		ts := fmt.Sprint(time.Now().Unix())
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ts + "." + body))
		return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	postSigned := func(sig string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, p.base+"/stripe", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Stripe-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Dedupnode-Status")
	}
	post := func() (int, string) { return postSigned(sign("whsec_cmd")) }
	if code, st := postSigned(sign("whsec_forged")); code != http.StatusUnauthorized || st != "bad-signature" {
		t.Fatalf("forged delivery: %d %s", code, st)
	}
	if code, st := post(); code != http.StatusOK || st != "processed" {
		t.Fatalf("first delivery: %d %s", code, st)
	}
	if code, st := post(); code != http.StatusOK || st != "duplicate" {
		t.Fatalf("second delivery: %d %s", code, st)
	}
	if n := upstreamHits("/hooks/stripe"); n != 1 {
		t.Fatalf("upstream hit %d times, want 1", n)
	}
	p.stop(t)

	// --id-header: a delivery carrying the header twice with different
	// values names two events; it is refused before dedupnode and the
	// upstream, and each value sent alone goes upstream once.
	g := startWebhookProxyCmd(t, "--upstream", up.URL+"/hooks", "--id-header", "X-GitHub-Delivery",
		"--namespace", "github-events", "--addr", strings.Join(cl.Addrs(), ","))
	deliver := func(ids ...string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, g.base+"/github", strings.NewReader(`{"action":"opened"}`))
		for _, id := range ids {
			req.Header.Add("X-GitHub-Delivery", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Dedupnode-Status"), string(b)
	}
	if code, st, b := deliver("d-1", "d-2"); code != http.StatusBadRequest || st != "no-id" || !strings.Contains(b, "X-GitHub-Delivery is repeated with different values") {
		t.Fatalf("two delivery IDs: %d %s %s", code, st, b)
	}
	if n := upstreamHits("/hooks/github"); n != 0 {
		t.Fatalf("the ambiguous delivery went upstream (%d)", n)
	}
	for _, id := range []string{"d-2", "d-1"} {
		if code, st, b := deliver(id); code != http.StatusOK || st != "processed" {
			t.Fatalf("%s alone: %d %s %s", id, code, st, b)
		}
		if code, st, b := deliver(id); code != http.StatusOK || st != "duplicate" {
			t.Fatalf("%s again: %d %s %s", id, code, st, b)
		}
	}
	if n := upstreamHits("/hooks/github"); n != 2 {
		t.Fatalf("upstream hit %d times, want 2", n)
	}
	g.stop(t)
}

// Help names every broker the demo runs, and does not call RabbitMQ
// embedded: the demo starts the machine's rabbitmq-server.
func TestDemoHelpNamesEveryBroker(t *testing.T) {
	code, top, _ := runCLI(t, context.Background(), "", "--help")
	if code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	var line string
	for _, l := range strings.Split(top, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "demo ") {
			line = l
		}
	}
	for _, b := range []string{"NATS", "Kafka", "RabbitMQ"} {
		if !strings.Contains(line, b) {
			t.Errorf("--help lists the demo as %q, without %s", line, b)
		}
	}
	code, help, _ := runCLI(t, context.Background(), "", "demo", "--help")
	if code != exitOK {
		t.Fatalf("demo --help: exit %d", code)
	}
	for _, l := range strings.Split(help, "\n") {
		if strings.Contains(l, "--broker BROKER") {
			line = l
		}
	}
	for _, b := range demo.Brokers {
		if !strings.Contains(line, b) {
			t.Errorf("--broker help %q lacks %s", line, b)
		}
	}
	if !strings.Contains(line, "rabbitmq (the machine's rabbitmq-server") || strings.Contains(line, "embedded in this process: ") {
		t.Errorf("--broker help %q: RabbitMQ is the machine's rabbitmq-server, not embedded", line)
	}
}
