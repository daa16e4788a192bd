package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// lease_lost says why in a reason= detail (JSON: reason), as the help of
// commit says: a wrong token, no claim, a committed ID, an expired or
// released lease. The result column stays lease_lost.
func TestLeaseLostDetailsAreWhatHelpSays(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, _ := startNode(t)
	ctx := context.Background()
	run := func(args ...string) string {
		t.Helper()
		code, out, errs := runCLI(t, ctx, "", append(args, "--addr", addr, "-n", "leases")...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		return out
	}
	var cl struct {
		Lease        string `json:"lease"`
		FencingToken uint64 `json:"fencing_token"`
	}
	if err := json.Unmarshal([]byte(run("claim", "-o", "json", "job")), &cl); err != nil || cl.Lease == "" {
		t.Fatalf("claim: %v", err)
	}
	_, claimTok, _ := strings.Cut(cl.Lease, ".")
	run("mark", "marked")
	for entry, want := range map[string]string{
		"job=" + strconv.FormatUint(cl.FencingToken+1, 10) + "." + claimTok: "job\tlease_lost\treason=token_mismatch\tstate=leased\tfencing_token=" + strconv.FormatUint(cl.FencingToken, 10) + "\texpires_at=", // a wrong fencing token (the lease's request token: its holder sees it)
		"job=" + strconv.FormatUint(cl.FencingToken, 10) + ".00ff":          "job\tlease_lost\treason=token_mismatch\tstate=leased\texpires_at=",                                                                // another claim's request token
		"never-claimed=5.aa": "never-claimed\tlease_lost\treason=not_claimed\n",           // no record
		"marked=5.aa":        "marked\tlease_lost\treason=already_committed\texpires_at=", // committed by a mark
	} {
		if out := run("commit", entry); !strings.HasPrefix(out, want) {
			t.Errorf("commit %s: %q, want %q...", entry, out, want)
		}
	}
	// released, then renewed: not claimed; JSON says it as reason.
	run("release", "job="+cl.Lease)
	var rn struct{ Result, Reason string }
	if err := json.Unmarshal([]byte(run("renew", "-o", "json", "job="+cl.Lease)), &rn); err != nil || rn.Result != "lease_lost" || rn.Reason != "not_claimed" {
		t.Errorf("renew after release -o json: %+v %v, want lease_lost, reason not_claimed", rn, err)
	}
	if out := run("commit", "-o", "json", "never-claimed=5.aa"); !strings.Contains(out, `"reason":"not_claimed"`) {
		t.Errorf("commit -o json: %s, want reason not_claimed", out)
	}
	_, help, _ := runCLI(t, ctx, "", "commit", "--help")
	for _, want := range []string{"reason=expired", "reason=token_mismatch", "reason=already_committed", "reason=not_claimed", "state=leased: another lease holds it"} {
		if !strings.Contains(help, want) {
			t.Errorf("commit --help lacks %q", want)
		}
	}
}

// A second consumer that runs what the first runs (the README's recipe:
// the lease= value of its claim into commit) while the first holds the ID
// gets no lease from its in_progress claim, nothing in any answer that
// names the first's lease, and a usage error from commit, renew and
// release (exit 2, nothing sent); with the first's fencing token, which
// it could guess, it gets lease_lost. The first commits as usual.
func TestSecondConsumerCannotEndTheFirstsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, _ := startNode(t)
	ctx := context.Background()
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, "", append(args, "--addr", addr, "-n", "second")...)
	}
	leaseOf := func(out string) string {
		_, l, ok := strings.Cut(out, "\tlease=")
		if !ok {
			return ""
		}
		l, _, _ = strings.Cut(l, "\t")
		return l
	}
	code, out, errs := cli("claim", "--lease", "1m", "job-3")
	first := leaseOf(out)
	if code != exitOK || !strings.HasPrefix(out, "job-3\tacquired\tlease=") || first == "" {
		t.Fatalf("first claim: exit %d %q %s", code, out, errs)
	}
	fence, _, _ := strings.Cut(first, ".")

	// What the second consumer is answered, in text and JSON.
	for _, args := range [][]string{{"claim", "job-3"}, {"claim", "-o", "json", "job-3"}, {"check", "job-3"}, {"check", "-o", "json", "job-3"}, {"mark", "-o", "json", "job-3"}} {
		code, out, errs := cli(args...)
		if code != exitOK || !strings.Contains(out, "leased") {
			t.Fatalf("%v: exit %d %q %s", args, code, out, errs)
		}
		if leaseOf(out) != "" || strings.Contains(out, "lease\":") || strings.Contains(out, "fencing_token") || strings.Contains(out, "request_token") || strings.Contains(out, first[len(fence)+1:]) {
			t.Errorf("%v answers a second consumer %q: it names the first's lease", args, out)
		}
	}
	for _, cmd := range []string{"commit", "renew", "release"} {
		code, out, errs := cli(cmd, "job-3="+leaseOf(func() string { _, o, _ := cli("claim", "job-3"); return o }()))
		if code != exitUsage || out != "" || !strings.Contains(errs, "no LEASE") {
			t.Errorf("%s with the second consumer's lease= (none): exit %d %q %q, want a usage error", cmd, code, out, errs)
		}
		code, out, errs = cli(cmd, "job-3="+fence)
		if code != exitUsage || !strings.Contains(errs, "a fencing token alone") {
			t.Errorf("%s job-3=%s: exit %d %q %q, want a usage error", cmd, fence, code, out, errs)
		}
		code, out, _ = cli(cmd, "job-3="+fence+".5ec0d0")
		if code != exitOK || !strings.HasPrefix(out, "job-3\tlease_lost\treason=token_mismatch") {
			t.Errorf("%s with the first's fencing token and another request token: exit %d %q, want lease_lost", cmd, code, out)
		}
	}
	if code, out, _ := cli("commit", "job-3="+first); code != exitOK || !strings.HasPrefix(out, "job-3\tok\t") {
		t.Fatalf("the first consumer's commit: exit %d %q, want ok", code, out)
	}
	if code, out, _ := cli("claim", "job-3"); code != exitOK || !strings.HasPrefix(out, "job-3\tduplicate") {
		t.Fatalf("claim after the first's commit: exit %d %q, want duplicate", code, out)
	}
}
