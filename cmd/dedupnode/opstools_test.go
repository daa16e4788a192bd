package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// checkLines runs check for ids and returns "id\tresult" lines.
func checkLines(t *testing.T, ctx context.Context, addrs, ns string, ids []string) []string {
	t.Helper()
	code, out, errb := runCLI(t, ctx, strings.Join(ids, "\n")+"\n", "check", "--addr", addrs, "--namespace", ns, "-")
	if code != 0 {
		t.Fatalf("check: exit %d: %s", code, errb)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(l, "\t")
		lines = append(lines, f[0]+"\t"+f[1])
	}
	return lines
}

// TestExportImportRoundTrip: export → import into a new cluster → the same
// Check answers, through the CLI.
func TestExportImportRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := startDev(t, "--nodes", "1")
	dst := startDev(t, "--nodes", "1")

	var ids []string
	for i := range 300 {
		ids = append(ids, fmt.Sprintf("order-%03d", i))
	}
	if code, _, errb := runCLI(t, ctx, strings.Join(ids[:200], "\n"), "mark", "--addr", src, "--namespace", "orders", "--ttl", "2h", "-"); code != 0 {
		t.Fatalf("mark: %s", errb)
	}
	if code, _, errb := runCLI(t, ctx, strings.Join(ids[200:250], "\n"), "mark", "--addr", src, "--namespace", "orders", "--ttl", "3d", "-"); code != 0 {
		t.Fatalf("mark: %s", errb)
	}
	if code, _, errb := runCLI(t, ctx, "", "forget", "--addr", src, "--namespace", "orders", ids[0], ids[1], ids[2]); code != 0 {
		t.Fatalf("forget: %s", errb)
	}
	want := checkLines(t, ctx, src, "orders", ids)

	file := filepath.Join(t.TempDir(), "orders.ndjson")
	code, _, errb := runCLI(t, ctx, "", "export", "--addr", src, "--namespace", "orders", "--out", file)
	if code != 0 {
		t.Fatalf("export: exit %d: %s", code, errb)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 248 {
		t.Fatalf("export wrote %d lines, want a header and 247 records", n)
	}
	if !strings.Contains(string(data), `"id":"order-100","state":"committed"`) {
		t.Fatalf("export lines look wrong: %.300s", data)
	}

	code, out, errb := runCLI(t, ctx, "", "import", "--addr", dst, "--namespace", "orders", file)
	if code != 0 || !strings.Contains(out, "imported 247 IDs into orders: 247 new") {
		t.Fatalf("import: exit %d\n%s%s", code, out, errb)
	}
	if got := checkLines(t, ctx, dst, "orders", ids); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("answers differ after export/import:\nsource %v\ntarget %v", want, got)
	}
	// Expiries carry over (rounded up to the minute, never shorter).
	code, out, _ = runCLI(t, ctx, "", "check", "--addr", dst, "--namespace", "orders", "--output", "json", ids[220])
	if code != 0 || !strings.Contains(out, `"expires_at"`) {
		t.Fatalf("check json: %s", out)
	}
	// Importing again is harmless.
	code, out, _ = runCLI(t, ctx, "", "import", "--addr", dst, "--namespace", "orders", file)
	if code != 0 || !strings.Contains(out, "0 new, 247 duplicate") {
		t.Fatalf("second import: %s", out)
	}

	// Plain lines from stdin, with --ttl.
	code, out, errb = runCLI(t, ctx, "plain-1\n  plain-2\n\n", "import", "--addr", dst, "--namespace", "plain", "--ttl", "1h", "-")
	if code != 0 || !strings.Contains(out, "imported 2 IDs into plain: 2 new, 0 duplicate") {
		t.Fatalf("plain import: exit %d\n%s%s", code, out, errb)
	}
	// A malformed line is a usage error naming the line.
	code, _, errb = runCLI(t, ctx, "ok-1\n{\"id\": 5}\n", "import", "--addr", dst, "--namespace", "plain", "-")
	if code != exitUsage || !strings.Contains(errb, "line 2") {
		t.Fatalf("bad line: exit %d, stderr %q", code, errb)
	}
}

