package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// rerunRE finds the command an outcome-unknown error says to run again.
var rerunRE = regexp.MustCompile(`re-run (.*? (mark|claim) --request-token ([0-9a-f]+) [^,;]*?), and each ID`)

// Guarantees (7): a mark or claim whose reply was lost fails with "outcome
// unknown", naming its request token and the command to run again with it;
// that command answers as the first run would have (new stays new, and a
// claim is acquired with the same fencing token), while a run without the
// token answers duplicate or in_progress.
func TestOutcomeUnknownPrintsTheTokenAndTheRerunAnswersAsTheFirstRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, drop := startNode(t)
	ctx := context.Background()
	answers := map[string]string{} // command -> the re-run's answer
	for _, tc := range []struct {
		cmd, method, first, without string
	}{
		{"mark", dedupv1.Dedup_Mark_FullMethodName, "new", "duplicate"},
		{"claim", dedupv1.Dedup_Claim_FullMethodName, "acquired", "in_progress"},
	} {
		id := "in-doubt-" + tc.cmd
		drop.set(tc.method, true)
		code, out, errs := runCLI(t, ctx, "", tc.cmd, "--addr", addr, "--timeout", "2s", "-n", "tokens", id)
		drop.set(tc.method, false)
		if code != exitError || out != "" {
			t.Fatalf("%s with its replies lost: exit %d, stdout %q, stderr %q; want exit 1", tc.cmd, code, out, errs)
		}
		assertOneLine(t, errs)
		m := rerunRE.FindStringSubmatch(errs)
		if m == nil || !strings.Contains(errs, "outcome unknown") || !strings.Contains(errs, "request token "+m[3]) {
			t.Fatalf("%s: stderr %q lacks the outcome, the token or the command to re-run", tc.cmd, errs)
		}
		// D7: the call ran out of its --timeout: the error says so, and
		// the command to re-run has a longer one.
		if want := progName() + " " + tc.cmd + " --request-token " + m[3] + " --timeout 15s --addr " + addr + " -n tokens " + id; m[1] != want {
			t.Fatalf("%s: command to re-run %q, want %q", tc.cmd, m[1], want)
		}
		if !strings.Contains(errs, "outcome unknown: no answer within --timeout 2s: the write of") || !strings.Contains(errs, "with a longer --timeout, re-run") {
			t.Fatalf("%s: stderr %q does not say the call's --timeout 2s ran out", tc.cmd, errs)
		}

		// The printed command, run as printed, answers as the first run.
		rerun := strings.Fields(strings.TrimPrefix(m[1], progName()+" "))
		code, out, errs = runCLI(t, ctx, "", rerun...)
		if code != exitOK || !strings.HasPrefix(out, id+"\t"+tc.first+"\t") {
			t.Fatalf("%s re-run with the token: exit %d, out %q, err %s; want %s", tc.cmd, code, out, errs, tc.first)
		}
		again, _, _ := strings.Cut(out, "\texpires_at")
		answers[tc.cmd] = again
		code, out2, _ := runCLI(t, ctx, "", rerun...)
		if code != exitOK || !strings.HasPrefix(out2, again) {
			t.Fatalf("%s second re-run: %q, want the same answer %q", tc.cmd, out2, again)
		}
		// Without the token, the write that was applied is someone else's.
		code, out, _ = runCLI(t, ctx, "", tc.cmd, "--addr", addr, "-n", "tokens", id)
		if code != exitOK || !strings.HasPrefix(out, id+"\t"+tc.without) {
			t.Fatalf("%s without the token: exit %d, out %q; want %s", tc.cmd, code, out, tc.without)
		}
	}

	// The claim re-run with the token holds the lease the lost claim took:
	// it printed that lease, which commits it.
	_, lease, _ := strings.Cut(answers["claim"], "lease=")
	lease, _, _ = strings.Cut(lease, "\t")
	code, out, _ := runCLI(t, ctx, "", "commit", "--addr", addr, "-n", "tokens", "in-doubt-claim="+lease)
	if lease == "" || code != exitOK || !strings.HasPrefix(out, "in-doubt-claim\tok\t") {
		t.Fatalf("commit with the lease the re-run printed (%q): exit %d, %q; want ok", lease, code, out)
	}
	var errs string

	// D7: --timeout 1ms ends the call at its own deadline: never a re-run
	// with that --timeout again.
	drop.set(dedupv1.Dedup_Mark_FullMethodName, true)
	code, _, errs = runCLI(t, ctx, "", "mark", "--addr", addr, "--timeout=1ms", "-n", "tokens", "short-deadline")
	drop.set(dedupv1.Dedup_Mark_FullMethodName, false)
	if code != exitError || !strings.Contains(errs, "no answer within --timeout 1ms") || strings.Contains(errs, "once the cluster has a leader") {
		t.Fatalf("mark --timeout 1ms: exit %d, stderr %q; want it to say the 1ms ran out", code, errs)
	}
	if m := rerunRE.FindStringSubmatch(errs); m != nil && (strings.Contains(m[1], "1ms") || !strings.Contains(m[1], " --timeout 15s ")) {
		t.Fatalf("mark --timeout 1ms: command to re-run %q repeats the 1ms or lacks a longer --timeout", m[1])
	}

	for _, bad := range []string{"xyz", "", strings.Repeat("ab", 65)} {
		code, _, errs := runCLI(t, ctx, "", "mark", "--addr", addr, "--request-token", bad, "x")
		if code != exitUsage || !strings.Contains(errs, "--request-token") {
			t.Errorf("--request-token %q: exit %d, stderr %q; want a usage error naming the flag", bad, code, errs)
		}
	}
}
