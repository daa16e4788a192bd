package main

import (
	"context"
	"encoding/json"
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