func TestParseImportLine(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	for _, c := range []struct {
		in     string
		id     string
		ttl    time.Duration
		expire bool
	}{
		{"abc", "abc", time.Hour, false},
		{`{"id":"x","ttl":"7d"}`, "x", 7 * 24 * time.Hour, false},
		{`{"id":"x","ttl_ms":1500}`, "x", 1500 * time.Millisecond, false},
		{`{"id_b64":"AP8=","ttl":"1m"}`, "\x00\xff", time.Minute, false},
		{`{"id":"x","expires_unix_ms":1000060000}`, "x", time.Minute, false},
		{`{"id":"x","expires_unix_ms":999999000}`, "", 0, true},
		{`{"id":"x"}`, "x", time.Hour, false},
	} {
		r, err := parseImportLine(c.in, time.Hour, now, importLimits{})
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if c.expire {
			if !r.expired {
				t.Errorf("%s: expired record not skipped", c.in)
			}
			continue
		}
		if string(r.id) != c.id || r.ttl != c.ttl || r.expired || r.leased {
			t.Errorf("%s: got %+v, want %q %v", c.in, r, c.id, c.ttl)
		}
	}
	// A lease keeps its expiry to the second, never earlier, with its
	// digest and token; the header names the source's fencing epoch.
	r, err := parseImportLine(`{"id":"l","state":"leased","expires_unix_ms":1000090500,"digest_b64":"ZGc=","token_b64":"dG9r","fence":7}`, time.Hour, now, importLimits{})
	if err != nil || !r.leased || r.ttl != 91*time.Second || string(r.digest) != "dg" || string(r.token) != "tok" {
		t.Errorf("leased line: %+v %v", r, err)
	}
	r, err = parseImportLine(`{"dedupnode_export":1,"namespace":"orders","fence_epoch":4}`, time.Hour, now, importLimits{})
	if err != nil || r.header == nil || r.header.FenceEpoch != 4 || r.id != nil {
		t.Errorf("header line: %+v %v", r, err)
	}
	for _, bad := range []string{`{"id":"x","id_b64":"eA=="}`, `{}`, `{"id":"x","extra":1}`, `{"id":"x","ttl":"soon"}`, `{"id_b64":"%%"}`,
		`{"id":"x","state":"released"}`, `{"id":"x","digest_b64":"%%"}`, `{"id":"x","token_b64":"` + strings.Repeat("QUFB", 22) + `"}`,
		`{"dedupnode_export":2,"namespace":"x","fence_epoch":0}`, `{"dedupnode_export":1,"fence_epoch":70000}`} {
		if _, err := parseImportLine(bad, 0, now, importLimits{}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	if got := roundTTL(61*time.Second, time.Minute, 0); got != 2*time.Minute {
		t.Errorf("roundTTL up: %v", got)
	}
	if got := roundTTL(23*time.Hour+59*time.Minute+30*time.Second, time.Minute, 24*time.Hour); got != 24*time.Hour {
		t.Errorf("roundTTL to max: %v", got)
	}
	if got := roundTTL(24*time.Hour+30*time.Second, time.Minute, 24*time.Hour); got != 24*time.Hour+time.Minute {
		t.Errorf("roundTTL past max keeps the asked TTL's rounding: %v", got)
	}
}

// TestBackupRestoreCLI: backup a dev cluster to a file, restore it into a
// new data dir, serve it, and get the same answers.
func TestBackupRestoreCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := startDev(t, "--nodes", "1")
	var ids []string
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("msg-%03d", i))
	}
	if code, _, errb := runCLI(t, ctx, strings.Join(ids[:60], "\n"), "mark", "--addr", src, "--namespace", "events", "-"); code != 0 {
		t.Fatalf("mark: %s", errb)
	}
	want := checkLines(t, ctx, src, "events", ids)
	file := filepath.Join(t.TempDir(), "dedup.snap")
	code, out, errb := runCLI(t, ctx, "", "backup", "--addr", src, "--out", file)
	if code != 0 || !strings.Contains(out, "wrote "+file) {
		t.Fatalf("backup: exit %d\n%s%s", code, out, errb)
	}

	dir := filepath.Join(t.TempDir(), "r1")
	ports := make([]string, 2)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().String()
		l.Close()
	}
	code, out, errb = runCLI(t, ctx, "", "restore", "--from", file, "--node-id", "r1", "--data-dir", dir, "--raft-addr", ports[0])
	if code != 0 || !strings.Contains(out, "restored") ||
		!strings.Contains(out, "records: 60 restored (60 committed, 0 leased); skipped as expired: 0; released leases (count as absent): 0") ||
		!strings.Contains(out, "fencing epoch 1") {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errb)
	}
	if code, _, errb := runCLI(t, ctx, "", "restore", "--from", file, "--node-id", "r1", "--data-dir", dir, "--raft-addr", ports[0]); code != exitUsage {
		t.Fatalf("restore over existing state: exit %d %s", code, errb)
	}
	sctx, scancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	serr := &syncBuffer{}
	go func() {
		done <- run(sctx, []string{"serve", "--node-id", "r1", "--data-dir", dir, "--raft-addr", ports[0], "--grpc-addr", ports[1], "--log-level", "error"},
			strings.NewReader(""), &syncBuffer{}, serr)
	}()
	t.Cleanup(func() {
		scancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("serve exited %d: %s", code, serr.String())
			}
		case <-time.After(60 * time.Second):
			t.Error("serve did not stop")
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _, _ := runCLI(t, ctx, "", "status", "--addr", ports[1], "--timeout", "2s")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restored node not serving: %s", serr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := checkLines(t, ctx, ports[1], "events", ids); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("answers differ after backup/restore:\nsource %v\nrestored %v", want, got)
	}
	// A broken backup file is refused.
	bad := filepath.Join(t.TempDir(), "bad.snap")
	data, _ := os.ReadFile(file)
	data[len(data)/2] ^= 1
	os.WriteFile(bad, data, 0o600)
	code, _, errb = runCLI(t, ctx, "", "restore", "--from", bad, "--node-id", "r9", "--data-dir", filepath.Join(t.TempDir(), "r9"), "--raft-addr", "127.0.0.1:1")
	if code != exitError {
		t.Fatalf("restore of a damaged file: exit %d %s", code, errb)
	}
	// Promote of an unknown node is an operational error.
	code, _, errb = runCLI(t, ctx, "", "promote", "--addr", ports[1], "nobody")
	if code != exitError || !strings.Contains(errb, "nobody") {
		t.Fatalf("promote unknown: exit %d %q", code, errb)
	}
}

