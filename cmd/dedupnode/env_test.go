package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// unsetEnv removes DEDUPNODE_* variables for the test (restored after).
func unsetEnv(t *testing.T, keys ...string) {
	for _, k := range keys {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

// A bad value from DEDUPNODE_<FLAG> is reported naming the variable, in
// the words the flag's own error uses.
func TestEnvErrorsNameTheVariable(t *testing.T) {
	unsetEnv(t, "DEDUPNODE_ADDR", "DEDUPNODE_TIMEOUT", "DEDUPNODE_NAMESPACE", "DEDUPNODE_OUTPUT", "DEDUPNODE_BATCH")
	cases := []struct {
		env, val string
		args     []string
		want     string
	}{
		{"DEDUPNODE_ADDR", "127.0.0.1", []string{"check", "x"}, `DEDUPNODE_ADDR="127.0.0.1": want HOST:PORT`},
		{"DEDUPNODE_ADDR", "http://127.0.0.1:7070", []string{"status"}, `DEDUPNODE_ADDR="http://127.0.0.1:7070": drop the http:// scheme`},
		{"DEDUPNODE_TIMEOUT", "abc", []string{"check", "x"}, `DEDUPNODE_TIMEOUT="abc": invalid duration "abc": want e.g. 30s`},
		{"DEDUPNODE_TIMEOUT", "0s", []string{"check", "x"}, `DEDUPNODE_TIMEOUT must be positive`},
		{"DEDUPNODE_NAMESPACE", "Bad Name!", []string{"mark", "x"}, `DEDUPNODE_NAMESPACE: "Bad Name!" is not a valid namespace name`},
		{"DEDUPNODE_OUTPUT", "yaml", []string{"namespace", "list"}, `DEDUPNODE_OUTPUT="yaml": want text or json`},
		{"DEDUPNODE_BATCH", "0", []string{"forget", "x"}, `DEDUPNODE_BATCH must be at least 1`},
	}
	for _, tc := range cases {
		t.Setenv(tc.env, tc.val)
		code, out, errs := runCLI(t, context.Background(), "", tc.args...)
		os.Unsetenv(tc.env)
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%s=%q %v: exit %d, stderr %q; want a usage error with %q", tc.env, tc.val, tc.args, code, errs, tc.want)
		}
		if strings.Contains(errs, "--"+strings.ToLower(strings.TrimPrefix(tc.env, "DEDUPNODE_"))+" \"") {
			t.Errorf("%s: stderr %q names the flag, not the variable it came from", tc.env, errs)
		}
	}
	// The same bad values as flags read alike, naming the flag.
	for args, want := range map[string]string{
		"check --addr 127.0.0.1 x":  `--addr "127.0.0.1": want HOST:PORT`,
		"check --timeout abc x":     `invalid duration "abc": want e.g. 30s`,
		"check --timeout 0s x":      `--timeout must be positive`,
		"mark -n Bad_Name! x":       `--namespace: "Bad_Name!" is not a valid namespace name`,
		"namespace list -o yaml":    `--output "yaml": want text or json`,
		"forget --batch 0 x":        `--batch must be at least 1`,
		"check --timeout 1d2x y":    `invalid duration`,
		"mark --request-token zz x": `--request-token "zz"`,
	} {
		code, _, errs := runCLI(t, context.Background(), "", strings.Fields(args)...)
		if code != exitUsage || !strings.Contains(errs, want) {
			t.Errorf("%s: exit %d, stderr %q; want a usage error with %q", args, code, errs, want)
		}
	}
}

// Client commands honour DEDUPNODE_<FLAG> for their connection, output and
// per-ID session flags (as serve does for all of its flags); a flag wins;
// flags that say what a request writes never come from the environment.
func TestClientCommandsReadTheirFlagsFromTheEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, _ := startNode(t)
	ctx := context.Background()
	t.Setenv("DEDUPNODE_ADDR", addr)
	t.Setenv("DEDUPNODE_NAMESPACE", "from-env")
	t.Setenv("DEDUPNODE_OUTPUT", "json")
	t.Setenv("DEDUPNODE_REQUEST_TOKEN", "not hex: never read")
	t.Setenv("DEDUPNODE_FENCING_TOKEN", "not a number: never read")
	code, out, errs := runCLI(t, ctx, "", "mark", "x")
	var j struct{ ID, Result string }
	if code != exitOK || json.Unmarshal([]byte(out), &j) != nil || j.Result != "new" {
		t.Fatalf("mark with DEDUPNODE_ADDR/NAMESPACE/OUTPUT: exit %d, out %q, err %s", code, out, errs)
	}
	code, out, _ = runCLI(t, ctx, "", "check", "-o", "text", "--namespace", "from-env", "x")
	if code != exitOK || !strings.HasPrefix(out, "x\tseen") {
		t.Fatalf("check in from-env: exit %d, %q; the mark must have gone to DEDUPNODE_NAMESPACE", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "check", "-o", "text", "-n", "default", "x")
	if code != exitOK || !strings.HasPrefix(out, "x\tnot_seen") {
		t.Fatalf("check -n default: exit %d, %q; the flag must win over DEDUPNODE_NAMESPACE", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "namespace", "list")
	if code != exitOK || !strings.Contains(out, `"name":"from-env"`) {
		t.Fatalf("namespace list with DEDUPNODE_OUTPUT=json: exit %d, %q", code, out)
	}
	code, out, errs = runCLI(t, ctx, "", "release", "--held", "1.aa", "x")
	if code != exitOK || !strings.Contains(out, `"result":"lease_lost"`) {
		t.Fatalf("release: exit %d, %q, %s", code, out, errs)
	}

	code, help, _ := runCLI(t, ctx, "", "mark", "--help")
	for _, want := range []string{"DEDUPNODE_<FLAG>", "DEDUPNODE_NAMESPACE", "--request-token, namespace settings) are never read from the environment"} {
		if code != exitOK || !strings.Contains(help, want) {
			t.Errorf("mark --help lacks %q", want)
		}
	}
}

// Help shows --addr's default as it is typed, not in Go slice syntax.
func TestAddrDefaultInHelpAsTyped(t *testing.T) {
	for _, cmd := range [][]string{{"mark"}, {"check"}, {"status"}, {"namespace", "create"}} {
		_, help, _ := runCLI(t, context.Background(), "", append(cmd, "--help")...)
		if !strings.Contains(help, "(default 127.0.0.1:7070)") || strings.Contains(help, "[127.0.0.1:7070]") {
			t.Errorf("%v --help shows --addr's default as %q", cmd, help[strings.Index(help, "--addr HOST"):][:200])
		}
	}
}
