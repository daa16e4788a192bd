package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/testcluster"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tlsListener serves TLS handshakes (and nothing else) with a node
// certificate made by 'dedupnode certs'; it returns its address and the CA.
func tlsListener(t *testing.T) (addr, ca string) {
	t.Helper()
	return tlsListenerAuth(t, tls.NoClientCert)
}

// tlsListenerAuth is tlsListener asking for client certificates as auth
// says.
func tlsListenerAuth(t *testing.T, auth tls.ClientAuthType) (addr, ca string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if code, _, errb := runCLI(t, context.Background(), "", "certs", "--out", dir, "--nodes", "n1"); code != 0 {
		t.Fatalf("certs: %s", errb)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, ClientAuth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	return l.Addr().String(), filepath.Join(dir, "ca.crt")
}

// plainGRPC serves plaintext gRPC (no services) on a free port.
func plainGRPC(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// A TLS/plaintext mismatch does not heal: the CLI says which side speaks
// what and stops at once instead of retrying until --timeout.
func TestTLSMismatchFailsFastWithHint(t *testing.T) {
	tlsAddr, ca := tlsListener(t)
	plainAddr := plainGRPC(t)
	mtlsAddr, mtlsCA := tlsListenerAuth(t, tls.RequireAnyClientCert)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"plaintext client, TLS node", []string{"--addr", tlsAddr}, "the node speaks TLS: pass --tls-ca"},
		{"TLS client, plaintext node", []string{"--addr", plainAddr, "--tls-ca", ca}, "the node speaks plaintext"},
		{"TLS client without certificate, mutual TLS node", []string{"--addr", mtlsAddr, "--tls-ca", mtlsCA},
			"the node requires a client certificate: pass --tls-cert and --tls-key (DEDUPNODE_TLS_CERT/KEY)"},
	}
	for _, tc := range cases {
		for _, cmd := range [][]string{{"mark", "x"}, {"status"}} {
			t.Run(tc.name+"/"+cmd[0], func(t *testing.T) {
				start := time.Now()
				args := append(append(append([]string{}, cmd[:1]...), tc.args...), append([]string{"--timeout", "30s"}, cmd[1:]...)...)
				code, _, errs := runCLI(t, context.Background(), "", args...)
				if code != exitError || !strings.Contains(errs, tc.want) {
					t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errs, tc.want)
				}
				assertOneLine(t, errs)
				if el := time.Since(start); el > 10*time.Second {
					t.Fatalf("took %v: a mismatch must not be retried until --timeout", el)
				}
			})
		}
	}
}

// When no node ever accepted a connection, the CLI gives up within seconds
// (refusedGrace), not at --timeout, and says to start a node.
func TestRefusedEverywhereFailsWithinSeconds(t *testing.T) {
	addrs := closedAddr(t) + "," + closedAddr(t)
	start := time.Now()
	code, _, errs := runCLI(t, context.Background(), "", "mark", "--addr", addrs, "--timeout", "60s", "x")
	if code != exitError || !strings.Contains(errs, "dedupnode dev") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	assertOneLine(t, errs)
	if el := time.Since(start); el > refusedGrace+10*time.Second {
		t.Fatalf("took %v with every address refusing", el)
	}
}

// Errors are one short line in the node's words: no client or gRPC
// wrapping, no hint twice. The node's error details (not its text) say
// what happened.
func TestExplainStripsWrappingAndDuplicateHints(t *testing.T) {
	f := &clientFlags{addrs: []string{"127.0.0.1:7070"}, timeout: 15 * time.Second}
	wrap := func(err error) error { // as a caller may wrap a client error
		return fmt.Errorf("dedupnode mark via 127.0.0.1:7070: %w", err)
	}
	withInfo := func(code codes.Code, msg, reason string, md map[string]string) error {
		st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Domain: dedupv1.ErrorDomain, Reason: reason, Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	cases := []struct {
		err       error
		namespace string
		want      string
	}{
		{withInfo(codes.NotFound, `namespace "orders" not found; create it first (dedupnode namespace create)`, dedupv1.ReasonNamespaceNotFound,
			map[string]string{dedupv1.MetaMessage: `namespace "orders" not found`, dedupv1.MetaNamespace: "orders"}), "",
			`namespace "orders" does not exist; create it with 'dedupnode namespace create orders' (list them with 'dedupnode namespace list')`},
		{wrap(withInfo(codes.InvalidArgument, "items[0].id: empty message ID; nothing was applied", dedupv1.ReasonInvalidArgument,
			map[string]string{dedupv1.MetaMessage: "items[0].id: empty message ID"})), "",
			"request rejected, nothing applied: items[0].id: empty message ID; fix the input and retry"},
		{wrap(status.Error(codes.Unauthenticated, `missing token: send metadata "authorization: Bearer <token>" (CLI: --token or DEDUPNODE_TOKEN)`)), "",
			"not authenticated: the cluster requires a token and none was given; pass a token the cluster's auth file lists, with --token or DEDUPNODE_TOKEN"},
		{fmt.Errorf("%w: %w", context.DeadlineExceeded, withInfo(codes.Unavailable, "not the raft leader (no leader known); no leader reachable right now; nothing was written, retry is safe with the same request token",
			dedupv1.ReasonNotLeader, map[string]string{dedupv1.MetaMessage: "not the raft leader (no leader known)"})), "",
			"cluster at 127.0.0.1:7070 unavailable for --timeout 15s: not the raft leader (no leader known); a majority"},
	}
	for _, tc := range cases {
		err := explain(tc.err, f, tc.namespace)
		var oe *opError
		if !errors.As(err, &oe) {
			t.Fatalf("explain(%v) = %T", tc.err, err)
		}
		got := oe.Error() + "; " + oe.hint
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("explain:\n got %q\nwant %q...", got, tc.want)
		}
		for _, noise := range []string{"rpc error", "desc =", "via 127", "attempt", "create it first"} {
			if strings.Contains(got, noise) {
				t.Errorf("explain: %q has %q", got, noise)
			}
		}
	}
}

