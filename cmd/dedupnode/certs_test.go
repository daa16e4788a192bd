package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCertsCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "pki")
	code, out, errb := runCLI(t, ctx, "", "certs", "--out", dir, "--nodes", "n1, n2", "--hosts", "10.1.2.3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb)
	}
	for _, f := range []string{"ca.crt", "ca.key", "n1.crt", "n1.key", "n2.crt", "n2.key", "client.crt", "client.key"} {
		if !strings.Contains(out, filepath.Join(dir, f)) {
			t.Errorf("output does not list %s:\n%s", f, out)
		}
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(out, "--tls-client-ca") || !strings.Contains(out, "--tls-cert "+filepath.Join(dir, "client.crt")) {
		t.Errorf("output does not show how to use the files:\n%s", out)
	}

	// Again without --force: refused, nothing overwritten, exit 1.
	before, _ := os.ReadFile(filepath.Join(dir, "n1.crt"))
	code, _, errb = runCLI(t, ctx, "", "certs", "--out", dir, "--nodes", "n1")
	if code != exitError || !strings.Contains(errb, "--force") {
		t.Errorf("overwrite without --force: exit %d, stderr %q", code, errb)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "n1.crt"))
	if string(before) != string(after) {
		t.Error("n1.crt overwritten without --force")
	}
	// A new node with the same CA.
	if code, _, errb := runCLI(t, ctx, "", "certs", "--out", dir, "--nodes", "n3", "--no-client"); code != 0 {
		t.Errorf("adding n3: exit %d: %s", code, errb)
	}
	// Also without --no-client: the existing client certificate is kept,
	// as the CA is.
	clientBefore, _ := os.ReadFile(filepath.Join(dir, "client.crt"))
	code, out, errb = runCLI(t, ctx, "", "certs", "--out", dir, "--nodes", "n4")
	if code != 0 || !strings.Contains(out, "kept "+filepath.Join(dir, "client.crt")) {
		t.Errorf("adding n4: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	if _, err := os.Stat(filepath.Join(dir, "n4.crt")); err != nil {
		t.Error(err)
	}
	if clientAfter, _ := os.ReadFile(filepath.Join(dir, "client.crt")); string(clientBefore) != string(clientAfter) {
		t.Error("client.crt replaced while adding a node without --force")
	}

	for _, args := range [][]string{
		{"certs", "--nodes", "n1"},
		{"certs", "--out", dir, "--no-client"},
		{"certs", "--out", dir, "--nodes", "ca", "--force"},
	} {
		code, _, errb := runCLI(t, ctx, "", args...)
		if code == exitOK {
			t.Errorf("%v: exit 0, want an error", args)
		}
		assertOneLine(t, errb)
	}
}

func TestServeSecurityFlagErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pki := t.TempDir()
	if code, _, errb := runCLI(t, ctx, "", "certs", "--out", pki, "--nodes", "n1"); code != 0 {
		t.Fatal(errb)
	}
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"tokens":[{"name":"a","token":"token-a-123","namespaces":["*"],"rights":["read"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--node-id", "n1", "--data-dir", t.TempDir(), "--bootstrap"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", filepath.Join(pki, "n1.crt")}, "--tls-key"},
		{[]string{"--tls-cert", filepath.Join(pki, "n1.crt"), "--tls-key", filepath.Join(pki, "n1.key")}, "--tls-ca"},
		{[]string{"--tls-client-ca", filepath.Join(pki, "ca.crt")}, "need --tls-cert"},
		{[]string{"--tls-cert", filepath.Join(pki, "n1.crt"), "--tls-key", filepath.Join(pki, "client.key"), "--tls-ca", filepath.Join(pki, "ca.crt")}, "key pair"},
		{[]string{"--auth-file", tokens}, "node"},
		{[]string{"--tls-cert", filepath.Join(pki, "client.crt"), "--tls-key", filepath.Join(pki, "client.key"), "--tls-ca", filepath.Join(pki, "ca.crt")}, "client-only"},
		{[]string{"--auth-file", filepath.Join(pki, "missing.json")}, "--auth-file"},
	} {
		code, _, errb := runCLI(t, ctx, "", append(base, c.args...)...)
		if code != exitUsage || !strings.Contains(errb, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, errb, c.want)
		}
	}
}
