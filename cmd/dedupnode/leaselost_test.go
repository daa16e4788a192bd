package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// The node answers lease_lost alike for a wrong token, an expired or
// released lease and a committed ID; the help of commit says how the
// details on the line tell them apart, and they do.
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
		"job=" + strconv.FormatUint(cl.FencingToken+1, 10): "job\tlease_lost\tstate=leased\tfencing_token=" + fence + "\texpires_at=", // a wrong token
		"never-claimed=5": "never-claimed\tlease_lost\n",     // no live record
		"marked=5":        "marked\tlease_lost\texpires_at=", // committed by a mark
	} {
		if out := run("commit", entry); !strings.HasPrefix(out, want) {
			t.Errorf("commit %s: %q, want %q...", entry, out, want)
		}
	}
	_, help, _ := runCLI(t, ctx, "", "commit", "--help")
	for _, want := range []string{"state=leased with another fencing_token", "expires_at without", "no details: the\nID holds no live record"} {
		if !strings.Contains(help, want) {
			t.Errorf("commit --help lacks %q", want)
		}
	}
}
