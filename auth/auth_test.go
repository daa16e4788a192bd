package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/security"
)

const testFile = `{
  "tokens": [
    {"name": "orders-rw", "token": "orders-secret", "namespaces": ["orders"], "rights": ["read", "write"]},
    {"name": "reader", "token_sha256": "%READER%", "namespaces": ["*"], "rights": ["read"]},
    {"name": "team-admin", "token": "team-admin-secret", "namespaces": ["team-*"], "rights": ["read", "write", "admin"]},
    {"name": "ops", "token": "ops-secret-123", "namespaces": ["*"], "rights": ["read", "write", "admin"]},
    {"name": "default-writer", "token": "default-secret", "namespaces": ["default"], "rights": ["write"]},
    {"name": "nodes", "token": "node-secret-123", "rights": ["node"]}
  ]
}`

func sha(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func writeTokens(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func testStore(t *testing.T) *Store {
	t.Helper()
	s, err := Load(writeTokens(t, strings.ReplaceAll(testFile, "%READER%", sha("reader-secret"))))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPrincipalRights(t *testing.T) {
	s := testStore(t)
	get := func(tok string) *Principal {
		p, ok := s.Authenticate(tok)
		if !ok {
			t.Fatalf("token %q not found", tok)
		}
		return p
	}
	if _, ok := s.Authenticate("nope-nope-nope"); ok {
		t.Error("unknown token authenticated")
	}
	if _, ok := s.Authenticate(""); ok {
		t.Error("empty token authenticated")
	}
	if _, ok := s.Authenticate(sha("reader-secret")); ok {
		t.Error("the digest itself authenticated")
	}
	cases := []struct {
		tok  string
		r    Right
		ns   string
		want bool
	}{
		{"orders-secret", Read, "orders", true},
		{"orders-secret", Write, "orders", true},
		{"orders-secret", Write, "payments", false},
		{"orders-secret", Admin, "orders", false},
		{"reader-secret", Read, "anything", true},
		{"reader-secret", Write, "anything", false},
		{"team-admin-secret", Admin, "team-a", true},
		{"team-admin-secret", Admin, "teams", false},
		{"default-writer", Write, "", false}, // wrong token text: not in file
		{"default-secret", Write, "", true},  // "" is the default namespace
		{"default-secret", Read, "default", false},
		{"node-secret-123", Admin, "x", true},
	}
	for _, c := range cases {
		p, ok := s.Authenticate(c.tok)
		if !ok {
			if c.want {
				t.Errorf("%s: not authenticated", c.tok)
			}
			continue
		}
		if got := p.Allowed(c.r, c.ns); got != c.want {
			t.Errorf("%s %v on %q: got %v want %v", c.tok, c.r, c.ns, got, c.want)
		}
	}
	if get("team-admin-secret").AllowedAll(Admin) {
		t.Error("prefix-scoped admin counts as cluster admin")
	}
	if !get("ops-secret-123").AllowedAll(Admin) {
		t.Error("admin on * is not cluster admin")
	}
	if !get("node-secret-123").IsNode() || get("ops-secret-123").IsNode() {
		t.Error("IsNode wrong")
	}
	if s.NodeToken() != "node-secret-123" {
		t.Errorf("NodeToken %q", s.NodeToken())
	}
}

func TestTokenFileErrorsNameTheEntry(t *testing.T) {
	cases := map[string]string{
		`{"tokens":[{"name":"a","token":"12345678","namespaces":["*"],"rights":["read","fly"]}]}`:                                                                `unknown right "fly"`,
		`{"tokens":[{"name":"a","token":"12345678","namespaces":["*"],"rights":["read"],"extra":1}]}`:                                                            `unknown field "extra"`,
		`{"tokens":[{"name":"a","token":"short","namespaces":["*"],"rights":["read"]}]}`:                                                                         `"a"`,
		`{"tokens":[{"name":"a","namespaces":["*"],"rights":["read"]}]}`:                                                                                         `token or token_sha256 is required`,
		`{"tokens":[{"name":"a","token":"12345678","rights":["read"]}]}`:                                                                                         `namespaces is empty`,
		`{"tokens":[{"name":"a","token":"12345678","namespaces":["*"],"rights":[]}]}`:                                                                            `rights is empty`,
		`{"tokens":[{"name":"a","token":"12345678","namespaces":["*"],"rights":["read"]},{"name":"a","token":"87654321","namespaces":["*"],"rights":["read"]}]}`: `duplicate name`,
		`{"tokens":[{"name":"a","token":"12345678","namespaces":["*"],"rights":["read"]},{"name":"b","token":"12345678","namespaces":["*"],"rights":["read"]}]}`: `listed twice`,
		`{"tokens":[{"name":"a","token_sha256":"xyz","namespaces":["*"],"rights":["read"]}]}`:                                                                    `64 hex digits`,
		`{"tokens":[]} {}`: `trailing data`,
		`{"tokens":[{"name":"a","token":"12345678","namespaces":[""],"rights":["read"]}]}`: `empty namespace`,
	}
	for content, want := range cases {
		_, err := Parse(strings.NewReader(content))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s\n  err %v, want it to contain %q", content, err, want)
		}
	}
}

func TestReloadKeepsOldTableOnError(t *testing.T) {
	p := writeTokens(t, `{"tokens":[{"name":"a","token":"first-token","namespaces":["*"],"rights":["read"]}]}`)
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`{"tokens":[{"name":"b","token":"second-token","namespaces":["*"],"rights":["read"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Authenticate("first-token"); ok {
		t.Error("revoked token still valid after reload")
	}
	if _, ok := s.Authenticate("second-token"); !ok {
		t.Error("new token not valid after reload")
	}
	if err := os.WriteFile(p, []byte(`{"tokens":[{`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil {
		t.Fatal("reload of a broken file succeeded")
	}
	if _, ok := s.Authenticate("second-token"); !ok {
		t.Error("a failed reload dropped the table in force")
	}
}

func TestEveryMethodHasARule(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{dedupv1.Dedup_ServiceDesc, dedupv1.Admin_ServiceDesc, dedupv1.Internal_ServiceDesc, dedupv1.Ops_ServiceDesc} {
		for _, m := range sd.Methods {
			if _, ok := Methods["/"+sd.ServiceName+"/"+m.MethodName]; !ok {
				t.Errorf("%s/%s has no access rule", sd.ServiceName, m.MethodName)
			}
		}
		for _, m := range sd.Streams {
			if _, ok := Methods["/"+sd.ServiceName+"/"+m.StreamName]; !ok {
				t.Errorf("%s/%s has no access rule", sd.ServiceName, m.StreamName)
			}
		}
	}
}

// fakeServer answers every call it is reached with an empty response.
type fakeServer struct {
	dedupv1.UnimplementedDedupServer
	dedupv1.UnimplementedAdminServer
	dedupv1.UnimplementedInternalServer
	lastCaller chan string
}

func (f *fakeServer) seen(ctx context.Context) {
	if p := FromContext(ctx); p != nil {
		select {
		case f.lastCaller <- p.Name:
		default:
		}
	}
}

func (f *fakeServer) Check(ctx context.Context, _ *dedupv1.CheckRequest) (*dedupv1.CheckResponse, error) {
	f.seen(ctx)
	return &dedupv1.CheckResponse{}, nil
}

func (f *fakeServer) Mark(ctx context.Context, _ *dedupv1.MarkRequest) (*dedupv1.MarkResponse, error) {
	f.seen(ctx)
	return &dedupv1.MarkResponse{}, nil
}

func (f *fakeServer) CreateNamespace(ctx context.Context, _ *dedupv1.CreateNamespaceRequest) (*dedupv1.NamespaceResponse, error) {
	f.seen(ctx)
	return &dedupv1.NamespaceResponse{}, nil
}

func (f *fakeServer) DeleteNamespace(ctx context.Context, _ *dedupv1.DeleteNamespaceRequest) (*dedupv1.DeleteNamespaceResponse, error) {
	f.seen(ctx)
	return &dedupv1.DeleteNamespaceResponse{}, nil
}

func (f *fakeServer) Status(ctx context.Context, _ *dedupv1.StatusRequest) (*dedupv1.StatusResponse, error) {
	f.seen(ctx)
	return &dedupv1.StatusResponse{}, nil
}

func (f *fakeServer) Remove(ctx context.Context, _ *dedupv1.RemoveRequest) (*dedupv1.RemoveResponse, error) {
	f.seen(ctx)
	return &dedupv1.RemoveResponse{}, nil
}

func (f *fakeServer) ReadIndex(ctx context.Context, _ *dedupv1.ReadIndexRequest) (*dedupv1.ReadIndexResponse, error) {
	f.seen(ctx)
	return &dedupv1.ReadIndexResponse{ReadIndex: 1}, nil
}

func serve(t *testing.T, a *Authorizer, opts ...grpc.ServerOption) (string, *fakeServer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(a.StreamServerInterceptor()))
	srv := grpc.NewServer(opts...)
	f := &fakeServer{lastCaller: make(chan string, 1)}
	dedupv1.RegisterDedupServer(srv, f)
	dedupv1.RegisterAdminServer(srv, f)
	dedupv1.RegisterInternalServer(srv, f)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), f
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestInterceptorCodes(t *testing.T) {
	addr, _ := serve(t, &Authorizer{Tokens: testStore(t)})
	anon := dial(t, addr)
	withTok := func(tok string) *grpc.ClientConn {
		return dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(TokenCredentials(tok)))
	}
	ctx := ctxTimeout(t)
	type call func(cc *grpc.ClientConn) error
	check := func(ns string) call {
		return func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewDedupClient(cc).Check(ctx, &dedupv1.CheckRequest{Namespace: ns})
			return err
		}
	}
	mark := func(ns string) call {
		return func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewDedupClient(cc).Mark(ctx, &dedupv1.MarkRequest{Namespace: ns})
			return err
		}
	}
	createNS := func(ns string) call {
		return func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewAdminClient(cc).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: ns}})
			return err
		}
	}
	deleteNS := func(ns string) call {
		return func(cc *grpc.ClientConn) error {
			_, err := dedupv1.NewAdminClient(cc).DeleteNamespace(ctx, &dedupv1.DeleteNamespaceRequest{Name: ns})
			return err
		}
	}
	statusCall := func(cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
		return err
	}
	remove := func(cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Remove(ctx, &dedupv1.RemoveRequest{NodeId: "x"})
		return err
	}
	readIndex := func(cc *grpc.ClientConn) error {
		_, err := dedupv1.NewInternalClient(cc).ReadIndex(ctx, &dedupv1.ReadIndexRequest{})
		return err
	}
	healthCall := func(cc *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	orders, ops, reader := withTok("orders-secret"), withTok("ops-secret-123"), withTok("reader-secret")
	teamAdmin, node, wrong := withTok("team-admin-secret"), withTok("node-secret-123"), withTok("wrong-secret-1")
	cases := []struct {
		name string
		cc   *grpc.ClientConn
		fn   call
		want codes.Code
	}{
		{"no token check", anon, check("orders"), codes.Unauthenticated},
		{"wrong token mark", wrong, mark("orders"), codes.Unauthenticated},
		{"no token health", anon, healthCall, codes.OK},
		{"orders check orders", orders, check("orders"), codes.OK},
		{"orders mark orders", orders, mark("orders"), codes.OK},
		{"orders mark payments", orders, mark("payments"), codes.PermissionDenied},
		{"orders mark default", orders, mark(""), codes.PermissionDenied},
		{"orders create ns", orders, createNS("orders"), codes.PermissionDenied},
		{"orders status", orders, statusCall, codes.OK},
		{"orders remove", orders, remove, codes.PermissionDenied},
		{"orders read index", orders, readIndex, codes.PermissionDenied},
		{"reader check", reader, check("x"), codes.OK},
		{"write-only token status", withTok("default-secret"), statusCall, codes.OK},
		{"reader mark", reader, mark("x"), codes.PermissionDenied},
		{"team admin create team-a", teamAdmin, createNS("team-a"), codes.OK},
		{"team admin delete other", teamAdmin, deleteNS("other"), codes.PermissionDenied},
		{"team admin remove node", teamAdmin, remove, codes.PermissionDenied},
		{"ops remove node", ops, remove, codes.OK},
		{"ops create", ops, createNS("anything"), codes.OK},
		{"ops read index", ops, readIndex, codes.PermissionDenied},
		{"node read index", node, readIndex, codes.OK},
		{"node mark anywhere", node, mark("payments"), codes.OK},
	}
	for _, c := range cases {
		err := c.fn(c.cc)
		if got := status.Code(err); got != c.want {
			t.Errorf("%s: code %v (%v), want %v", c.name, got, err, c.want)
		}
	}
	// PermissionDenied says what is missing.
	err := mark("payments")(orders)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "write") || !strings.Contains(msg, "payments") || !strings.Contains(msg, "orders-rw") {
		t.Errorf("denial message %q does not name right, namespace and token name", msg)
	}
	if strings.Contains(status.Convert(err).Message(), "orders-secret") {
		t.Error("denial message leaks the token")
	}
}

func TestInterceptorPutsCallerInContext(t *testing.T) {
	addr, f := serve(t, &Authorizer{Tokens: testStore(t)})
	cc := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(TokenCredentials("orders-secret")))
	if _, err := dedupv1.NewDedupClient(cc).Check(ctxTimeout(t), &dedupv1.CheckRequest{Namespace: "orders"}); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-f.lastCaller:
		if name != "orders-rw" {
			t.Errorf("caller %q", name)
		}
	default:
		t.Fatal("handler saw no caller")
	}
}

func TestNodeCertificateGrantsNodeRight(t *testing.T) {
	dir := t.TempDir()
	if _, err := security.WriteDevPKI(dir, security.DevPKIOptions{Nodes: []string{"n1", "n2"}}); err != nil {
		t.Fatal(err)
	}
	kp := func(name string) *security.KeyPair {
		k, err := security.LoadKeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	ca := filepath.Join(dir, "ca.crt")
	srvCfg, err := security.ServerTLS(kp("n1"), ca, "")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, &Authorizer{Tokens: testStore(t), TrustNodeCertificates: true}, grpc.Creds(credentials.NewTLS(srvCfg)))
	as := func(name string, tok string) *grpc.ClientConn {
		cfg, err := security.ClientTLS(ca, kp(name), "")
		if err != nil {
			t.Fatal(err)
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
		if tok != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(TokenCredentials(tok)))
		}
		return dial(t, addr, opts...)
	}
	ctx := ctxTimeout(t)
	if _, err := dedupv1.NewInternalClient(as("n2", "")).ReadIndex(ctx, &dedupv1.ReadIndexRequest{}); err != nil {
		t.Errorf("node certificate refused for Internal: %v", err)
	}
	_, err = dedupv1.NewInternalClient(as("client", "")).ReadIndex(ctx, &dedupv1.ReadIndexRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("client certificate without token: %v, want Unauthenticated", err)
	}
	_, err = dedupv1.NewInternalClient(as("client", "ops-secret-123")).ReadIndex(ctx, &dedupv1.ReadIndexRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("client certificate with admin token on Internal: %v, want PermissionDenied", err)
	}
	if _, err := dedupv1.NewDedupClient(as("client", "orders-secret")).Mark(ctx, &dedupv1.MarkRequest{Namespace: "orders"}); err != nil {
		t.Errorf("client certificate with a token: %v", err)
	}

	// With NodeRoots set to another CA, the same node certificate is no
	// longer a node.
	otherDir := t.TempDir()
	if _, err := security.WriteDevPKI(otherDir, security.DevPKIOptions{NoClient: true, Nodes: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	otherRoots, err := security.LoadCertPool(filepath.Join(otherDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	addr2, _ := serve(t, &Authorizer{Tokens: testStore(t), TrustNodeCertificates: true, NodeRoots: otherRoots}, grpc.Creds(credentials.NewTLS(srvCfg)))
	cfg, err := security.ClientTLS(ca, kp("n2"), "")
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, addr2, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if _, err := dedupv1.NewInternalClient(cc).ReadIndex(ctx, &dedupv1.ReadIndexRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("node certificate outside NodeRoots: %v, want Unauthenticated", err)
	}
	goodRoots, err := security.LoadCertPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	addr3, _ := serve(t, &Authorizer{Tokens: testStore(t), TrustNodeCertificates: true, NodeRoots: goodRoots}, grpc.Creds(credentials.NewTLS(srvCfg)))
	cc = dial(t, addr3, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if _, err := dedupv1.NewInternalClient(cc).ReadIndex(ctx, &dedupv1.ReadIndexRequest{}); err != nil {
		t.Errorf("node certificate within NodeRoots: %v", err)
	}
}
