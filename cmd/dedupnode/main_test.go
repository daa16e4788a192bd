package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
)

// runCLI runs the command line in process and returns its exit code,
// stdout and stderr.
func runCLI(t *testing.T, ctx context.Context, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

func assertOneLine(t *testing.T, stderr string) {
	t.Helper()
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Fatalf("stderr must be exactly one line, got %q", stderr)
	}
}

func TestUsageErrorsExit2WithOneLine(t *testing.T) {
	t.Setenv("DEDUPNODE_ADDR", "")
	os.Unsetenv("DEDUPNODE_ADDR")
	dir := t.TempDir()
	// A data dir holding a raft-wal log (its meta file is what marks it).
	walDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(walDir, "raft", "wal"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(walDir, "raft", "wal", "wal-meta.db"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string // substring of stderr
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"mrak", "x"}, "unknown command"},
		{"unknown command close to one", []string{"marc", "x"}, `unknown command "marc" for "dedupnode" (did you mean mark?)`},
		{"unknown flag", []string{"mark", "--bogus", "x"}, "unknown flag"},
		{"no ids", []string{"mark"}, "no IDs given: pass them as arguments, or - to read them"},
		{"empty id", []string{"mark", "a", ""}, "empty ID"},
		{"empty id in a lease", []string{"commit", "=12"}, "empty ID"},
		{"bad output", []string{"check", "--output", "yaml", "x"}, "--output"},
		{"bad consistency", []string{"check", "--consistency", "eventual", "x"}, "consistency"},
		{"bad ttl", []string{"mark", "--ttl", "soon", "x"}, "invalid duration"},
		{"bad digest", []string{"mark", "--digest", "xyz", "x"}, "--digest"},
		// Issue 14: TTLs and leases are never rounded, and 0 is not a value.
		{"sub-ms ttl", []string{"mark", "--ttl", "500us", "x"}, "not a whole number of milliseconds"},
		{"fractional-ms ttl", []string{"mark", "--ttl", "1.9ms", "x"}, "not a whole number of milliseconds"},
		{"sub-ms lease", []string{"claim", "--lease", "999us", "x"}, "not a whole number of milliseconds"},
		{"zero ttl", []string{"mark", "--ttl", "0", "x"}, "--ttl 0: omit --ttl for the namespace's default ttl"},
		{"zero lease", []string{"claim", "--lease", "0s", "x"}, "--lease 0: omit --lease"},
		{"addr with scheme", []string{"status", "--addr", "http://127.0.0.1:7070"}, "drop the http:// scheme"},
		{"addr with scheme in list", []string{"mark", "--addr", "127.0.0.1:7071,https://127.0.0.1:7070/", "x"}, "e.g. --addr 127.0.0.1:7070"},
		{"commit without lease", []string{"commit", "order-1"}, "no lease"},
		{"commit bad lease", []string{"commit", "order-1=abc"}, "does not start with a positive fencing token"},
		{"commit with a fencing token alone", []string{"commit", "order-1=12"}, "a fencing token alone, not a LEASE"},
		{"commit with an empty lease", []string{"commit", "order-1="}, "no LEASE"},
		{"commit with a lease not in hex", []string{"commit", "order-1=12.xyz"}, "as hex"},
		{"held fencing token alone", []string{"release", "--held", "12", "order-1"}, "--held"},
		{"ttl over every namespace's limit", []string{"mark", "--ttl", "400d", "x"}, "--ttl 400d exceeds 366d"},
		{"lease over every namespace's limit", []string{"claim", "--lease", "9000h", "x"}, "--lease 375d exceeds 366d"},
		{"bad namespace name", []string{"mark", "-n", "bad name!", "x"}, `--namespace: "bad name!" is not a valid namespace name`},
		{"commit with both token forms", []string{"commit", "--held", "8.aa", "job-1=8.aa"}, "use one form"},
		{"ttl on check", []string{"check", "--ttl", "5m", "x"}, "unknown flag"},
		{"bad addr", []string{"mark", "--addr", "localhost", "x"}, "HOST:PORT"},
		{"addr port out of range", []string{"check", "--addr", "127.0.0.1:70700", "x"}, "port 70700 is out of range (1-65535)"},
		{"addr port zero", []string{"mark", "--addr", "[::1]:0", "x"}, "port 0 is out of range"},
		{"serve no node id", []string{"serve", "--data-dir", dir, "--bootstrap"}, "--node-id is required"},
		{"serve no data dir", []string{"serve", "--node-id", "n1", "--bootstrap"}, "--data-dir is required"},
		{"serve no mode", []string{"serve", "--node-id", "n1", "--data-dir", dir}, "give one of --bootstrap"},
		{"serve two modes", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--join", "127.0.0.1:7070"}, "only one of"},
		{"serve bad peers", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--peers", "n1=127.0.0.1:7000"}, "id=raft_addr=grpc_addr"},
		{"serve peers without self", []string{"serve", "--node-id", "n9", "--data-dir", dir, "--peers", "n1=a:1=b:2"}, "must include this node"},
		{"serve bad log format", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--log-format", "xml"}, "--log-format"},
		{"serve zero snapshot threshold", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-snapshot-threshold", "0"}, "--raft-snapshot-threshold 0"},
		{"serve zero trailing logs", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-trailing-logs", "0"}, "--raft-trailing-logs 0"},
		{"serve tiny snapshot interval", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-snapshot-interval", "10ms"}, "--raft-snapshot-interval 10ms"},
		{"serve log bound below two entries", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--max-entry-bytes", "8MiB", "--raft-log-max-bytes", "10MiB"}, `--raft-log-max-bytes "10MiB": want a size of at least twice --max-entry-bytes (16.0 MiB)`},
		{"serve log bound not a size", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-log-max-bytes", "lots"}, `--raft-log-max-bytes "lots"`},
		{"serve bad log store", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-log-store", "rocks"}, `--raft-log-store "rocks"`},
		{"serve other store's data dir", []string{"serve", "--node-id", "n1", "--data-dir", walDir, "--raft-log-store", "boltdb"}, "configured with --raft-log-store boltdb: start it with --raft-log-store wal"},
		{"dev bad log store", []string{"dev", "--raft-log-store", "bolt"}, "--raft-log-store"},
		{"dev too many nodes", []string{"dev", "--nodes", "40"}, "--nodes"},
		{"namespace bad mode", []string{"namespace", "create", "x", "--mode", "rolling"}, "--mode"},
		// The name rule is fsm's, checked before anything is sent; 0 is
		// not a setting, as for mark --ttl 0.
		{"namespace empty name", []string{"namespace", "create", ""}, `NAME: "" is not a valid namespace name (1-128 characters`},
		{"namespace bad name", []string{"namespace", "create", "Bad Name!"}, `NAME: "Bad Name!" is not a valid namespace name`},
		{"namespace update bad name", []string{"namespace", "update", "_x", "--ttl", "1h"}, `NAME: "_x" is not a valid namespace name`},
		{"namespace zero ttl", []string{"namespace", "create", "t1", "--ttl", "0"}, "--ttl 0: omit --ttl to keep the default"},
		{"namespace zero lease", []string{"namespace", "create", "t1", "--lease", "0s"}, "--lease 0: omit --lease"},
		{"namespace zero max ttl", []string{"namespace", "update", "t1", "--max-ttl", "0"}, "--max-ttl 0: omit --max-ttl to keep the current value"},
		{"namespace zero max id bytes", []string{"namespace", "create", "t1", "--max-id-bytes", "0"}, "--max-id-bytes 0"},
		{"namespace no sub", []string{"namespace"}, "subcommand"},
		{"remove no id", []string{"remove"}, "accepts 1 arg"},
		// D7: the missing flags are named, and an empty --addr entry is
		// called that (it was reported as --addr "").
		{"restore without some flags", []string{"restore", "--from", "x.snap", "--data-dir", dir}, "--node-id and --raft-addr are missing (--from, --node-id, --data-dir and --raft-addr are all required)"},
		{"restore without one flag", []string{"restore", "--from", "x.snap", "--data-dir", dir, "--node-id", "r1"}, "--raft-addr is missing"},
		{"join without some flags", []string{"join", "--node-id", "n4"}, "--raft-addr and --grpc-addr are missing"},
		{"addr with trailing comma", []string{"status", "--addr", "127.0.0.1:7070,"}, "empty address in --addr (trailing comma?)"},
		{"addr with empty entry", []string{"mark", "--addr", "127.0.0.1:7070,,127.0.0.1:7071", "x"}, "empty address in --addr (trailing comma?)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runCLI(t, context.Background(), "", tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", code, exitUsage, errs)
			}
			if out != "" {
				t.Fatalf("stdout must be empty on a usage error, got %q", out)
			}
			assertOneLine(t, errs)
			if !strings.Contains(errs, tc.want) || !strings.Contains(errs, "--help") {
				t.Fatalf("stderr %q lacks %q or a pointer to --help", errs, tc.want)
			}
		})
	}
}

// --timeout, like the connection flags, may come from DEDUPNODE_TIMEOUT,
// and a bad value there is a usage error naming the variable.
func TestTimeoutFromEnvironment(t *testing.T) {
	t.Setenv("DEDUPNODE_TIMEOUT", "soon")
	code, out, errs := runCLI(t, context.Background(), "", "mark", "--addr", closedAddr(t), "x")
	if code != exitUsage || out != "" || !strings.Contains(errs, "DEDUPNODE_TIMEOUT") {
		t.Fatalf("bad DEDUPNODE_TIMEOUT: exit %d, stdout %q, stderr %q; want a usage error naming it", code, out, errs)
	}
	// A well-formed value is applied: 0s then fails --timeout's own check.
	t.Setenv("DEDUPNODE_TIMEOUT", "0s")
	code, _, errs = runCLI(t, context.Background(), "", "mark", "--addr", closedAddr(t), "x")
	if code != exitUsage || !strings.Contains(errs, "DEDUPNODE_TIMEOUT must be positive") {
		t.Fatalf("DEDUPNODE_TIMEOUT=0s: exit %d, stderr %q; want --timeout's check to refuse it, naming the variable", code, errs)
	}
	// The flag still wins over the variable.
	code, _, errs = runCLI(t, context.Background(), "", "mark", "--addr", closedAddr(t), "--timeout", "1s", "x")
	if code != exitError {
		t.Fatalf("--timeout 1s over DEDUPNODE_TIMEOUT=0s: exit %d, stderr %q; want the dial error, exit 1", code, errs)
	}
}

func TestUnreachableClusterExits1WithHint(t *testing.T) {
	addr := closedAddr(t)
	code, out, errs := runCLI(t, context.Background(), "", "mark", "--addr", addr, "--timeout", "1s", "order-1")
	if code != exitError {
		t.Fatalf("exit %d, want 1; stderr %q", code, errs)
	}
	if out != "" {
		t.Fatalf("stdout %q, want nothing", out)
	}
	assertOneLine(t, errs)
	for _, want := range []string{"dedupnode mark:", addr, "dedupnode dev", "--addr"} {
		if !strings.Contains(errs, want) {
			t.Fatalf("stderr %q lacks %q", errs, want)
		}
	}
}

func TestHelpExits0AndTeaches(t *testing.T) {
	for _, cmd := range []string{"mark", "check", "claim", "commit", "renew", "release", "forget", "serve", "dev", "status", "namespace", "members", "join", "remove", "transfer-leader"} {
		code, out, _ := runCLI(t, context.Background(), "", cmd, "--help")
		if code != exitOK || !strings.Contains(out, "Examples:") {
			t.Fatalf("%s --help: exit %d, examples shown: %v", cmd, code, strings.Contains(out, "Examples:"))
		}
	}
}

func TestServeFlagsFromEnvironmentFlagsWin(t *testing.T) {
	t.Setenv("DEDUPNODE_NODE_ID", "from-env")
	t.Setenv("DEDUPNODE_DATA_DIR", t.TempDir())
	t.Setenv("DEDUPNODE_PEERS", "from-env=127.0.0.1:7000=127.0.0.1:7070,b=127.0.0.1:7001=127.0.0.1:7071")
	t.Setenv("DEDUPNODE_MAX_BATCH", "77")
	t.Setenv("DEDUPNODE_GRPC_ADDR", "127.0.0.1:9999")
	t.Setenv("DEDUPNODE_RAFT_TRAILING_LOGS", "512")
	t.Setenv("DEDUPNODE_RAFT_LOG_MAX_BYTES", "64MiB")
	t.Setenv("DEDUPNODE_RAFT_LOG_STORE", "boltdb")
	e := &env{ctx: context.Background(), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	cmd := newServeCmd(e)
	if err := cmd.ParseFlags([]string{"--grpc-addr", "127.0.0.1:7070"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd.Flags(), serveFlagNames...); err != nil {
		t.Fatal(err)
	}
	f := &serveFlags{}
	fs := cmd.Flags()
	f.nodeID, _ = fs.GetString("node-id")
	f.dataDir, _ = fs.GetString("data-dir")
	f.peers, _ = fs.GetString("peers")
	f.maxBatch, _ = fs.GetInt("max-batch")
	f.grpcAddr, _ = fs.GetString("grpc-addr")
	f.raftAddr, _ = fs.GetString("raft-addr")
	f.bloomExpected, _ = fs.GetUint("bloom-expected-per-bucket")
	f.bloomFPRate, _ = fs.GetFloat64("bloom-fp-rate")
	f.logLevel, _ = fs.GetString("log-level")
	f.logFormat, _ = fs.GetString("log-format")
	f.snapThreshold, _ = fs.GetUint64("raft-snapshot-threshold")
	f.snapInterval, _ = fs.GetDuration("raft-snapshot-interval")
	f.trailingLogs, _ = fs.GetUint64("raft-trailing-logs")
	f.maxLogBytes, _ = fs.GetString("raft-log-max-bytes")
	f.raftLogStore, _ = fs.GetString("raft-log-store")
	f.maxClockOff, _ = fs.GetDuration("max-clock-offset")
	cfg, _, err := f.config(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster.LogStore != cluster.LogStoreBoltDB {
		t.Fatalf("DEDUPNODE_RAFT_LOG_STORE not applied: %q", cfg.Cluster.LogStore)
	}
	if cfg.Cluster.NodeID != "from-env" || cfg.MaxBatch != 77 || len(cfg.Cluster.Peers) != 2 {
		t.Fatalf("env not applied: %+v", cfg)
	}
	if cfg.Cluster.TrailingLogs != 512 || cfg.Cluster.SnapshotThreshold != 8192 || cfg.Cluster.SnapshotInterval != 2*time.Minute || cfg.Cluster.MaxLogBytes != 64<<20 {
		t.Fatalf("raft log retention: trailing %d, threshold %d, interval %v, max bytes %d", cfg.Cluster.TrailingLogs, cfg.Cluster.SnapshotThreshold, cfg.Cluster.SnapshotInterval, cfg.Cluster.MaxLogBytes)
	}
	if cfg.ListenAddr != "127.0.0.1:7070" {
		t.Fatalf("--grpc-addr on the command line must beat DEDUPNODE_GRPC_ADDR, got %s", cfg.ListenAddr)
	}

	t.Setenv("DEDUPNODE_MAX_BATCH", "lots")
	cmd = newServeCmd(e)
	if err := applyEnv(cmd.Flags(), serveFlagNames...); err == nil || !strings.Contains(err.Error(), "DEDUPNODE_MAX_BATCH") {
		t.Fatalf("a bad env value must be a usage error naming the variable, got %v", err)
	}
}

func TestDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30s": 30 * time.Second, "5m": 5 * time.Minute, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "0": 0,
	} {
		got, err := parseDuration(in)
		if err != nil || got != want {
			t.Fatalf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"soon", "1.5d", "-5s", "d"} {
		if _, err := parseDuration(bad); err == nil {
			t.Fatalf("parseDuration(%q) must fail", bad)
		}
	}
	for d, want := range map[time.Duration]string{
		7 * 24 * time.Hour: "7d", 36 * time.Hour: "1d12h", 5 * time.Minute: "5m", 90 * time.Minute: "1h30m", 30 * time.Second: "30s", 0: "0s",
	} {
		if got := fmtDuration(d); got != want {
			t.Fatalf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestBatchesReadStdinInOrder(t *testing.T) {
	var got [][]string
	var spans []string
	err := batches([]string{"a", "-", "z"}, strings.NewReader("b\r\n\nc\nd\n"), 2, func(b batch) error {
		got = append(got, append([]string(nil), b.entries...))
		s := b.span()
		if b.sent > 0 {
			s = fmt.Sprintf("%s after %d: %s", s, b.sent, b.sentSpan())
		}
		spans = append(spans, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"a", "b"}, {"c", "d"}, {"z"}}
	if len(got) != len(want) {
		t.Fatalf("batches = %q, want %q", got, want)
	}
	for i := range want {
		if strings.Join(got[i], ",") != strings.Join(want[i], ",") {
			t.Fatalf("batches = %q, want %q", got, want)
		}
	}
	// Lines count as in the input, the skipped empty line 2 included.
	wantSpans := []string{"argument 1 to line 1", "lines 3-4 after 2: argument 1 to line 1", "argument 3 after 4: argument 1 to line 4"}
	if strings.Join(spans, "|") != strings.Join(wantSpans, "|") {
		t.Fatalf("spans = %q, want %q", spans, wantSpans)
	}
	if err := batches([]string{"-", "-"}, strings.NewReader(""), 2, func(batch) error { return nil }); err == nil {
		t.Fatal(`"-" twice must be refused`)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDev runs `dedupnode dev` in process on free ports and returns the
// addresses from its "addrs: " line. The cluster stops at test cleanup.
func startDev(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errb := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"dev", "--base-port", "0"}, args...), strings.NewReader(""), out, errb)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("dev exited %d: %s", code, errb.String())
			}
		case <-time.After(60 * time.Second):
			t.Error("dev did not stop within 60s of cancel")
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(out.String()))
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "addrs: "); ok {
				return a
			}
		}
		select {
		case code := <-done:
			t.Fatalf("dev exited %d before printing addrs: %s", code, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("dev printed no addrs line within 60s; stdout %q stderr %q", out.String(), errb.String())
	return ""
}

func TestCLIAgainstDevCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	dir := filepath.Join(t.TempDir(), "dev")
	addrs := startDev(t, "--data-dir", dir)
	if _, err := os.Stat(filepath.Join(dir, devPortsFile)); err != nil {
		t.Fatalf("dev with --base-port 0 must keep its ports: %v", err)
	}
	ctx := context.Background()

	// Blank lines on stdin (empty, spaces, a CRLF's CR) are no IDs.
	code, out, errs := runCLI(t, ctx, "order-2\n\n  \t\norder-3\r\n", "mark", "--addr", addrs, "order-1", "-")
	if code != 0 {
		t.Fatalf("mark: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("mark printed %q, want 3 lines", out)
	}
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if f[0] != []string{"order-1", "order-2", "order-3"}[i] || f[1] != "new" || !strings.HasPrefix(f[2], "expires_at=") {
			t.Fatalf("mark line %q: want ID<TAB>new<TAB>expires_at=...", l)
		}
	}

	code, out, errs = runCLI(t, ctx, "", "mark", "--addr", addrs, "--output", "json", "order-1", "order-9")
	if code != 0 {
		t.Fatalf("mark json: exit %d: %s", code, errs)
	}
	var objs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not one JSON object: %v", l, err)
		}
		objs = append(objs, m)
	}
	if len(objs) != 2 || objs[0]["id"] != "order-1" || objs[0]["result"] != "duplicate" || objs[1]["result"] != "new" {
		t.Fatalf("mark json = %v", objs)
	}
	for _, k := range []string{"first_seen", "expires_at", "state"} {
		if _, ok := objs[0][k]; !ok {
			t.Fatalf("mark json %v lacks %s", objs[0], k)
		}
	}

	code, out, _ = runCLI(t, ctx, "", "check", "--addr", addrs, "order-1", "nope")
	if code != 0 || !strings.HasPrefix(out, "order-1\tseen") || !strings.Contains(out, "nope\tnot_seen") {
		t.Fatalf("check: exit %d out %q", code, out)
	}
	// A check of a namespace that does not exist is an error naming it,
	// on dev as on serve (it answered not_seen), and creates nothing; the
	// first write does.
	code, out, errs = runCLI(t, ctx, "", "check", "--addr", addrs, "-n", "nope", "x")
	if code != exitError || out != "" || !strings.Contains(errs, `namespace "nope" does not exist`) {
		t.Fatalf("check -n nope: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	assertOneLine(t, errs)
	if code, out, errs = runCLI(t, ctx, "", "mark", "--addr", addrs, "-n", "nope", "x"); code != 0 || !strings.HasPrefix(out, "x\tnew") {
		t.Fatalf("mark -n nope: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, errs = runCLI(t, ctx, "", "check", "--addr", addrs, "-n", "nope", "x", "y"); code != 0 || !strings.HasPrefix(out, "x\tseen") || !strings.Contains(out, "y\tnot_seen") {
		t.Fatalf("check -n nope after the first mark: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	code, out, errs = runCLI(t, ctx, "", "claim", "--addr", addrs, "--output", "json", "--lease", "1m", "job-1")
	if code != 0 {
		t.Fatalf("claim: %d %s", code, errs)
	}
	var cl struct {
		ID           string `json:"id"`
		Result       string `json:"result"`
		Lease        string `json:"lease"`
		FencingToken uint64 `json:"fencing_token"`
	}
	if err := json.Unmarshal([]byte(out), &cl); err != nil || cl.Result != "acquired" || cl.FencingToken == 0 || !strings.HasPrefix(cl.Lease, strconv.FormatUint(cl.FencingToken, 10)+".") {
		t.Fatalf("claim json %q: %+v %v", out, cl, err)
	}
	code, out, _ = runCLI(t, ctx, "", "claim", "--addr", addrs, "job-1")
	if code != 0 || !strings.HasPrefix(out, "job-1\tin_progress") {
		t.Fatalf("second claim: %d %q", code, out)
	}
	tok := func(n uint64) string {
		return "job-1=" + strconv.FormatUint(n, 10) + cl.Lease[strings.IndexByte(cl.Lease, '.'):]
	}
	code, out, _ = runCLI(t, ctx, "", "commit", "--addr", addrs, tok(cl.FencingToken+100))
	if code != 0 || !strings.HasPrefix(out, "job-1\tlease_lost") {
		t.Fatalf("commit with a wrong token: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "commit", "--addr", addrs, "job-1="+cl.Lease)
	if code != 0 || !strings.HasPrefix(out, "job-1\tok") {
		t.Fatalf("commit: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "claim", "--addr", addrs, "job-1")
	if code != 0 || !strings.HasPrefix(out, "job-1\tduplicate") {
		t.Fatalf("claim after commit: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "forget", "--addr", addrs, "order-1")
	if code != 0 || out != "order-1\tok\n" {
		t.Fatalf("forget: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "check", "--addr", addrs, "--consistency", "linearizable", "order-1")
	if code != 0 || !strings.HasPrefix(out, "order-1\tnot_seen") {
		t.Fatalf("check after forget: %d %q", code, out)
	}

	code, out, errs = runCLI(t, ctx, "", "status", "--addr", addrs, "--output", "json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errs)
	}
	var st struct {
		LeaderID string `json:"leader_id"`
		Term     uint64 `json:"term"`
		Members  []struct {
			ID       string `json:"id"`
			RaftAddr string `json:"raft_addr"`
			GRPCAddr string `json:"grpc_addr"`
			Suffrage string `json:"suffrage"`
		} `json:"members"`
		IDsStored *uint64         `json:"ids_stored"`
		Bloom     json.RawMessage `json:"bloom"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json %q: %v", out, err)
	}
	if st.LeaderID == "" || st.Term == 0 || len(st.Members) != 3 || st.IDsStored == nil || len(st.Bloom) == 0 {
		t.Fatalf("status json = %s", out)
	}

	// status --wait on each node returns once it has applied the log up to
	// the leader's commit index (at least what the writes above reached).
	var leaderCommit uint64
	for _, m := range st.Members {
		if m.ID != st.LeaderID {
			continue
		}
		code, out, errs = runCLI(t, ctx, "", "status", "--addr", m.GRPCAddr, "-o", "json")
		var ls struct {
			CommitIndex uint64 `json:"commit_index"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || ls.CommitIndex == 0 {
			t.Fatalf("leader status: %d %q %s", code, out, errs)
		}
		leaderCommit = ls.CommitIndex
	}
	for _, m := range st.Members {
		code, out, errs = runCLI(t, ctx, "", "status", "--addr", m.GRPCAddr, "--wait", "-o", "json")
		var ws struct {
			NodeID       string `json:"node_id"`
			LeaderID     string `json:"leader_id"`
			AppliedIndex uint64 `json:"applied_index"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &ws) != nil || ws.NodeID != m.ID || ws.LeaderID == "" || ws.AppliedIndex < leaderCommit {
			t.Fatalf("status --wait on %s: %d %q %s; leader commit index %d", m.ID, code, out, errs, leaderCommit)
		}
	}
	for _, m := range st.Members {
		if m.ID == "" || m.RaftAddr == "" || m.GRPCAddr == "" || m.Suffrage != "voter" {
			t.Fatalf("member %+v", m)
		}
	}
	code, out, _ = runCLI(t, ctx, "", "status", "--addr", addrs)
	if code != 0 || !strings.Contains(out, "leader") || !strings.Contains(out, "SUFFRAGE") {
		t.Fatalf("status text: %d %q", code, out)
	}

	code, out, errs = runCLI(t, ctx, "", "namespace", "create", "--addr", addrs, "payments", "--ttl", "5m", "--max-ttl", "1h", "--mode", "sliding")
	if code != 0 || !strings.Contains(out, "payments") || !strings.Contains(out, "sliding") {
		t.Fatalf("namespace create: %d %q %s", code, out, errs)
	}
	code, _, errs = runCLI(t, ctx, "", "namespace", "create", "--addr", addrs, "payments")
	if code != exitError {
		t.Fatalf("creating a namespace twice: exit %d, want 1", code)
	}
	assertOneLine(t, errs)
	// A setting the node refuses is told in the flags' terms, not its
	// protobuf fields': a default TTL above the max TTL, on create and on
	// an update that lowers the max TTL under the default.
	for _, args := range [][]string{
		{"create", "--addr", addrs, "refunds", "--ttl", "2h", "--max-ttl", "1h"},
		{"update", "--addr", addrs, "payments", "--max-ttl", "1m"},
	} {
		code, out, errs = runCLI(t, ctx, "", append([]string{"namespace"}, args...)...)
		if code != exitError || out != "" || !strings.Contains(errs, "the default TTL (--ttl) must be") || !strings.Contains(errs, "--max-ttl") {
			t.Fatalf("namespace %v: exit %d, stdout %q, stderr %q; want the rule in the flags' terms", args, code, out, errs)
		}
		assertOneLine(t, errs)
	}
	code, out, _ = runCLI(t, ctx, "", "namespace", "describe", "--addr", addrs, "-o", "json", "payments")
	var ns map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &ns) != nil || ns["default_ttl_ms"] != float64(300000) || ns["mode"] != "sliding" {
		t.Fatalf("describe: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "namespace", "list", "--addr", addrs)
	if code != 0 || !strings.Contains(out, "default") || !strings.Contains(out, "payments") {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, _ = runCLI(t, ctx, "", "members", "--addr", addrs, "-o", "json")
	if code != 0 || strings.Count(out, "\n") != 3 {
		t.Fatalf("members: %d %q", code, out)
	}
	// A --batch above the node's limit is blamed, not the IDs.
	var many strings.Builder
	for i := range 10_001 {
		fmt.Fprintf(&many, "batch-%d\n", i)
	}
	code, _, errs = runCLI(t, ctx, many.String(), "mark", "--addr", addrs, "--batch", "20000", "-")
	if code != exitError || !strings.Contains(errs, "--batch 20000: the node refused a batch of 10001 IDs") || !strings.Contains(errs, "smaller --batch") {
		t.Fatalf("--batch over the node's limit: exit %d stderr %q", code, errs)
	}
	assertOneLine(t, errs)
	code, _, errs = runCLI(t, ctx, "", "mark", "--addr", addrs, "--namespace", "payments", "--ttl", "2h", "x")
	if code != exitError || !strings.Contains(errs, "--ttl 2h exceeds the max TTL of namespace payments (1h)") {
		t.Fatalf("ttl over the namespace's max: exit %d stderr %q", code, errs)
	}
	assertOneLine(t, errs)
}

// Issue 14: 'dedupnode version' and '--version' say which build this is:
// version, commit and Go version.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errs := runCLI(t, context.Background(), "", args...)
		if code != 0 || errs != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errs)
		}
		if !strings.HasPrefix(out, "dedupnode ") || !strings.Contains(out, ", commit ") || !strings.Contains(out, runtime.Version()) {
			t.Fatalf("%v: %q lacks the version, commit or Go version (%s)", args, out, runtime.Version())
		}
	}
}

// Issue 14: --bootstrap or --peers given to a data dir that already holds
// a cluster's state is ignored by Raft; serve says so instead of letting
// the operator believe a new cluster was formed. (The run stops on a later
// usage error, after the warning: no node needs to start for the check.)
func TestServeWarnsWhenBootstrapMeetsExistingState(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "raft"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "raft", "raft.db"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range [][]string{{"--bootstrap"}, {"--peers", "n1=127.0.0.1:1=127.0.0.1:2"}} {
		args := append([]string{"serve", "--node-id", "n1", "--data-dir", dir, "--tls-cert", "x"}, mode...)
		code, _, errs := runCLI(t, context.Background(), "", args...)
		if code != exitUsage || !strings.Contains(errs, "already holds a cluster's state: "+mode[0]+" is ignored") {
			t.Fatalf("%v: exit %d, stderr %q", mode, code, errs)
		}
	}
	// A fresh data dir gets no such warning.
	code, _, errs := runCLI(t, context.Background(), "", "serve", "--node-id", "n1", "--data-dir", t.TempDir(), "--bootstrap", "--tls-cert", "x")
	if code != exitUsage || strings.Contains(errs, "already holds") {
		t.Fatalf("fresh dir: exit %d, stderr %q", code, errs)
	}
}

// Without --raft-log-store, serve opens the store the data dir already
// holds: a node created with boltdb (the default before wal) starts after
// an upgrade with the same command line. A new data dir gets wal; naming
// the other store explicitly is still refused.
func TestServeLogStoreFollowsTheDataDir(t *testing.T) {
	empty := t.TempDir()
	bolt := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bolt, "raft"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bolt, "raft", "raft.db"), []byte("bolt"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, flag string
		want      cluster.LogStore
		wantErr   string
	}{
		{dir: empty, want: cluster.DefaultLogStore},
		{dir: bolt, want: cluster.LogStoreBoltDB},
		{dir: bolt, flag: "boltdb", want: cluster.LogStoreBoltDB},
		{dir: bolt, flag: "wal", wantErr: "start it with --raft-log-store boltdb"},
		{dir: empty, flag: "rocks", wantErr: `--raft-log-store "rocks"`},
	} {
		f := &serveFlags{dataDir: tc.dir, raftLogStore: tc.flag}
		got, err := f.logStore()
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s with --raft-log-store %q: error %v, want one containing %q", tc.dir, tc.flag, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s with --raft-log-store %q: %v", tc.dir, tc.flag, err)
		case got != tc.want:
			t.Errorf("%s with --raft-log-store %q: opened %s, want %s", tc.dir, tc.flag, got, tc.want)
		}
	}
}
