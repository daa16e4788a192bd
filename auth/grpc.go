package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/security"
)

// Scope says which namespaces a method's right must cover.
type Scope uint8

const (
	// ScopeNamespace: the right on the namespace the request names.
	ScopeNamespace Scope = iota + 1
	// ScopeAny: the right on at least one namespace (cluster-wide reads).
	ScopeAny
	// ScopeAll: the right on every namespace ("*"): cluster membership.
	ScopeAll
	// ScopePublic: no token needed (health checks, reflection).
	ScopePublic
)

// Rule is what one RPC requires.
type Rule struct {
	Right Right
	Scope Scope
}

// Methods maps every RPC's full method name to what it requires. A method
// not listed is refused. TestEveryMethodHasARule keeps it complete.
var Methods = map[string]Rule{
	dedupv1.Dedup_Check_FullMethodName:   {Read, ScopeNamespace},
	dedupv1.Dedup_Mark_FullMethodName:    {Write, ScopeNamespace},
	dedupv1.Dedup_Claim_FullMethodName:   {Write, ScopeNamespace},
	dedupv1.Dedup_Commit_FullMethodName:  {Write, ScopeNamespace},
	dedupv1.Dedup_Renew_FullMethodName:   {Write, ScopeNamespace},
	dedupv1.Dedup_Release_FullMethodName: {Write, ScopeNamespace},
	dedupv1.Dedup_Forget_FullMethodName:  {Write, ScopeNamespace},
	// Opening a stream needs a right to read or write; each call it carries
	// is then checked as the unary call of its kind by
	// UnaryServerInterceptor, which the server runs around every carried
	// call (server.Config.CallInterceptors).
	dedupv1.Dedup_Stream_FullMethodName: {Read | Write, ScopeAny},

	dedupv1.Admin_CreateNamespace_FullMethodName:   {Admin, ScopeNamespace},
	dedupv1.Admin_UpdateNamespace_FullMethodName:   {Admin, ScopeNamespace},
	dedupv1.Admin_DeleteNamespace_FullMethodName:   {Admin, ScopeNamespace},
	dedupv1.Admin_DescribeNamespace_FullMethodName: {Read, ScopeNamespace},
	dedupv1.Admin_ListNamespaces_FullMethodName:    {Read, ScopeAny},
	// Any token may ask for Status: clients need it to find the leader.
	dedupv1.Admin_Status_FullMethodName:             {Read | Write | Admin, ScopeAny},
	dedupv1.Admin_Join_FullMethodName:               {Admin, ScopeAll},
	dedupv1.Admin_Remove_FullMethodName:             {Admin, ScopeAll},
	dedupv1.Admin_TransferLeadership_FullMethodName: {Admin, ScopeAll},

	dedupv1.Internal_ReadIndex_FullMethodName: {Node, ScopeAll},

	dedupv1.Ops_Promote_FullMethodName: {Admin, ScopeAll},
	dedupv1.Ops_Backup_FullMethodName:  {Admin, ScopeAll},
	// Export enumerates a namespace: more than Check's one-ID-at-a-time read.
	dedupv1.Ops_Export_FullMethodName: {Admin, ScopeNamespace},
	// The fencing epoch is cluster-wide (and finite: 65535 epochs).
	dedupv1.Ops_RaiseFenceEpoch_FullMethodName:   {Admin, ScopeAll},
	dedupv1.Ops_SetClusterSetting_FullMethodName: {Admin, ScopeAll},
	// Digest reveals no data but scans the node's whole state.
	dedupv1.Ops_Digest_FullMethodName: {Admin, ScopeAll},

	"/grpc.health.v1.Health/Check":                                   {0, ScopePublic},
	"/grpc.health.v1.Health/Watch":                                   {0, ScopePublic},
	"/grpc.health.v1.Health/List":                                    {0, ScopePublic},
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      {0, ScopePublic},
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": {0, ScopePublic},
}

// Authorizer checks calls against a token Store and, optionally, node
// certificates.
type Authorizer struct {
	// Tokens is the token table; nil means no token is valid (only nodes
	// recognised by certificate get in).
	Tokens *Store
	// TrustNodeCertificates makes a caller that presented a verified node
	// certificate (security.PeerIsNode) a node, without a token. Turn it on
	// when the gRPC server verifies client certificates against the
	// cluster CA.
	TrustNodeCertificates bool
	// NodeRoots, if set, narrows TrustNodeCertificates to certificates that
	// chain to these roots (the cluster CA), for servers whose client CA
	// (which the TLS handshake verified) is not the cluster CA.
	NodeRoots *x509.CertPool
	// Logger receives one line per refused call (never the token).
	Logger *slog.Logger
}

type principalKey struct{}

// FromContext returns the principal the interceptor authenticated, or nil.
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// Authenticate finds the caller of ctx: a node by certificate (when
// trusted), else the bearer token's principal. The error is a gRPC status
// with code Unauthenticated.
func (a *Authorizer) Authenticate(ctx context.Context) (*Principal, error) {
	if a.TrustNodeCertificates {
		if pr, ok := peer.FromContext(ctx); ok {
			if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && security.PeerIsNode(ti.State) && a.fromNodeCA(ti.State) {
				return NodePrincipal("node:" + ti.State.VerifiedChains[0][0].Subject.CommonName), nil
			}
		}
	}
	tok, ok := bearerToken(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "missing token: send metadata \"authorization: Bearer <token>\" (CLI: --token or DEDUPNODE_TOKEN)")
	}
	if a.Tokens != nil {
		if p, ok := a.Tokens.Authenticate(tok); ok {
			return p, nil
		}
	}
	return nil, status.Error(codes.Unauthenticated, "invalid token: not in the server's token file")
}

