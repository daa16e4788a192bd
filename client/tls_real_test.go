package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/security"
	"github.com/dedupnode/dedupnode/server"
)

// A client with the cluster's CA but no client certificate, against nodes
// that require one (mutual TLS), fails at once with ErrTLSMismatch and
// TLSClientCertRequired (the node's "certificate required" alert, seen after
// the client's side of the TLS 1.3 handshake completed), not with
// ErrUnavailable once its whole deadline has passed.
func TestMutualTLSWithoutClientCertIsATLSMismatch(t *testing.T) {
	dir := t.TempDir()
	if _, err := security.WriteDevPKI(dir, security.DevPKIOptions{Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	kp, err := security.LoadKeyPair(filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key"))
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := security.ServerTLS(kp, ca, "")
	if err != nil {
		t.Fatal(err)
	}
	peerTLS, err := security.ClientTLS(ca, kp, "")
	if err != nil {
		t.Fatal(err)
	}
	cl := testcluster.New(t, devcluster.Config{Nodes: 1, Tune: func(_ int, cfg *server.Config) {
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.Creds(credentials.NewTLS(srvTLS)))
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(credentials.NewTLS(peerTLS)))
	}})
	for _, tc := range []struct {
		name    string
		maxVers uint16
	}{{"TLS 1.3", 0}, {"TLS 1.2", tls.VersionTLS12}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := security.ClientTLS(ca, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxVersion = tc.maxVers
			// The deadline is generous: failing fast is asserted by the
			// kind (a timeout would be ErrUnavailable with the deadline).
			ctx := testCtx(t, 60*time.Second)
			c, err := client.New(ctx, cl.Addrs(), client.WithTLS(cfg), testcluster.PatientRetry)
			if err == nil {
				defer c.Close()
				_, err = c.Status(ctx)
			}
			if !errors.Is(err, client.ErrTLSMismatch) {
				t.Fatalf("err = %v, want ErrTLSMismatch", err)
			}
			if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
				t.Fatalf("err = %v: the call waited for its deadline", err)
			}
			if p := client.TLSProblem(err); p != client.TLSClientCertRequired {
				t.Fatalf("TLSProblem = %q, want %q (err %v)", p, client.TLSClientCertRequired, err)
			}
			t.Logf("err: %v", err)
			if client.Heals(err) {
				t.Fatalf("Heals(%v) = true", err)
			}
		})
	}
}
