package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// pki is a development PKI written by WriteDevPKI into a temp dir.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p pki) keyPair(t *testing.T, name string) *KeyPair {
	t.Helper()
	kp, err := LoadKeyPair(p.path(name+".crt"), p.path(name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func newPKI(t *testing.T, nodes ...string) pki {
	t.Helper()
	dir := t.TempDir()
	if _, err := WriteDevPKI(dir, DevPKIOptions{Nodes: nodes}); err != nil {
		t.Fatal(err)
	}
	return pki{dir}
}

func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWriteDevPKIFilesSANsAndReuse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	written, err := WriteDevPKI(dir, DevPKIOptions{Nodes: []string{"n1", "n2"}, Hosts: []string{"10.0.0.7", "db.example"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ca.crt", "ca.key", "n1.crt", "n1.key", "n2.crt", "n2.key", "client.crt", "client.key"}
	var got []string
	for _, w := range written {
		got = append(got, filepath.Base(w))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("written %v, want %v", got, want)
	}
	for _, f := range want {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".key") && st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	n1 := readCert(t, filepath.Join(dir, "n1.crt"))
	if !slices.Contains(n1.DNSNames, "n1") || !slices.Contains(n1.DNSNames, "localhost") || !slices.Contains(n1.DNSNames, "db.example") {
		t.Errorf("n1 DNS SANs %v", n1.DNSNames)
	}
	var ips []string
	for _, ip := range n1.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Contains(ips, "127.0.0.1") || !slices.Contains(ips, "10.0.0.7") {
		t.Errorf("n1 IP SANs %v", ips)
	}
	if !IsNodeCertificate(n1) {
		t.Error("node certificate not recognised as a node certificate")
	}
	cl := readCert(t, filepath.Join(dir, "client.crt"))
	if IsNodeCertificate(cl) {
		t.Error("client certificate recognised as a node certificate")
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := n1.Verify(x509.VerifyOptions{Roots: pool, DNSName: "n1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("n1 does not verify as a server: %v", err)
	}
	if _, err := cl.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client does not verify as a client: %v", err)
	}

	// Existing files are not overwritten without Force.
	if _, err := WriteDevPKI(dir, DevPKIOptions{Nodes: []string{"n1"}}); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("overwrite without force: err %v", err)
	}
	// Adding a node reuses the CA.
	if _, err := WriteDevPKI(dir, DevPKIOptions{Nodes: []string{"n3"}, NoClient: true}); err != nil {
		t.Fatal(err)
	}
	n3 := readCert(t, filepath.Join(dir, "n3.crt"))
	if _, err := n3.Verify(x509.VerifyOptions{Roots: pool, DNSName: "n3"}); err != nil {
		t.Errorf("n3 not signed by the original CA: %v", err)
	}
	if _, err := WriteDevPKI(t.TempDir(), DevPKIOptions{Nodes: []string{"../x"}}); err == nil {
		t.Error("node name with a path separator accepted")
	}
}

// startTLSGRPC serves grpc.health.v1 over TLS on 127.0.0.1:0.
func startTLSGRPC(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func healthCheck(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestGRPCMutualTLSRefusesClientWithoutValidCertificate(t *testing.T) {
	p := newPKI(t, "n1")
	foreign := newPKI(t, "n1")
	srvCfg, err := ServerTLS(p.keyPair(t, "n1"), p.path("ca.crt"), "")
	if err != nil {
		t.Fatal(err)
	}
	addr := startTLSGRPC(t, srvCfg)

	good, err := ClientTLSFiles(p.path("ca.crt"), p.path("client.crt"), p.path("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := healthCheck(t, addr, good); err != nil {
		t.Fatalf("client with a valid certificate refused: %v", err)
	}

	noCert, err := ClientTLSFiles(p.path("ca.crt"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := healthCheck(t, addr, noCert); err == nil {
		t.Error("client without a certificate was served")
	}
	foreignCert, err := ClientTLSFiles(p.path("ca.crt"), foreign.path("client.crt"), foreign.path("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := healthCheck(t, addr, foreignCert); err == nil {
		t.Error("client with a certificate from another CA was served")
	}
	// And a client that does not trust the server's CA refuses the server.
	wrongRoots, err := ClientTLSFiles(foreign.path("ca.crt"), p.path("client.crt"), p.path("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := healthCheck(t, addr, wrongRoots); err == nil {
		t.Error("client accepted a server certificate from an untrusted CA")
	}
}

func TestGRPCServerTLSWithoutClientCA(t *testing.T) {
	p := newPKI(t, "n1")
	srvCfg, err := ServerTLS(p.keyPair(t, "n1"), "", p.path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	addr := startTLSGRPC(t, srvCfg)
	noCert, err := ClientTLSFiles(p.path("ca.crt"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := healthCheck(t, addr, noCert); err != nil {
		t.Fatalf("without a client CA a client needs no certificate: %v", err)
	}
	if _, err := ClientTLSFiles(p.path("ca.crt"), p.path("client.crt"), ""); err == nil {
		t.Error("cert without key accepted")
	}
}

func TestKeyPairReload(t *testing.T) {
	p := newPKI(t, "n1", "n2")
	dir := t.TempDir()
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(p.path("n1.crt"), filepath.Join(dir, "x.crt"))
	copyFile(p.path("n1.key"), filepath.Join(dir, "x.key"))
	kp, err := LoadKeyPair(filepath.Join(dir, "x.crt"), filepath.Join(dir, "x.key"))
	if err != nil {
		t.Fatal(err)
	}
	if cn := kp.Certificate().Leaf.Subject.CommonName; cn != "n1" {
		t.Fatalf("CN %q", cn)
	}
	copyFile(p.path("n2.crt"), filepath.Join(dir, "x.crt"))
	if err := kp.Reload(); err == nil {
		t.Fatal("reload with a mismatched key succeeded")
	}
	if cn := kp.Certificate().Leaf.Subject.CommonName; cn != "n1" {
		t.Fatalf("failed reload replaced the pair: CN %q", cn)
	}
	copyFile(p.path("n2.key"), filepath.Join(dir, "x.key"))
	if err := kp.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn := kp.Certificate().Leaf.Subject.CommonName; cn != "n2" {
		t.Fatalf("after reload CN %q", cn)
	}
}

// raftEnd is one Raft network transport over a TLS stream layer.
type raftEnd struct {
	trans *raft.NetworkTransport
	addr  raft.ServerAddress
}

func newRaftEnd(t *testing.T, p pki, certName string) raftEnd {
	t.Helper()
	kp := p.keyPair(t, certName)
	srv, cli, err := RaftTLS(kp, p.path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl, err := NewStreamLayer(ln, nil, srv, cli)
	if err != nil {
		t.Fatal(err)
	}
	sl.HandshakeTimeout = 5 * time.Second
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  sl,
		MaxPool: 2,
		Timeout: 10 * time.Second,
		Logger:  nil,
	})
	t.Cleanup(func() { trans.Close() })
	return raftEnd{trans: trans, addr: raft.ServerAddress(ln.Addr().String())}
}

// serveOne answers every AppendEntries on e with success and reports the
// request's term on got.
func serveOne(t *testing.T, e raftEnd) <-chan uint64 {
	got := make(chan uint64, 16)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case rpc := <-e.trans.Consumer():
				if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok {
					got <- req.Term
				}
				rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
			case <-done:
				return
			}
		}
	}()
	return got
}

func appendEntries(from, to raftEnd, term uint64) error {
	var resp raft.AppendEntriesResponse
	return from.trans.AppendEntries("target", to.addr, &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("from"), Addr: []byte(from.addr)},
		Term:      term,
	}, &resp)
}

func TestRaftStreamLayerMutualTLS(t *testing.T) {
	p := newPKI(t, "n1", "n2")
	n1 := newRaftEnd(t, p, "n1")
	n2 := newRaftEnd(t, p, "n2")
	got := serveOne(t, n2)
	if err := appendEntries(n1, n2, 7); err != nil {
		t.Fatalf("AppendEntries between nodes of one CA: %v", err)
	}
	select {
	case term := <-got:
		if term != 7 {
			t.Fatalf("term %d", term)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AppendEntries not delivered")
	}
}

func TestRaftStreamLayerRefusesForeignCA(t *testing.T) {
	p := newPKI(t, "n1", "n2")
	foreign := newPKI(t, "n1", "n3")
	legit := newRaftEnd(t, p, "n1")
	got := serveOne(t, legit)
	intruder := newRaftEnd(t, foreign, "n3")
	// Pretending to be n1 with another CA's certificate does not help.
	impostor := newRaftEnd(t, foreign, "n1")

	for _, e := range []raftEnd{intruder, impostor} {
		if err := appendEntries(e, legit, 99); err == nil {
			t.Fatal("a node with a foreign CA delivered AppendEntries")
		}
	}
	// The legitimate node cannot dial the foreign one either.
	if err := appendEntries(legit, intruder, 5); err == nil {
		t.Fatal("a node dialled a peer with a foreign CA")
	}
	// A client certificate of the right CA is not a node certificate.
	kp := p.keyPair(t, "client")
	_, cli, err := RaftTLS(kp, p.path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	sl := WrapStreamLayer(&tcpLayer{}, nil, cli)
	if c, err := sl.Dial(legit.addr, 5*time.Second); err == nil {
		// TLS 1.3: the server verifies the client after the client's side
		// of the handshake completed; the refusal shows on first read.
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, rerr := io.ReadFull(c, make([]byte, 1))
		c.Close()
		if rerr == nil {
			t.Fatal("a client certificate opened a Raft connection")
		}
	}
	// Nothing reached the legitimate node's consumer: a raw TLS-less
	// connection does not either.
	raw, err := net.Dial("tcp", string(legit.addr))
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte{0, 1, 2, 3, 'g', 'a', 'r', 'b', 'a', 'g', 'e'})
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(raw)
	raw.Close()
	// A legitimate peer still gets through, and it is the first RPC that
	// reached the consumer.
	peer := newRaftEnd(t, p, "n2")
	if err := appendEntries(peer, legit, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case term := <-got:
		if term != 3 {
			t.Fatalf("first delivered AppendEntries had term %d: a refused peer got through", term)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("legitimate AppendEntries not delivered")
	}
}
