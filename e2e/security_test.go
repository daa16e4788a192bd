package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecureProcessCluster drives the security flags end to end with real
// processes: `dedupnode certs` makes a CA and certificates, three `serve`
// processes run with TLS everywhere, mutual TLS for clients and an auth
// file, the CLI talks to them with --tls-* and --token (or
// DEDUPNODE_TOKEN), clients without a certificate or a token are refused,
// SIGHUP reloads the token file, and --admin-addr serves metrics and the
// status page.
func TestSecureProcessCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	bin := buildBinary(t)
	certs := filepath.Join(t.TempDir(), "certs")
	if code, out, errb := cli(t, bin, "", "certs", "--out", certs, "--nodes", "n1,n2,n3"); code != 0 {
		t.Fatalf("certs: exit %d\n%s%s", code, out, errb)
	}
	for _, f := range []string{"ca.crt", "ca.key", "n1.crt", "n1.key", "n3.key", "client.crt", "client.key"} {
		if _, err := os.Stat(filepath.Join(certs, f)); err != nil {
			t.Fatalf("certs did not write %s: %v", f, err)
		}
	}
	ca := filepath.Join(certs, "ca.crt")
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	writeTokens := func(extra string) {
		content := `{"tokens": [
  {"name": "ops", "token": "e2e-ops-token", "namespaces": ["*"], "rights": ["read", "write", "admin"]}` + extra + `
]}`
		if err := os.WriteFile(tokens, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeTokens("")

	c := newPeersCluster(t, bin, 3)
	admin := freePorts(t, 3)
	for i, n := range c.nodes {
		c.start(n, "--tls-cert", filepath.Join(certs, n.id+".crt"), "--tls-key", filepath.Join(certs, n.id+".key"),
			"--tls-ca", ca, "--tls-client-ca", ca, "--auth-file", tokens, "--admin-addr", admin[i])
	}
	addrs := strings.Join(c.addrs(), ",")
	tlsFlags := []string{"--tls-ca", ca, "--tls-cert", filepath.Join(certs, "client.crt"), "--tls-key", filepath.Join(certs, "client.key")}
	withTLS := func(args ...string) []string { return append(args, tlsFlags...) }

	// Wait for a leader, through the CLI over mutual TLS.
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, out, errb := cli(t, bin, "", withTLS("status", "--addr", addrs, "--token", "e2e-ops-token", "--output", "json", "--timeout", "5s")...)
		var st struct {
			LeaderID string `json:"leader_id"`
		}
		if code == 0 && json.Unmarshal([]byte(firstLine(out)), &st) == nil && st.LeaderID != "" {
			break
		}
		if time.Now().After(deadline) {
			c.dumpLogs()
			t.Fatalf("no leader over TLS: exit %d\n%s%s", code, out, errb)
		}
		time.Sleep(200 * time.Millisecond)
	}

	code, out, errb := cli(t, bin, "", withTLS("mark", "--addr", addrs, "--token", "e2e-ops-token", "tls-1", "tls-2")...)
	if code != 0 || strings.Count(out, "\tnew") != 2 {
		c.dumpLogs()
		t.Fatalf("mark over TLS: exit %d\n%s%s", code, out, errb)
	}
	// Through each node, the token from the environment.
	for _, a := range c.addrs() {
		code, out, errb := cliEnv(t, bin, []string{"DEDUPNODE_TOKEN=e2e-ops-token"}, withTLS("check", "--addr", a, "tls-1", "tls-2")...)
		if code != 0 || strings.Count(out, "\tseen") != 2 {
			t.Fatalf("check via %s with DEDUPNODE_TOKEN: exit %d\n%s%s", a, code, out, errb)
		}
	}

	// No client certificate: the TLS handshake fails.
	code, _, errb = cli(t, bin, "", "check", "--addr", addrs, "--tls-ca", ca, "--token", "e2e-ops-token", "--timeout", "5s", "tls-1")
	if code != 1 {
		t.Errorf("check without a client certificate: exit %d, want 1; stderr %s", code, errb)
	}
	// No TLS at all.
	code, _, errb = cli(t, bin, "", "check", "--addr", addrs, "--token", "e2e-ops-token", "--timeout", "5s", "tls-1")
	if code != 1 {
		t.Errorf("check without TLS: exit %d, want 1; stderr %s", code, errb)
	}
	// No token.
	code, _, errb = cli(t, bin, "", withTLS("check", "--addr", addrs, "--timeout", "5s", "tls-1")...)
	if code != 1 || !strings.Contains(errb, "not authenticated") || !strings.Contains(errb, "--token") {
		t.Errorf("check without a token: exit %d, stderr %q", code, errb)
	}

	// SIGHUP rereads the token file: a token added afterwards works.
	writeTokens(`,
  {"name": "late", "token": "e2e-late-token", "namespaces": ["default"], "rights": ["read"]}`)
	for _, n := range c.nodes {
		n.mu.Lock()
		_ = n.cmd.Process.Signal(syscall.SIGHUP)
		n.mu.Unlock()
	}
	deadline = time.Now().Add(30 * time.Second)
	for _, a := range c.addrs() {
		for {
			code, out, errb = cli(t, bin, "", withTLS("check", "--addr", a, "--token", "e2e-late-token", "--timeout", "5s", "tls-1")...)
			if code == 0 && strings.Contains(out, "\tseen") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("token added before SIGHUP not accepted by %s: exit %d\n%s%s", a, code, out, errb)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Its rights are what the file says: read only.
	code, _, errb = cli(t, bin, "", withTLS("mark", "--addr", addrs, "--token", "e2e-late-token", "--timeout", "5s", "tls-3")...)
	if code != 1 || !strings.Contains(errb, "permission denied") {
		t.Errorf("mark with a read-only token: exit %d, stderr %q", code, errb)
	}

	// Admin listener.
	// Every node exports the node figures; the item counts live on the
	// nodes the client called, so look at all three.
	var all string
	for _, a := range admin {
		m := httpBody(t, "http://"+a+"/metrics")
		for _, want := range []string{"dedup_requests_total", "dedup_raft_term", "dedup_bloom_memory_bytes", "dedup_storage_disk_bytes", "dedup_pebble_disk_usage_bytes", "dedup_pebble_l0_files",
			`dedup_tls_cert_expiry_timestamp_seconds{cert="node"}`} {
			if !strings.Contains(m, want) {
				t.Errorf("%s/metrics lacks %q", a, want)
			}
		}
		all += m
	}
	if !strings.Contains(all, `dedup_items_total{namespace="default",op="mark",result="new"}`) {
		t.Error("no node counted the marks in dedup_items_total")
	}
	page := httpBody(t, "http://"+admin[1]+"/")
	for _, want := range []string{"<code>n1</code>", "<code>n2</code>", "<code>n3</code>", "<code>default</code>"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if strings.Contains(page, "unreachable") {
		t.Error("status page shows a member unreachable over mutual TLS")
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// cliEnv is cli with extra environment variables.
func cliEnv(t *testing.T, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return 0, out.String(), errb.String()
}

func httpBody(t *testing.T, url string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == 200 {
				return string(b)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