func (a *Authorizer) fromNodeCA(cs tls.ConnectionState) bool {
	if a.NodeRoots == nil {
		return true
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: a.NodeRoots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// Authorize checks one call of fullMethod with request req (nil for a
// stream before its first message: the namespace is then checked by
// AuthorizeNamespace). It returns the caller, or a gRPC status error:
// Unauthenticated or PermissionDenied.
func (a *Authorizer) Authorize(ctx context.Context, fullMethod string, req any) (*Principal, error) {
	rule, ok := Methods[fullMethod]
	if !ok {
		a.refused(fullMethod, "", "method has no access rule")
		return nil, status.Errorf(codes.PermissionDenied, "method %s is not allowed", fullMethod)
	}
	if rule.Scope == ScopePublic {
		return nil, nil
	}
	p, err := a.Authenticate(ctx)
	if err != nil {
		a.refused(fullMethod, "", status.Convert(err).Message())
		return nil, err
	}
	switch rule.Scope {
	case ScopeAny:
		ok = p.AllowedAny(rule.Right)
	case ScopeAll:
		ok = p.AllowedAll(rule.Right)
	case ScopeNamespace:
		if req == nil {
			ok = p.AllowedAny(rule.Right)
		} else {
			return p, a.AuthorizeNamespace(p, fullMethod, NamespaceOf(req))
		}
	}
	if !ok {
		return nil, a.denied(p, fullMethod, rule, "")
	}
	return p, nil
}

// AuthorizeNamespace checks that p holds fullMethod's right on namespace ns.
func (a *Authorizer) AuthorizeNamespace(p *Principal, fullMethod, ns string) error {
	rule := Methods[fullMethod]
	if rule.Scope != ScopeNamespace || p.Allowed(rule.Right, ns) {
		return nil
	}
	return a.denied(p, fullMethod, rule, ns)
}

func (a *Authorizer) denied(p *Principal, method string, rule Rule, ns string) error {
	what := ""
	switch rule.Scope {
	case ScopeNamespace:
		if ns == "" {
			ns = DefaultNamespace
		}
		what = " on namespace " + ns
	case ScopeAll:
		what = " on all namespaces (\"*\")"
	}
	a.refused(method, p.Name, "lacks "+rule.Right.String()+what)
	return status.Errorf(codes.PermissionDenied, "token %q lacks the %s right%s needed by %s",
		p.Name, rule.Right, what, method[strings.LastIndexByte(method, '/')+1:])
}

func (a *Authorizer) refused(method, who, why string) {
	if a.Logger != nil {
		a.Logger.Info("call refused", "method", method, "token_name", who, "reason", why)
	}
}

// UnaryServerInterceptor checks every unary call and puts the caller in
// the handler's context (FromContext). Give it to the server as a call
// interceptor (server.Config.CallInterceptors), not as a plain gRPC
// option: then it also checks every call carried on a Dedup.Stream, which
// the stream interceptor admits on any read or write right.
func (a *Authorizer) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := a.Authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		if p != nil {
			ctx = NewContext(ctx, p)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor checks every streaming call: the caller at once,
// and, for namespace-scoped methods, the namespace of each received
// message.
func (a *Authorizer) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := a.Authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		if p == nil {
			return handler(srv, ss)
		}
		return handler(srv, &authStream{ServerStream: ss, ctx: NewContext(ss.Context(), p), a: a, p: p, method: info.FullMethod})
	}
}

type authStream struct {
	grpc.ServerStream
	ctx    context.Context
	a      *Authorizer
	p      *Principal
	method string
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.a.AuthorizeNamespace(s.p, s.method, NamespaceOf(m))
}

// NamespaceOf returns the namespace a request names ("" for the default
// namespace or a request that names none).
func NamespaceOf(req any) string {
	switch r := req.(type) {
	case interface{ GetNamespace() string }:
		return r.GetNamespace()
	case interface{ GetNamespace() *dedupv1.Namespace }:
		return r.GetNamespace().GetName()
	case interface{ GetName() string }:
		return r.GetName()
	}
	return ""
}

func bearerToken(ctx context.Context) (string, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return "", false
	}
	for _, v := range md.Get("authorization") {
		scheme, tok, ok := strings.Cut(v, " ")
		if ok && strings.EqualFold(scheme, "bearer") && strings.TrimSpace(tok) != "" {
			return strings.TrimSpace(tok), true
		}
	}
	return "", false
}

// TokenCredentials returns per-RPC credentials that send token as
// "authorization: Bearer <token>". They are sent over plaintext
// connections too (a development cluster on loopback); in production use
// them with TLS, or anyone on the path can read the token.
func TokenCredentials(token string) credentials.PerRPCCredentials {
	return tokenCreds(token)
}

type tokenCreds string

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (t tokenCreds) RequireTransportSecurity() bool { return false }
