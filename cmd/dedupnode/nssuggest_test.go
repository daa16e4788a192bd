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
	// describe and update suggest it too (they did not).
	for _, args := range [][]string{{"namespace", "describe", "paymnets"}, {"namespace", "update", "paymnets", "--ttl", "1h"}} {
		code, _, errs = runCLI(t, ctx, "", append(args, "--addr", addr)...)
		if code != exitError || !strings.Contains(errs, `did you mean "payments"? Or list namespaces with`) {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errs)
		}
		assertOneLine(t, errs)
	}
	code, _, errs = runCLI(t, ctx, "", "check", "--addr", addr, "-n", "orders", "x")
	if code != exitError || strings.Contains(errs, "did you mean") || !strings.Contains(errs, "create it with 'dedupnode namespace create orders'") {
		t.Fatalf("check -n orders: exit %d, stderr %q", code, errs)
	}
}

// A default the user did not give that --max-ttl caps (the 30s lease of
// a namespace with --max-ttl 5s) is said on stderr, never narrowed
// silently; a value given above --max-ttl is refused, naming its flag.
func TestNamespaceCreateSaysWhichDefaultsMaxTTLCapped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	srvs, _ := testcluster.Start(t, 1, nil)
	addr := srvs[0].GRPCAddr()
	ctx := context.Background()
	code, out, errs := runCLI(t, ctx, "", "namespace", "create", "tiny", "--ttl", "2s", "--max-ttl", "5s", "--addr", addr)
	if want := "note: tiny default lease is 5s, not 30s: capped at its --max-ttl 5s (pass --lease to choose it)\n"; code != exitOK || errs != want || !strings.Contains(out, "tiny") {
		t.Fatalf("create tiny: exit %d, stdout %q, stderr %q; want the note %q", code, out, errs, want)
	}
	code, _, errs = runCLI(t, ctx, "", "namespace", "create", "small", "--max-ttl", "1h", "--addr", addr)
	if want := "note: small default TTL is 1h, not 1d: capped at its --max-ttl 1h (pass --ttl to choose it)\n"; code != exitOK || errs != want {
		t.Fatalf("create small: exit %d, stderr %q; want %q", code, errs, want)
	}
	code, _, errs = runCLI(t, ctx, "", "namespace", "create", "given", "--ttl", "2s", "--max-ttl", "5s", "--lease", "30s", "--addr", addr)
	if code != exitError || !strings.Contains(errs, "the default lease (--lease) must be at least 1ms and at most the max TTL (--max-ttl)") {
		t.Fatalf("create with --lease over --max-ttl: exit %d, stderr %q", code, errs)
	}
	code, _, errs = runCLI(t, ctx, "", "namespace", "create", "plain", "--addr", addr)
	if code != exitOK || errs != "" {
		t.Fatalf("create with the usual defaults: exit %d, stderr %q; want no note", code, errs)
	}
}
