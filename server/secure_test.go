package server_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/auth"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/security"
	"github.com/dedupnode/dedupnode/server"
)

// The tokens of secureTokens. Nodes have no token: under TLS they know
// each other by their node certificates.
const (
	opsToken    = "ops-token-0123"
	ordersToken = "orders-token-0123"
	readerToken = "reader-token-0123"
)

const secureTokens = `{"tokens": [
  {"name": "ops", "token": "ops-token-0123", "namespaces": ["*"], "rights": ["read", "write", "admin"]},
  {"name": "orders", "token": "orders-token-0123", "namespaces": ["orders"], "rights": ["read", "write"]},
  {"name": "reader", "token": "reader-token-0123", "namespaces": ["*"], "rights": ["read"]}
]}`

// securePKI is a development PKI on disk.
type securePKI struct{ dir string }

func newSecurePKI(t *testing.T, nodes ...string) securePKI {
	t.Helper()
	dir := t.TempDir()
	if _, err := security.WriteDevPKI(dir, security.DevPKIOptions{Nodes: nodes}); err != nil {
		t.Fatal(err)
	}
	return securePKI{dir}
}

func (p securePKI) file(name string) string { return filepath.Join(p.dir, name) }

// secureTune returns what makes node id's config serve TLS on gRPC,
// between nodes and on Raft, mutual TLS for clients, and tokens from
// secureTokens (the keys, certificates and tokens are loaded here, once).
func secureTune(t *testing.T, p securePKI, id string) func(*server.Config) {
	t.Helper()
	kp, err := security.LoadKeyPair(p.file(id+".crt"), p.file(id+".key"))
	if err != nil {
		t.Fatal(err)
	}
	ca := p.file("ca.crt")
	srvTLS, err := security.ServerTLS(kp, ca, ca)
	if err != nil {
		t.Fatal(err)
	}
	peerTLS, err := security.ClientTLS(ca, kp, "")
	if err != nil {
		t.Fatal(err)
	}
	rsrv, rcli, err := security.RaftTLS(kp, ca)
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokFile, []byte(secureTokens), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := security.LoadCertPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	authz := &auth.Authorizer{Tokens: store, TrustNodeCertificates: true, NodeRoots: roots}
	return func(cfg *server.Config) {
		cfg.Cluster.WrapRaftStream = func(inner raft.StreamLayer) raft.StreamLayer {
			return security.WrapStreamLayer(inner, rsrv, rcli)
		}
		cfg.ServerOptions = []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS)), grpc.ChainStreamInterceptor(authz.StreamServerInterceptor())}
		cfg.CallInterceptors = []grpc.UnaryServerInterceptor{authz.UnaryServerInterceptor()}
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(peerTLS))}
		cfg.AdminAddr = "127.0.0.1:0"
	}
}

func listenTCP(t *testing.T) net.Listener {
	t.Helper()
	return testcluster.Listen(t)
}

// startSecureCluster starts a static cluster of the named nodes
// (devcluster) with TLS everywhere and tokens (secureTune), and waits
// until a ready leader is known to every node.
func startSecureCluster(t *testing.T, p securePKI, ids ...string) (*devcluster.Cluster, []*server.Server) {
	t.Helper()
	tunes := map[string]func(*server.Config){}
	var addrs []devcluster.Node
	for _, id := range ids {
		tunes[id] = secureTune(t, p, id)
		addrs = append(addrs, devcluster.Node{ID: id, GRPC: "127.0.0.1:0", Raft: "127.0.0.1:0"})
	}
	c := testcluster.New(t, devcluster.Config{Addrs: addrs, Logger: newTestLogger(t), Tune: func(_ int, cfg *server.Config) {
		if tune := tunes[cfg.Cluster.NodeID]; tune != nil { // nodes added later bring their own
			tune(cfg)
		}
	}})
	return c, c.Servers()
}

