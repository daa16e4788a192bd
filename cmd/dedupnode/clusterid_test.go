package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// status shows the cluster ID (text and JSON); a command pointed at
// another cluster's node with --cluster-id (or DEDUPNODE_CLUSTER_ID) fails
// with one line naming both IDs and the address, exit 1, and writes
// nothing there.
func TestCLI_ClusterIDShownAndMismatchRefused(t *testing.T) {
	a := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	b := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addrA, addrB := a.Addrs()[0], b.Addrs()[0]

	code, out, errOut := runCLI(t, ctx, "", "status", "--addr", addrA, "--output", "json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st struct {
		ClusterID string `json:"cluster_id"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.ClusterID) != 32 {
		t.Fatalf("status JSON %q: want a 32-hex-digit cluster_id (%v)", out, err)
	}
	idA := st.ClusterID
	_, out, _ = runCLI(t, ctx, "", "status", "--addr", addrA)
	if !strings.Contains(out, "cluster  ") || !strings.Contains(out, idA) {
		t.Fatalf("status text does not show the cluster ID %s:\n%s", idA, out)
	}
	_, out, _ = runCLI(t, ctx, "", "status", "--addr", addrB, "--output", "json")
	var stB struct {
		ClusterID string `json:"cluster_id"`
	}
	if err := json.Unmarshal([]byte(out), &stB); err != nil || stB.ClusterID == "" || stB.ClusterID == idA {
		t.Fatalf("cluster B's status %q", out)
	}

	for _, viaEnv := range []bool{false, true} {
		args := []string{"mark", "--addr", addrB, "order-1"}
		if viaEnv {
			t.Setenv("DEDUPNODE_CLUSTER_ID", idA)
		} else {
			args = append(args, "--cluster-id", idA)
		}
		code, _, errOut = runCLI(t, ctx, "", args...)
		if code != 1 {
			t.Fatalf("mark on another cluster (env %v): exit %d, want 1; stderr %q", viaEnv, code, errOut)
		}
		assertOneLine(t, errOut)
		for _, want := range []string{"cluster mismatch", addrB, idA, stB.ClusterID} {
			if !strings.Contains(errOut, want) {
				t.Fatalf("error %q does not name %q", errOut, want)
			}
		}
	}
	t.Setenv("DEDUPNODE_CLUSTER_ID", "")
	code, out, errOut = runCLI(t, ctx, "", "check", "--addr", addrB, "order-1")
	if code != 0 || !strings.Contains(out, "not_seen") {
		t.Fatalf("check on cluster B: exit %d, %q %q; the refused mark must not have been written", code, out, errOut)
	}
}
