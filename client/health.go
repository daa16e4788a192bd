package client

import (
	"context"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthOf asks the node at addr (host:port) for its gRPC health
// (grpc.health.v1, the server as a whole), as a load balancer would, with
// a single attempt: no retries, no redirection. serving is true when it
// answers SERVING. Health checks need no token. Errors are typed as the
// other calls' (AsError).
func (c *Client) HealthOf(ctx context.Context, addr string) (serving bool, err error) {
	resp, err := onceAt(c, ctx, "health", addr, func(ctx context.Context, cc *grpc.ClientConn) (*healthpb.HealthCheckResponse, error) {
		return healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	})
	if err != nil {
		return false, err
	}
	return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, nil
}

// onceAt runs call against the node at addr with a single attempt (no
// retries, no redirection: the answer is about that node), bounded by the
// client's per-attempt timeout. A failure is an *Error typed as the other
// calls' (AsError), op naming the call.
func onceAt[T any](c *Client, ctx context.Context, op, addr string, call func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	cc, err := c.conn(addr)
	if err != nil {
		return zero, err
	}
	c.mu.Lock()
	l := c.linkLocked(addr)
	c.mu.Unlock()
	before := l.state()
	actx, cancel := c.attemptCtx(ctx, op)
	defer cancel()
	resp, err := call(actx, cc)
	if err != nil {
		e, _ := c.classify(op, addr, l, before, err)
		if ctx.Err() != nil {
			e.ctxErr = ctx.Err()
		}
		return zero, c.finish(e, 1, false)
	}
	return resp, nil
}