// dialAs connects to addr over TLS with the client certificate certName
// ("" for none) and token ("" for none).
func dialAs(t *testing.T, p securePKI, addr, certName, token string) *grpc.ClientConn {
	t.Helper()
	var kp *security.KeyPair
	if certName != "" {
		var err error
		if kp, err = security.LoadKeyPair(p.file(certName+".crt"), p.file(certName+".key")); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := security.ClientTLS(p.file("ca.crt"), kp, "")
	if err != nil {
		t.Fatal(err)
	}
	return dialTLS(t, addr, cfg, token)
}

func dialTLS(t *testing.T, addr string, cfg *tls.Config, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.TokenCredentials(token)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d\n%s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestSecureClusterTLSEverywhereAndTokens runs a 3-node cluster with TLS on
// gRPC (mutual, for clients), between nodes and on Raft, with access
// control: writes sent to followers are forwarded, linearizable checks use
// the leader's read index, each node's admin listener serves metrics and the
// status page, and clients without a certificate, without a token or
// without the right are refused with the right code.
func TestSecureClusterTLSEverywhereAndTokens(t *testing.T) {
	p := newSecurePKI(t, "n1", "n2", "n3")
	_, srvs := startSecureCluster(t, p, "n1", "n2", "n3")
	ctx := callCtx(t)

	ops := dialAs(t, p, srvs[0].GRPCAddr(), "client", opsToken)
	if _, err := dedupv1.NewAdminClient(ops).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders"}}); err != nil {
		t.Fatalf("create namespace with the admin token: %v", err)
	}

	// Mark through every node (followers forward to the leader), each
	// with a fresh ID; then check every ID through every node.
	var ids [][]byte
	for i, s := range srvs {
		id := []byte(fmt.Sprintf("order-%d", i))
		ids = append(ids, id)
		c := dedupv1.NewDedupClient(dialAs(t, p, s.GRPCAddr(), "client", ordersToken))
		resp, err := c.Mark(ctx, &dedupv1.MarkRequest{Namespace: "orders", RequestToken: []byte(fmt.Sprintf("tok-%d", i)),
			Items: []*dedupv1.MarkItem{{Id: id}}})
		if err != nil {
			t.Fatalf("mark via %s: %v", s.Node().ID(), err)
		}
		if got := resp.Results[0].Code; got != dedupv1.MarkResult_NEW {
			t.Fatalf("mark via %s: %v", s.Node().ID(), got)
		}
	}
	for _, s := range srvs {
		c := dedupv1.NewDedupClient(dialAs(t, p, s.GRPCAddr(), "client", ordersToken))
		resp, err := c.Check(ctx, &dedupv1.CheckRequest{Namespace: "orders", Ids: ids})
		if err != nil {
			t.Fatalf("check via %s: %v", s.Node().ID(), err)
		}
		for i, r := range resp.Results {
			if r.Code != dedupv1.CheckResult_SEEN {
				t.Errorf("check %s via %s: %v", ids[i], s.Node().ID(), r.Code)
			}
		}
	}
	// A duplicate, for the metrics below.
	dup, err := dedupv1.NewDedupClient(dialAs(t, p, srvs[1].GRPCAddr(), "client", ordersToken)).Mark(ctx,
		&dedupv1.MarkRequest{Namespace: "orders", RequestToken: []byte("tok-dup"), Items: []*dedupv1.MarkItem{{Id: ids[0]}}})
	if err != nil || dup.Results[0].Code != dedupv1.MarkResult_DUPLICATE {
		t.Fatalf("re-mark: %v %v", dup, err)
	}

	// Refusals.
	addr := srvs[1].GRPCAddr()
	mark := func(cc *grpc.ClientConn, ns string) error {
		_, err := dedupv1.NewDedupClient(cc).Mark(ctx, &dedupv1.MarkRequest{Namespace: ns, RequestToken: []byte("tok-x"),
			Items: []*dedupv1.MarkItem{{Id: []byte("refused")}}})
		return err
	}
	noCert := dialAs(t, p, addr, "", ordersToken)
	if err := mark(noCert, "orders"); err == nil {
		t.Error("a client without a certificate was served")
	}
	foreign := newSecurePKI(t)
	if err := mark(dialAs(t, securePKI{foreign.dir}, addr, "client", ordersToken), "orders"); err == nil {
		t.Error("a client with another CA's certificate was served")
	}
	for _, c := range []struct {
		name  string
		token string
		call  func(cc *grpc.ClientConn) error
		want  codes.Code
	}{
		{"no token", "", func(cc *grpc.ClientConn) error { return mark(cc, "orders") }, codes.Unauthenticated},
		{"unknown token", "not-a-token-at-all", func(cc *grpc.ClientConn) error { return mark(cc, "orders") }, codes.Unauthenticated},
		{"other namespace", ordersToken, func(cc *grpc.ClientConn) error { return mark(cc, "default") }, codes.PermissionDenied},
		{"read-only token writes", readerToken, func(cc *grpc.ClientConn) error { return mark(cc, "orders") }, codes.PermissionDenied},
		{"namespace admin without admin", ordersToken, func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewAdminClient(cc).DeleteNamespace(ctx, &dedupv1.DeleteNamespaceRequest{Name: "orders"})
			return err
		}, codes.PermissionDenied},
		{"cluster admin without admin", ordersToken, func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewAdminClient(cc).Remove(ctx, &dedupv1.RemoveRequest{NodeId: "n3"})
			return err
		}, codes.PermissionDenied},
		{"internal service with a client token", opsToken, func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewInternalClient(cc).ReadIndex(ctx, &dedupv1.ReadIndexRequest{})
			return err
		}, codes.PermissionDenied},
	} {
		if got := status.Code(c.call(dialAs(t, p, addr, "client", c.token))); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// Streams are checked too: Backup needs admin on "*", Export admin on
	// the namespace.
	ordersOps := dedupv1.NewOpsClient(dialAs(t, p, addr, "client", ordersToken))
	if _, err := recvAll(ordersOps.Export(ctx, &dedupv1.ExportRequest{Namespace: "orders"})); status.Code(err) != codes.PermissionDenied {
		t.Errorf("export without admin: %v", err)
	}
	bst, err := ordersOps.Backup(ctx, &dedupv1.BackupRequest{})
	if err == nil {
		_, err = bst.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("backup without admin: %v", err)
	}
	if n, err := recvAll(dedupv1.NewOpsClient(ops).Export(ctx, &dedupv1.ExportRequest{Namespace: "orders"})); err != nil || n != 3 {
		t.Errorf("export with admin: %d records, %v", n, err)
	}

	// The refused mark wrote nothing.
	resp, err := dedupv1.NewDedupClient(ops).Check(ctx, &dedupv1.CheckRequest{Namespace: "orders", Ids: [][]byte{[]byte("refused")}})
	if err != nil || resp.Results[0].Code != dedupv1.CheckResult_NOT_SEEN {
		t.Errorf("refused mark left a trace: %v %v", resp, err)
	}

	// Admin listener: metrics and status page, on the node clients hit.
	base := "http://" + srvs[1].AdminAddr()
	metricsText := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`dedup_requests_total{code="OK",op="mark",origin="client"}`,
		`dedup_requests_total{code="Unauthenticated",op="mark",origin="client"}`,
		`dedup_items_total{namespace="orders",op="mark",result="duplicate"} 1`,
		`dedup_duplicate_age_seconds_count{namespace="orders"} 1`,
		`dedup_raft_state{state="follower"}`, `dedup_raft_voters 3`, `dedup_bloom_memory_bytes`, `dedup_storage_disk_bytes`,
	} {
		if !strings.Contains(metricsText, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	page := httpGet(t, base+"/")
	for _, want := range []string{"<code>n1</code>", "<code>n2</code>", "<code>n3</code>", "<code>orders</code>", "voter", "mark"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if strings.Contains(page, "unreachable") {
		t.Error("status page: a member was unreachable over mutual TLS")
	}
	if h := httpGet(t, base+"/healthz"); strings.TrimSpace(h) != "ok" {
		t.Errorf("/healthz: %q", h)
	}
	// In a real browser too, when one is installed.
	if dom := renderInChromium(t, base+"/"); dom != "" {
		for _, want := range []string{"n1", "n2", "n3", "orders", "Members", "Bloom filters and storage"} {
			if !strings.Contains(dom, want) {
				t.Errorf("page rendered by Chromium lacks %q", want)
			}
		}
	}
}

// renderInChromium returns the DOM headless Chromium rendered for url, or
// "" when Chromium is not installed.
func renderInChromium(t *testing.T, url string) string {
	t.Helper()
	var bin string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Log("chromium not installed: status page not rendered in a browser")
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu",
		"--user-data-dir="+t.TempDir(), "--dump-dom", url).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v", url, err)
	}
	return string(out)
}

