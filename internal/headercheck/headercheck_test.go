package headercheck_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/dedupnode/dedupnode/internal/headercheck"
)

var errForeign = errors.New("answer from a foreign node")

// serveTagged serves grpc.health.v1 on loopback, every answer (unary, and
// streams as they open) carrying the header tag=value.
func serveTagged(t *testing.T, value string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	md := metadata.Pairs("tag", value)
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			_ = grpc.SetHeader(ctx, md)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := ss.SendHeader(md); err != nil {
				return err
			}
			return h(srv, ss)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dialChecked dials addr with both interceptors, accepting only tag=want.
func dialChecked(t *testing.T, addr, want string) healthpb.HealthClient {
	t.Helper()
	check := func(md metadata.MD) error {
		if v := md.Get("tag"); len(v) == 1 && v[0] == want {
			return nil
		}
		return errForeign
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(headercheck.Unary(check)),
		grpc.WithChainStreamInterceptor(headercheck.Stream(check)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// A node whose answers carry the expected header is believed, unary and
// streamed; one whose answers carry another is not: its unary answer and
// every message of its stream are replaced by the check's error.
func TestAnswersOfAForeignNodeAreReplacedByTheCheckError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ours := dialChecked(t, serveTagged(t, "cluster-a"), "cluster-a")
	if resp, err := ours.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("unary answer of our node: %v %v", resp, err)
	}
	ws, err := ours.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := ws.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("streamed answer of our node: %v %v", resp, err)
	}

	foreign := dialChecked(t, serveTagged(t, "cluster-b"), "cluster-a")
	if _, err := foreign.Check(ctx, &healthpb.HealthCheckRequest{}); !errors.Is(err, errForeign) {
		t.Fatalf("unary answer of a foreign node: %v, want the check's error", err)
	}
	fs, err := foreign.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := fs.Recv(); !errors.Is(err, errForeign) {
			t.Fatalf("streamed answer %d of a foreign node: %v, want the check's error", i, err)
		}
	}
}
