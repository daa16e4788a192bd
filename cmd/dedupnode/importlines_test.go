package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestImportBadLineNamesLineAndFieldAndHowFarItGot (D5), against a real
// node: a refused import line is named with its field; when nothing was
// sent yet nothing is imported (exit 2); after a request went out, every
// line before the bad one is imported and none after it, and the error
// says so; re-running the fixed input is exact (the earlier IDs answer
// duplicate). On the old code the first case exited 0 ("1 new") with
// the namespace's default TTL.
func TestImportBadLineNamesLineAndFieldAndHowFarItGot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := startDev(t, "--nodes", "1")
	if code, _, errb := runCLI(t, ctx, "", "namespace", "create", "imp", "--addr", addr, "--ttl", "1h", "--max-ttl", "7d"); code != 0 {
		t.Fatalf("namespace create: %s", errb)
	}
	imp := func(stdin string, args ...string) (int, string, string) {
		return runCLI(t, ctx, stdin, append([]string{"import", "--addr", addr, "-n", "imp"}, append(args, "-")...)...)
	}

	for _, c := range []struct {
		in, want string
	}{
		{`{"id":"im-6","ttl_ms":-5}`, "line 1, field ttl_ms: -5: a TTL must be positive"},
		{`{"id":"im-7","ttl":"90s","ttl_ms":1000}`, `line 1, field ttl_ms: conflicts with "ttl" on the same line`},
		{"im-ok\n" + `{"id":"im-8","expires_unix_ms":99999999999999}`, "line 2, field expires_unix_ms: 99999999999999 (5138-11-16T09:46:39Z) is more than 366d from now"},
		{`{"id":"im-9","ttl_ms":1.5}`, "line 1, field ttl_ms: 1.5 is not a whole number of milliseconds"},
		{"\n\n" + `{"id":"im-10","ttl":"400d"}`, `line 3, field ttl: "400d" gives a TTL of 400d, over the max TTL of namespace imp (7d)`},
		// The namespace's own max TTL is checked before anything is sent.
		{`{"id":"im-11","ttl":"8d"}`, `line 1, field ttl: "8d" gives a TTL of 8d, over the max TTL of namespace imp (7d)`},
	} {
		code, out, errb := imp(c.in + "\n")
		if code != exitUsage || !strings.Contains(errb, c.want) || !strings.Contains(errb, "nothing imported") || out != "" {
			t.Errorf("import %q: exit %d, stdout %q, stderr %q; want exit %d with %q and 'nothing imported'", c.in, code, out, errb, exitUsage, c.want)
		}
	}
	// A namespace that does not exist yet (dev creates it): only the
	// limit of every namespace is known.
	code, _, errb := runCLI(t, ctx, `{"id":"im-12","ttl":"400d"}`+"\n", "import", "--addr", addr, "-n", "later", "-")
	if want := `line 1, field ttl: "400d" gives a TTL of 400d, over 366d, the largest max TTL a namespace can have; nothing imported`; code != exitUsage || !strings.Contains(errb, want) {
		t.Errorf("import 400d into a new namespace: exit %d, stderr %q; want %q", code, errb, want)
	}
	ids := []string{"im-ok", "im-6", "im-7", "im-8", "im-9", "im-10", "im-11"}
	for _, l := range checkLines(t, ctx, addr, "imp", ids) {
		if !strings.HasSuffix(l, "\tnot_seen") {
			t.Errorf("a refused import applied something: %s", l)
		}
	}
	if code, _, errb := imp("a\n", "--ttl", "8d"); code != exitUsage || !strings.Contains(errb, "--ttl gives a TTL of 8d, over the max TTL of namespace imp (7d); nothing imported") {
		t.Errorf("import --ttl 8d: exit %d, stderr %q", code, errb)
	}

	// Batches of 2: a and b go out with line 2; c is pending when line 4
	// is refused. The error must leave exactly lines 1-3 imported.
	bad := "a\nb\nc\n" + `{"id":"d","ttl":"90s","ttl_ms":1000}` + "\ne\n"
	var out string
	code, out, errb = imp(bad, "--batch", "2")
	want := "line 4, field ttl_ms: conflicts with \"ttl\" on the same line: give one of \"ttl\", \"ttl_ms\" or \"expires_unix_ms\"; lines 1-3 are imported (3 IDs, 0 skipped as expired), nothing from line 4 on"
	if code != exitError || !strings.Contains(errb, want) || !strings.Contains(errb, "resume at line 4") || out != "" {
		t.Fatalf("import with a bad line 4: exit %d, stdout %q, stderr %q; want exit %d with %q", code, out, errb, exitError, want)
	}
	assertOneLine(t, errb)
	got := checkLines(t, ctx, addr, "imp", []string{"a", "b", "c", "d", "e"})
	if w := []string{"a\tseen", "b\tseen", "c\tseen", "d\tnot_seen", "e\tnot_seen"}; !slices.Equal(got, w) {
		t.Fatalf("after the refused line 4: %q, want %q", got, w)
	}
	fixed := strings.Replace(bad, `"ttl":"90s",`, "", 1)
	code, out, errb = imp(fixed, "--batch", "2")
	if code != 0 || !strings.Contains(out, "imported 5 IDs into imp: 2 new, 3 duplicate") {
		t.Fatalf("re-run of the fixed input: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	// ttl_ms 1000 is 1 s, rounded up to the 1 min granularity, never the
	// 1 h default.
	code, out, _ = runCLI(t, ctx, "", "check", "--addr", addr, "-n", "imp", "--output", "json", "d")
	if code != 0 || !strings.Contains(out, `"expires_at"`) {
		t.Fatalf("check d: exit %d %q", code, out)
	}
	if exp := expiresAt(t, out); time.Until(exp) > 2*time.Minute {
		t.Errorf("d expires at %v: more than its ttl_ms (1 s, rounded up to 1 min) from now", exp)
	}
}

// expiresAt reads the expires_at of check --output json's one answer.
func expiresAt(t *testing.T, out string) time.Time {
	t.Helper()
	i := strings.Index(out, `"expires_at":"`)
	if i < 0 {
		t.Fatalf("no expires_at in %q", out)
	}
	s := out[i+len(`"expires_at":"`):]
	s = s[:strings.IndexByte(s, '"')]
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(fmt.Errorf("expires_at %q: %w", s, err))
	}
	return v
}