// TestForeignCANodeCannotJoin: a node whose certificate another CA signed
// can neither join through gRPC nor, when an admin adds it by mistake,
// receive a single Raft entry.
func TestForeignCANodeCannotJoin(t *testing.T) {
	p := newSecurePKI(t, "n1")
	cl, srvs := startSecureCluster(t, p, "n1")
	leader := srvs[0]

	foreign := newSecurePKI(t, "evil")
	evilTLS := secureTune(t, foreign, "evil")

	// 1. Joining through a member fails: the member does not trust the
	// joiner's certificate (and the joiner not the member's).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cl.Add(ctx, devcluster.AddConfig{ID: "evil", Join: []string{leader.GRPCAddr()}, Tune: evilTLS}); err == nil {
		t.Fatal("a node with a foreign CA joined")
	}

	// 2. An admin adds a foreign-CA node to the configuration by mistake:
	// the leader cannot open a Raft connection to it, so it never gets a
	// log entry, is never promoted, and the cluster keeps working.
	actx, acancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer acancel()
	i, err := cl.Add(actx, devcluster.AddConfig{ID: "evil", NoJoin: true, Tune: evilTLS})
	if err != nil {
		t.Fatal(err)
	}
	evil := cl.Server(i)
	ops := dialAs(t, p, leader.GRPCAddr(), "client", opsToken)
	cctx := callCtx(t)
	if _, err := dedupv1.NewAdminClient(ops).Join(cctx, &dedupv1.JoinRequest{NodeId: "evil", RaftAddr: evil.RaftAddr(), GrpcAddr: evil.GRPCAddr()}); err != nil {
		t.Fatalf("admin join: %v", err)
	}
	c := dedupv1.NewDedupClient(ops)
	for i := range 20 {
		resp, err := c.Mark(cctx, &dedupv1.MarkRequest{RequestToken: []byte(fmt.Sprintf("t%d", i)), Items: []*dedupv1.MarkItem{{Id: []byte(fmt.Sprintf("id-%d", i))}}})
		if err != nil || resp.Results[0].Code != dedupv1.MarkResult_NEW {
			t.Fatalf("mark %d with a foreign node in the configuration: %v %v", i, resp, err)
		}
	}
	// The leader has been trying to replicate to evil all along (every
	// heartbeat); evil holds nothing.
	if li := evil.Node().Raft().LastIndex(); li != 0 {
		t.Errorf("foreign node received Raft entries up to %d", li)
	}
	if a := evil.Node().FSM().AppliedIndex(); a != 0 {
		t.Errorf("foreign node applied up to %d", a)
	}
	st, err := leader.Node().Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.ID == "evil" && m.Suffrage == "voter" {
			t.Error("foreign node was promoted to voter")
		}
	}
}