// FuzzParseImportLine: no line panics the import parser, and what it
// accepts is within the store's limits.
func FuzzParseImportLine(f *testing.F) {
	for _, s := range []string{"abc", `{"id":"x","ttl":"7d"}`, `{"id_b64":"AP8=","ttl_ms":5}`,
		`{"id":"l","state":"leased","expires_unix_ms":1000090500,"digest_b64":"ZGc=","token_b64":"dG9r","fence":7}`,
		`{"dedupnode_export":1,"namespace":"orders","fence_epoch":4}`, `{"id":"x","state":"released"}`, `{`} {
		f.Add(s)
	}
	now := time.Unix(1_000_000, 0)
	f.Fuzz(func(t *testing.T, line string) {
		r, err := parseImportLine(line, time.Hour, now, importLimits{})
		if err != nil {
			return
		}
		if r.header != nil {
			if r.id != nil || r.header.FenceEpoch > 1<<16-1 {
				t.Fatalf("header %+v with id %q", r.header, r.id)
			}
			return
		}
		if len(r.digest) > 64 || len(r.token) > 64 {
			t.Fatalf("digest %d or token %d bytes accepted", len(r.digest), len(r.token))
		}
	})
}

// An import whose request the cluster rejects for one ID (longer than the
// namespace allows) names that ID's input line, not its place in the
// request, and says how many IDs were imported before it.
func TestImportRejectionNamesTheInputLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr := startDev(t, "--nodes", "1")
	if code, _, errb := runCLI(t, ctx, "", "namespace", "create", "short", "--addr", addr, "--max-id-bytes", "8"); code != 0 {
		t.Fatalf("namespace create: %s", errb)
	}
	var in strings.Builder
	for i := range 25 {
		fmt.Fprintf(&in, "id-%02d\n", i)
		if i == 5 {
			in.WriteString("\n") // an empty line still counts as a line
		}
	}
	in.WriteString("id-far-too-long\n") // line 27
	code, _, errb := runCLI(t, ctx, in.String(), "import", "--addr", addr, "--namespace", "short", "--ttl", "1h", "--batch", "10", "-")
	if code == 0 || !strings.Contains(errb, `line 27 ("id-far-too-long")`) || !strings.Contains(errb, "20 IDs imported before it") {
		t.Fatalf("import of a too long ID: exit %d, stderr %q; want line 27 named and 20 IDs imported", code, errb)
	}
	if strings.Contains(errb, "items[") {
		t.Fatalf("the error names the ID's place in the request: %q", errb)
	}
}

