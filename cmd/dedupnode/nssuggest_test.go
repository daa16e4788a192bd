package main

import (
	"context"
	"strings"
	"testing"

	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// A mistyped namespace is answered with the existing one it most likely
// meant (same but for case, or within two edits) before the hint to create
// it; a name near none gets the hint alone.
func TestMistypedNamespaceSuggestsTheNearestOne(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	srvs, _ := testcluster.Start(t, 1, nil)
	addr := srvs[0].GRPCAddr()
	ctx := context.Background()
	if code, _, errs := runCLI(t, ctx, "", "namespace", "create", "payments", "--addr", addr); code != exitOK {
		t.Fatalf("namespace create: exit %d: %s", code, errs)
	}
	code, _, errs := runCLI(t, ctx, "", "mark", "--addr", addr, "-n", "paymnets", "x")
	if code != exitError || !strings.Contains(errs, `namespace "paymnets" does not exist; did you mean "payments"? Or create it with`) {
		t.Fatalf("mark -n paymnets: exit %d, stderr %q", code, errs)
	}
	assertOneLine(t, errs)
	code, _, errs = runCLI(t, ctx, "", "check", "--addr", addr, "-n", "orders", "x")
	if code != exitError || strings.Contains(errs, "did you mean") || !strings.Contains(errs, "create it with 'dedupnode namespace create orders'") {
		t.Fatalf("check -n orders: exit %d, stderr %q", code, errs)
	}
}
