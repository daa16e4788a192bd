package client

import (
	"context"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthOf asks the node at addr (host:port) for its gRPC health
// (grpc.health.v1, the server as a whole), as a load balancer would, with
// a single attempt: no retries, no redirection. serving is true when it
// answers SERVING. Health checks need no token. Errors are typed as the
// other calls' (AsError).
func (c *Client) HealthOf(ctx context.Context, addr string) (serving bool, err error) {
	cc, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	l := c.linkLocked(addr)
	c.mu.Unlock()
	before := l.state()
	actx, cancel := c.attemptCtx(ctx)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(actx, &healthpb.HealthCheckRequest{})
	if err != nil {
		e, _ := c.classify("health", addr, l, before, err)
		if ctx.Err() != nil {
			e.ctxErr = ctx.Err()
		}
		return false, c.finish(e, 1, false)
	}
	return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, nil
}
