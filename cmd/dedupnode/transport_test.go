package main

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// tlsListener serves TLS handshakes (and nothing else) with a node
// certificate made by 'dedupnode certs'; it returns its address and the CA.
func tlsListener(t *testing.T) (addr, ca string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if code, _, errb := runCLI(t, context.Background(), "", "certs", "--out", dir, "--nodes", "n1"); code != 0 {
		t.Fatalf("certs: %s", errb)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
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
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"plaintext client, TLS node", []string{"--addr", tlsAddr}, "the node speaks TLS: pass --tls-ca"},
		{"TLS client, plaintext node", []string{"--addr", plainAddr, "--tls-ca", ca}, "the node speaks plaintext"},
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
