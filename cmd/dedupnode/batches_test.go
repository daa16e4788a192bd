package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// A rejected ID read from standard input is named by its input line (and
// shown), not by its position in the batch ("items[199]"), and the error
// says which lines earlier batches applied: they were, so "nothing
// applied" alone would be false.
func TestBatchErrorsNameTheInputLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	cl := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	addr := strings.Join(cl.Addrs(), ",")
	ctx := context.Background()
	long := strings.Repeat("x", 600) // over the default 512 bytes

	// Line 2 is empty (skipped): the batches of 1000 IDs are lines 1-1001
	// and 1002-2001; line 1203 is the 1202nd ID, item 201 of its batch.
	var in strings.Builder
	for line := 1; line <= 2500; line++ {
		switch line {
		case 2:
			in.WriteString("\n")
		case 1203:
			in.WriteString(long + "\n")
		default:
			fmt.Fprintf(&in, "evt-%d\n", line)
		}
	}
	for _, cmd := range []string{"mark", "claim"} {
		t.Run(cmd, func(t *testing.T) {
			ns := "lines-" + cmd
			code, out, errs := runCLI(t, ctx, in.String(), cmd, "--addr", addr, "--namespace", ns, "-")
			if code != exitError {
				t.Fatalf("exit %d, want 1; stderr %q", code, errs)
			}
			assertOneLine(t, errs)
			if n := strings.Count(out, "\n"); n != 1000 {
				t.Fatalf("%d lines of output, want the first batch's 1000", n)
			}
			for _, want := range []string{
				`line 1203 ("xxxxxxxx`, "600 bytes exceed",
				"lines 1-1001 (1000 IDs) applied; the batch of lines 1002-2001 rejected, nothing of it applied",
				"fix line 1203, then send the input again from line 1002 on",
			} {
				if !strings.Contains(errs, want) {
					t.Errorf("stderr %q lacks %q", errs, want)
				}
			}
			for _, bad := range []string{"items[", "nothing applied"} {
				if strings.Contains(errs, bad) {
					t.Errorf("stderr %q has %q", errs, bad)
				}
			}
			// What the message says: line 1001 applied, line 1002 not.
			code, out, errs = runCLI(t, ctx, "", "check", "--addr", addr, "--namespace", ns, "evt-1001", "evt-1002")
			if code != exitOK || !strings.Contains(out, "evt-1001\tseen") || !strings.Contains(out, "evt-1002\tnot_seen") {
				t.Fatalf("check after the rejected batch: exit %d, stdout %q, stderr %q", code, out, errs)
			}
		})
	}

	t.Run("check", func(t *testing.T) {
		code, _, errs := runCLI(t, ctx, "a\nb\nc\n"+long+"\n", "check", "--addr", addr, "--namespace", "lines-mark", "--batch", "2", "-")
		if code != exitError || !strings.Contains(errs, `line 4 ("xxx`) ||
			!strings.Contains(errs, "lines 1-2 (2 IDs) answered; the batch of lines 3-4 rejected, nothing of it answered") {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
	})

	t.Run("arguments", func(t *testing.T) {
		code, out, errs := runCLI(t, ctx, "", "mark", "--addr", addr, "--namespace", "lines-args", "a", long, "c")
		if code != exitError || out != "" || !strings.Contains(errs, `argument 2 ("xxx`) ||
			!strings.Contains(errs, "request rejected, nothing applied") || strings.Contains(errs, "items[") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
	})

	// A malformed ID=LEASE is found before its batch is sent: a usage
	// error (exit 2) when nothing was sent, else exit 1 saying what was.
	t.Run("commit", func(t *testing.T) {
		code, out, errs := runCLI(t, ctx, "a=1.aa\nb=1.aa\n\nc\n", "commit", "--addr", addr, "--namespace", "lines-commit", "--batch", "2", "-")
		if code != exitError || strings.Count(out, "\n") != 2 || !strings.Contains(errs, `line 4 ("c"): no lease`) ||
			!strings.Contains(errs, "lines 1-2 (2 IDs) applied; the batch of line 4 not sent") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
		code, out, errs = runCLI(t, ctx, "\nc\n", "commit", "--addr", addr, "--namespace", "lines-commit", "-")
		if code != exitUsage || out != "" || !strings.Contains(errs, `line 2 ("c"): no lease`) {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
	})
}
