package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDigestCommand: on a 3-node dev cluster after writes, digest finds
// the three replicas at one applied index with one digest (text and JSON).
func TestDigestCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addrs := startDev(t)
	if code, _, errb := runCLI(t, ctx, "", "mark", "--addr", addrs, "a", "b", "c"); code != 0 {
		t.Fatalf("mark: %s", errb)
	}
	code, out, errb := runCLI(t, ctx, "", "digest", "--addr", addrs, "--timeout", "60s")
	if code != 0 || !strings.Contains(out, "agree: 3 replicas, same digest at applied index") {
		t.Fatalf("digest: exit %d\n%s%s", code, out, errb)
	}
	code, out, errb = runCLI(t, ctx, "", "digest", "--addr", addrs, "--timeout", "60s", "--output", "json")
	if code != 0 {
		t.Fatalf("digest json: exit %d\n%s%s", code, out, errb)
	}
	var got struct {
		Agree        bool   `json:"agree"`
		AppliedIndex uint64 `json:"applied_index"`
		Nodes        []struct {
			NodeID       string `json:"node_id"`
			AppliedIndex uint64 `json:"applied_index"`
			Records      uint64 `json:"records"`
			Digest       string `json:"digest"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !got.Agree || len(got.Nodes) != 3 || got.AppliedIndex == 0 {
		t.Fatalf("json: %s", out)
	}
	for _, n := range got.Nodes {
		if n.AppliedIndex != got.AppliedIndex || n.Records != 3 || len(n.Digest) != 64 || n.Digest != got.Nodes[0].Digest {
			t.Fatalf("node %s: %+v in %s", n.NodeID, n, out)
		}
	}
	// A usage error: --interval must be positive.
	if code, _, _ := runCLI(t, ctx, "", "digest", "--addr", addrs, "--interval", "0s"); code != exitUsage {
		t.Fatalf("--interval 0s: exit %d, want %d", code, exitUsage)
	}
}

// A token without the admin right on "*": digest says so and what right it
// needs, not the advice for nodes that are down ("start the missing
// node, or remove it").
func TestDigestPermissionDeniedNamesTheRight(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"tokens":[
  {"name":"rw","token":"rw-token-123","namespaces":["*"],"rights":["read","write"]},
  {"name":"ops","token":"ops-token-123","namespaces":["*"],"rights":["read","write","admin"]},
  {"name":"peer","token":"peer-token-123","namespaces":["*"],"rights":["node"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	grpcAddr := closedAddr(t)
	r := startCmd("serve", "--node-id", "n1", "--data-dir", t.TempDir(), "--bootstrap",
		"--grpc-addr", grpcAddr, "--raft-addr", closedAddr(t), "--auth-file", tokens)
	t.Cleanup(func() {
		if code := r.stop(t); code != exitOK {
			t.Errorf("serve exited %d: %s", code, r.errs.String())
		}
	})
	if code, _, errb := runCLI(t, ctx, "", "status", "--wait", "--addr", grpcAddr, "--token", "ops-token-123", "--timeout", "60s"); code != 0 {
		t.Fatalf("status --wait: exit %d: %s", code, errb)
	}
	code, _, errb := runCLI(t, ctx, "", "digest", "--addr", grpcAddr, "--token", "rw-token-123", "--timeout", "10s")
	if code != 1 || !strings.Contains(errb, "permission denied") || !strings.Contains(errb, `admin right on all namespaces ("*")`) ||
		strings.Contains(errb, "start the missing node") || strings.Contains(errb, "remove") {
		t.Fatalf("digest with a read/write token: exit %d, stderr %q; want exit 1, permission denied naming the admin right on \"*\", no advice about nodes", code, errb)
	}
	if code, _, errb := runCLI(t, ctx, "", "digest", "--addr", grpcAddr, "--token", "ops-token-123", "--timeout", "30s"); code != 0 {
		t.Fatalf("digest with an admin token: exit %d: %s", code, errb)
	}
}