// TestParseImportLineNamesTheField: a refused line names the field at
// fault and why, in our words (never encoding/json's Go type names), and
// no value is widened, narrowed or overridden: a negative or zero TTL, two
// TTL sources, an expiry past every namespace's limit and a fractional
// number are refused (they were, in turn, given the default TTL, resolved
// silently, overflowed into a negative TTL, and reported as "Go struct
// field exportLine.ttl_ms of type int64").
func TestParseImportLineNamesTheField(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	week := importLimits{namespace: "orders", maxTTL: 7 * 24 * time.Hour}
	for _, c := range []struct {
		in     string
		lim    importLimits
		field  string
		reason string
	}{
		{`{"id":"im-6","ttl_ms":-5}`, importLimits{}, "ttl_ms", "-5: a TTL must be positive"},
		{`{"id":"x","ttl_ms":0}`, importLimits{}, "ttl_ms", "0: a TTL must be positive"},
		{`{"id":"im-7","ttl":"90s","ttl_ms":1000}`, importLimits{}, "ttl_ms", `conflicts with "ttl"`},
		{`{"id":"x","ttl_ms":1000,"expires_unix_ms":1000060000}`, importLimits{}, "expires_unix_ms", `conflicts with "ttl_ms"`},
		{`{"id":"x","expires_unix_ms":99999999999999}`, importLimits{}, "expires_unix_ms", "99999999999999 (5138-11-16T09:46:39Z) is more than 366d from now, the largest max TTL"},
		{`{"id":"x","expires_unix_ms":9223372036854775807}`, importLimits{}, "expires_unix_ms", "past year 9999) is more than 366d from now"},
		{`{"id":"x","expires_unix_ms":-1}`, importLimits{}, "expires_unix_ms", "want a positive Unix time"},
		{`{"id":"x","expires_unix_ms":1700000000}`, week, "expires_unix_ms", "over the max TTL of namespace orders (7d)"},
		{`{"id":"x","ttl_ms":1.5}`, importLimits{}, "ttl_ms", "1.5 is not a whole number of milliseconds"},
		{`{"id":"x","ttl_ms":"5"}`, importLimits{}, "ttl_ms", `want a whole number of milliseconds, got string "5"`},
		{`{"id":"x","ttl_ms":99999999999999999999}`, importLimits{}, "ttl_ms", "out of range"},
		{`{"id":"x","ttl_ms":9223372036854775807}`, importLimits{}, "ttl_ms", "9223372036854775807 ms is over 366d"},
		{`{"id":"x","ttl":"400d"}`, importLimits{}, "ttl", `"400d" gives a TTL of 400d, over 366d, the largest max TTL a namespace can have`},
		{`{"id":"x","ttl":"8d"}`, week, "ttl", `"8d" gives a TTL of 8d, over the max TTL of namespace orders (7d)`},
		{`{"id":"x","ttl":"99999999999999d"}`, importLimits{}, "ttl", "is not a duration"},
		{`{"id":"x","ttl":"0s"}`, importLimits{}, "ttl", "a TTL must be positive"},
		{`{"id":"x","ttl":"1500us"}`, importLimits{}, "ttl", "not a whole number of milliseconds"},
		{`{"id":"x","ttl":90}`, importLimits{}, "ttl", "want a string, got number 90"},
		{`{"id":"x","ttl":"1s","ttl":"2s"}`, importLimits{}, "ttl", "given twice"},
		{`{"id":"x","ttl_sm":5}`, importLimits{}, "ttl_sm", `unknown field (did you mean "ttl_ms"?)`},
		{`{"id":""}`, importLimits{}, "id", "empty"},
		{`{"id":5}`, importLimits{}, "id", "want a string, got number 5"},
		{`{"id":"x","fence":-1}`, importLimits{}, "fence", "-1 is negative"},
		{`{"id":"x"} {}`, importLimits{}, "", "more than one JSON value"},
		{`{"id":"x",}`, importLimits{}, "", "not valid JSON"},
		{`{"ttl":"1s"}`, importLimits{}, "", `missing "id"`},
	} {
		_, err := parseImportLine(c.in, 0, now, c.lim)
		var le *importLineError
		if !errors.As(err, &le) {
			t.Errorf("%s: got %v, want an importLineError", c.in, err)
			continue
		}
		if le.Field != c.field || !strings.Contains(le.Reason, c.reason) {
			t.Errorf("%s: field %q reason %q; want field %q reason containing %q", c.in, le.Field, le.Reason, c.field, c.reason)
		}
		if strings.Contains(le.Reason, "Go struct") || strings.Contains(le.Reason, "int64") {
			t.Errorf("%s: reason in Go's words: %q", c.in, le.Reason)
		}
	}
	// Within the limits, each TTL source gives exactly what it says.
	r, err := parseImportLine(`{"id":"x","expires_unix_ms":1000060000,"ttl":null}`, time.Hour, now, week)
	if err != nil || r.ttl != time.Minute {
		t.Errorf("expires_unix_ms with a null ttl: %+v %v", r, err)
	}
}

// An interrupted backup or export says that it only reads, not the advice
// for writes ("writes already sent are safe to repeat").
func TestInterruptedReadStreamsSayTheyOnlyRead(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as SIGTERM does
	dir := t.TempDir()
	addr := closedAddr(t)
	for _, args := range [][]string{
		{"backup", "--addr", addr, "--out", filepath.Join(dir, "y.snap")},
		{"export", "--addr", addr, "-n", "imp", "--out", filepath.Join(dir, "z.ndjson")},
	} {
		code, _, errb := runCLI(t, ctx, "", args...)
		if code != 1 || !strings.Contains(errb, "interrupted") || !strings.Contains(errb, "only reads") || strings.Contains(errb, "writes") {
			t.Fatalf("%s interrupted: exit %d, stderr %q; want exit 1, interrupted, only reads, nothing on writes", args[0], code, errb)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "y.snap")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("interrupted backup left y.snap: %v", err)
	}
}