// Calls carried on a Dedup.Stream are checked one by one as the unary call
// of their kind: a refused call fails alone with PermissionDenied and the
// stream goes on; a stream without a token is refused as a whole.
func TestSecureStreamChecksEachCall(t *testing.T) {
	p := newSecurePKI(t, "n1")
	_, srvs := startSecureCluster(t, p, "n1")
	ctx := callCtx(t)
	addr := srvs[0].GRPCAddr()
	if _, err := dedupv1.NewAdminClient(dialAs(t, p, addr, "client", opsToken)).CreateNamespace(ctx,
		&dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders"}}); err != nil {
		t.Fatal(err)
	}
	mark := func(id uint64, ns string) *dedupv1.StreamRequest {
		return &dedupv1.StreamRequest{RequestId: id, Call: &dedupv1.StreamRequest_Mark{Mark: &dedupv1.MarkRequest{
			Namespace: ns, RequestToken: []byte(fmt.Sprint("tok-", id)), Items: []*dedupv1.MarkItem{{Id: []byte(fmt.Sprint("streamed-", id))}}}}}
	}
	check := func(id uint64, ns string) *dedupv1.StreamRequest {
		return &dedupv1.StreamRequest{RequestId: id, Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{
			Namespace: ns, Ids: [][]byte{[]byte("streamed-1")}}}}
	}
	run := func(token string, reqs ...*dedupv1.StreamRequest) map[uint64]codes.Code {
		t.Helper()
		st, err := dedupv1.NewDedupClient(dialAs(t, p, addr, "client", token)).Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if err := st.Send(r); err != nil {
				t.Fatal(err)
			}
		}
		out := map[uint64]codes.Code{}
		for range reqs {
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("token %q: stream failed after %d answers: %v", token, len(out), err)
			}
			out[r.RequestId] = codes.Code(r.GetError().GetCode())
		}
		return out
	}
	got := run(ordersToken, mark(1, "orders"), mark(2, "default"), check(3, "orders"))
	want := map[uint64]codes.Code{1: codes.OK, 2: codes.PermissionDenied, 3: codes.OK}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("orders token: %v, want %v", got, want)
	}
	got = run(readerToken, mark(4, "orders"), check(5, "orders"))
	want = map[uint64]codes.Code{4: codes.PermissionDenied, 5: codes.OK}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("reader token: %v, want %v", got, want)
	}
	st, err := dedupv1.NewDedupClient(dialAs(t, p, addr, "client", "")).Stream(ctx)
	if err == nil {
		_ = st.Send(check(6, "orders"))
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream without a token: %v, want Unauthenticated", err)
	}
}
