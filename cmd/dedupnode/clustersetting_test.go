package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// TestClusterSetting_RegionListIsCheckedAndTrimmed: cluster-setting
// preferred-leader-regions 'us, eu,,' is a usage error naming the empty
// entry, before anything is sent (it was accepted and echoed verbatim),
// and serve --preferred-leader-regions is checked the same way; an
// accepted list is trimmed in what is sent, stored and printed.
func TestClusterSetting_RegionListIsCheckedAndTrimmed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	closed := closedAddr(t)
	for _, args := range [][]string{
		{"cluster-setting", "--addr", closed, "preferred-leader-regions", "us, eu,,"},
		{"serve", "--node-id", "n1", "--data-dir", t.TempDir(), "--bootstrap", "--preferred-leader-regions", "us, eu,,"},
	} {
		code, out, errs := runCLI(t, ctx, "", args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, "entry 3 is empty") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want a usage error naming entry 3", args[0], code, out, errs)
		}
		assertOneLine(t, errs)
	}

	cl := testcluster.New(t, devcluster.Config{Nodes: 1})
	code, out, errs := runCLI(t, ctx, "", "cluster-setting", "--addr", cl.Addrs()[0], "preferred-leader-regions", " us , eu ")
	if code != 0 || strings.TrimSpace(out) != "preferred-leader-regions = us,eu" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want preferred-leader-regions = us,eu", code, out, errs)
	}
	if got := cl.Server(0).Node().FSM().Settings()[cluster.SettingPreferredLeaderRegions]; got != "us,eu" {
		t.Fatalf("stored %q, want us,eu", got)
	}
}
