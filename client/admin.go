package client

import (
	"context"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"google.golang.org/grpc"
)

// CreateNamespace creates a namespace; zero fields take the server defaults
// (TTL 24 h, max TTL 7 days, IDs up to 512 bytes, fixed expiry, 30 s
// leases). Returns the namespace as created. Errors: AlreadyExists,
// InvalidArgument (bad name, TTL out of range).
//
// A create retried after an unknown outcome may answer AlreadyExists.
func (c *Client) CreateNamespace(ctx context.Context, ns Namespace) (Namespace, error) {
	if err := ns.validDurations("create namespace", "the default"); err != nil {
		return Namespace{}, err
	}
	req := &dedupv1.CreateNamespaceRequest{Namespace: ns.proto()}
	return c.namespaceCall(ctx, "create namespace", toLeader, func(ctx context.Context, a dedupv1.AdminClient) (*dedupv1.NamespaceResponse, error) {
		return a.CreateNamespace(ctx, req)
	})
}

// UpdateNamespace changes a namespace's settings; zero fields keep their
// value, and the bucket width never changes. Returns the namespace as
// updated. Errors: NotFound, InvalidArgument.
func (c *Client) UpdateNamespace(ctx context.Context, ns Namespace) (Namespace, error) {
	if err := ns.validDurations("update namespace", "unchanged"); err != nil {
		return Namespace{}, err
	}
	req := &dedupv1.UpdateNamespaceRequest{Namespace: ns.proto()}
	return c.namespaceCall(ctx, "update namespace", toLeader, func(ctx context.Context, a dedupv1.AdminClient) (*dedupv1.NamespaceResponse, error) {
		return a.UpdateNamespace(ctx, req)
	})
}

// DescribeNamespace returns a namespace's settings. Errors: NotFound.
func (c *Client) DescribeNamespace(ctx context.Context, name string) (Namespace, error) {
	req := &dedupv1.DescribeNamespaceRequest{Name: name}
	return c.namespaceCall(ctx, "describe namespace", toLeader, func(ctx context.Context, a dedupv1.AdminClient) (*dedupv1.NamespaceResponse, error) {
		return a.DescribeNamespace(ctx, req)
	})
}

// ListNamespaces returns every namespace, ordered as the server lists them.
func (c *Client) ListNamespaces(ctx context.Context) ([]Namespace, error) {
	var resp *dedupv1.ListNamespacesResponse
	err := c.invoke(ctx, "list namespaces", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = dedupv1.NewAdminClient(cc).ListNamespaces(ctx, &dedupv1.ListNamespacesRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]Namespace, 0, len(resp.GetNamespaces()))
	for _, n := range resp.GetNamespaces() {
		out = append(out, namespaceOf(n))
	}
	return out, nil
}

// DeleteNamespace deletes a namespace and every ID recorded in it.
// Errors: NotFound, FailedPrecondition or InvalidArgument for "default".
func (c *Client) DeleteNamespace(ctx context.Context, name string) error {
	return c.invoke(ctx, "delete namespace", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).DeleteNamespace(ctx, &dedupv1.DeleteNamespaceRequest{Name: name})
		return err
	})
}

func (c *Client) namespaceCall(ctx context.Context, op string, t target, call func(context.Context, dedupv1.AdminClient) (*dedupv1.NamespaceResponse, error)) (Namespace, error) {
	var resp *dedupv1.NamespaceResponse
	err := c.invoke(ctx, op, t, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = call(ctx, dedupv1.NewAdminClient(cc))
		return err
	})
	if err != nil {
		return Namespace{}, err
	}
	return namespaceOf(resp.GetNamespace()), nil
}

// Status returns the cluster as seen by one node: the leader when known,
// else the first node that answers. It also refreshes the client's view of
// the leader and the members.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var resp *dedupv1.StatusResponse
	err := c.invoke(ctx, "status", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
		return err
	})
	if err != nil {
		return Status{}, err
	}
	c.learn("", resp)
	return statusOf(resp), nil
}

// StatusOf returns the view of the node at addr (host:port) with a single
// attempt: no retries, no redirection. Use it to watch one node.
func (c *Client) StatusOf(ctx context.Context, addr string) (Status, error) {
	resp, err := onceAt(c, ctx, "status", addr, func(ctx context.Context, cc *grpc.ClientConn) (*dedupv1.StatusResponse, error) {
		return dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
	})
	if err != nil {
		return Status{}, err
	}
	c.learn(addr, resp)
	return statusOf(resp), nil
}

// Join adds a node to the cluster as a non-voter; the leader promotes it to
// voter once it has caught up. raftAddr and grpcAddr are the new node's
// host:port addresses as the other nodes reach them.
func (c *Client) Join(ctx context.Context, nodeID, raftAddr, grpcAddr string) error {
	req := &dedupv1.JoinRequest{NodeId: nodeID, RaftAddr: raftAddr, GrpcAddr: grpcAddr}
	return c.invoke(ctx, "join", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Join(ctx, req)
		return err
	})
}

// Remove removes a node from the Raft configuration. Errors: NotFound.
func (c *Client) Remove(ctx context.Context, nodeID string) error {
	return c.invoke(ctx, "remove", toLeader, func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := dedupv1.NewAdminClient(cc).Remove(ctx, &dedupv1.RemoveRequest{NodeId: nodeID})
		return err
	})
}

// TransferLeadership asks the leader to hand leadership to the voter
// nodeID ("" lets Raft pick the most up-to-date one) and returns the new
// leader's node ID.
func (c *Client) TransferLeadership(ctx context.Context, nodeID string) (string, error) {
	var resp *dedupv1.TransferLeadershipResponse
	err := c.invoke(ctx, "transfer leadership", toLeader, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = dedupv1.NewAdminClient(cc).TransferLeadership(ctx, &dedupv1.TransferLeadershipRequest{NodeId: nodeID})
		return err
	})
	if err != nil {
		return "", err
	}
	c.failed(c.Leader()) // leadership moved: rediscover on the next call
	return resp.GetNewLeaderId(), nil
}
