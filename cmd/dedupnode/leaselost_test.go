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
		FencingToken uint64 `json:"fencing_token"`
	}
	if err := json.Unmarshal([]byte(run("claim", "-o", "json", "job")), &cl); err != nil || cl.FencingToken == 0 {
		t.Fatalf("claim: %v", err)
	}
	fence := strconv.FormatUint(cl.FencingToken, 10)
	run("mark", "marked")
	for entry, want := range map[string]string{
		"job=" + strconv.FormatUint(cl.FencingToken+1, 10): "job\tlease_lost\treason=token_mismatch\tstate=leased\tfencing_token=" + fence + "\texpires_at=", // a wrong token
		"never-claimed=5": "never-claimed\tlease_lost\treason=not_claimed\n",           // no record
		"marked=5":        "marked\tlease_lost\treason=already_committed\texpires_at=", // committed by a mark
	} {
		if out := run("commit", entry); !strings.HasPrefix(out, want) {
			t.Errorf("commit %s: %q, want %q...", entry, out, want)
		}
	}
	// released, then renewed: not claimed; JSON says it as reason.
	run("release", "job="+fence)
	var rn struct{ Result, Reason string }
	if err := json.Unmarshal([]byte(run("renew", "-o", "json", "job="+fence)), &rn); err != nil || rn.Result != "lease_lost" || rn.Reason != "not_claimed" {
		t.Errorf("renew after release -o json: %+v %v, want lease_lost, reason not_claimed", rn, err)
	}
	if out := run("commit", "-o", "json", "never-claimed=5"); !strings.Contains(out, `"reason":"not_claimed"`) {
		t.Errorf("commit -o json: %s, want reason not_claimed", out)
	}
	_, help, _ := runCLI(t, ctx, "", "commit", "--help")
	for _, want := range []string{"reason=expired", "reason=token_mismatch", "reason=already_committed", "reason=not_claimed", "state=leased with another fencing_token"} {
		if !strings.Contains(help, want) {
			t.Errorf("commit --help lacks %q", want)
		}
	}
}