// Issue 14: a node's Raft port given as --addr is named as a port that is
// not gRPC (as a Raft port does, it closes the connection without a word),
// not as "the node speaks TLS", and the CLI stops at once.
func TestRaftPortAsAddrIsNamed(t *testing.T) {
	srvs, _ := testcluster.Start(t, 1, nil)
	raft := srvs[0].RaftAddr()
	start := time.Now()
	code, _, errs := runCLI(t, context.Background(), "", "status", "--addr", raft, "--timeout", "30s")
	if code != exitError || !strings.Contains(errs, "is not a dedupnode gRPC port") || !strings.Contains(errs, "Raft port") || strings.Contains(errs, "speaks TLS") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	assertOneLine(t, errs)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %v: a wrong port must not be retried until --timeout", el)
	}
}

// Issue 14: 'status --wait' stops at once on an error waiting does not
// heal (here a TLS mismatch) instead of polling until --timeout.
func TestStatusWaitStopsOnErrorsThatDoNotHeal(t *testing.T) {
	tlsAddr, _ := tlsListener(t)
	start := time.Now()
	code, _, errs := runCLI(t, context.Background(), "", "status", "--wait", "--addr", tlsAddr, "--timeout", "60s")
	if code != exitError || !strings.Contains(errs, "the node speaks TLS") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("status --wait took %v on a TLS mismatch (--timeout 60s): it must stop at once", el)
	}
}

// Issue 14 item 2: webhook-proxy dials the cluster through the connection
// flags every command shares (--addr, --tls-*, --token, --timeout) and
// explains failures as they do, without the old "start one" hint.
func TestWebhookProxySharesConnectionFlags(t *testing.T) {
	tlsAddr, ca := tlsListener(t)
	base := []string{"webhook-proxy", "--upstream", "http://127.0.0.1:9", "--id-header", "Webhook-Id", "--listen", "127.0.0.1:0", "--timeout", "20s"}
	code, _, errs := runCLI(t, context.Background(), "", append(base, "--addr", tlsAddr)...)
	if code != exitError || !strings.Contains(errs, "the node speaks TLS: pass --tls-ca") {
		t.Fatalf("plaintext proxy, TLS node: exit %d, stderr %q", code, errs)
	}
	// With --tls-ca it speaks TLS (the listener serves no gRPC: it fails
	// later, but not on the flag or the handshake).
	code, _, errs = runCLI(t, context.Background(), "", append(base, "--addr", tlsAddr, "--tls-ca", ca, "--timeout", "2s")...)
	if code != exitError || strings.Contains(errs, "unknown flag") || strings.Contains(errs, "speaks TLS") {
		t.Fatalf("--tls-ca: exit %d, stderr %q", code, errs)
	}
	code, _, errs = runCLI(t, context.Background(), "", append(base, "--addr", closedAddr(t))...)
	if code != exitError || !strings.Contains(errs, "accepts connections") || strings.Contains(errs, "start one") {
		t.Fatalf("closed address: exit %d, stderr %q", code, errs)
	}
}

// An --addr whose host name does not resolve is named as such at once,
// not as a cluster without a majority after --timeout (gRPC reports the
// failed lookup only as text). Among addresses that resolve it is no
// error: one reachable node is enough, and a failure mentions it.
func TestUnresolvableHostIsNamed(t *testing.T) {
	const bad = "nosuchhost.invalid:7000" // .invalid never resolves (RFC 2606)
	for _, args := range [][]string{
		{"mark", "--addr", bad, "--timeout", "60s", "x"},
		{"status", "--addr", bad + ",other.invalid:7001", "--timeout", "60s"},
	} {
		code, out, errs := runCLI(t, context.Background(), "", args...)
		if code != exitError || out != "" {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", args[0], code, out, errs)
		}
		assertOneLine(t, errs)
		for _, want := range []string{"the host name of " + bad, "could not be resolved", "check the host names in --addr"} {
			if !strings.Contains(errs, want) {
				t.Errorf("%s: stderr %q lacks %q", args[0], errs, want)
			}
		}
		if strings.Contains(errs, "majority") {
			t.Errorf("%s: stderr %q blames the cluster's majority", args[0], errs)
		}
	}

	srvs, _ := testcluster.Start(t, 1, nil)
	code, out, errs := runCLI(t, context.Background(), "", "mark", "--addr", bad+","+srvs[0].GRPCAddr(), "x")
	if code != exitOK || !strings.HasPrefix(out, "x\tnew") {
		t.Fatalf("with a reachable node besides: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, _, errs = runCLI(t, context.Background(), "", "mark", "--addr", bad+","+closedAddr(t), "--timeout", "60s", "x")
	if code != exitError || !strings.Contains(errs, "the host name of "+bad+" could not be resolved: check --addr") {
		t.Fatalf("with a stopped node besides: exit %d, stderr %q", code, errs)
	}
	assertOneLine(t, errs)
}
