package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/headercheck"
)

// ErrClusterMismatch: a node answered with another cluster's ID than the
// one this client talks to (its first node's, or WithClusterID's), or a
// node refused a peer of another cluster (a Join). The client does not
// use that node again; the call is not retried. Error.Cause is a
// *ClusterMismatchError with both IDs and the address.
var ErrClusterMismatch = errors.New("node belongs to another cluster")

// ClusterMismatchError names the two clusters and the node. It matches
// ErrClusterMismatch with errors.Is.
type ClusterMismatchError struct {
	// Addr is the node whose cluster differs (for a refused Join, the
	// node the cluster refused).
	Addr string
	// Want is the cluster the client (or, for a refused Join, the
	// cluster) belongs to; Got the one the node at Addr reported.
	Want, Got string
}

func (e *ClusterMismatchError) Error() string {
	return fmt.Sprintf("node %s belongs to cluster %s, not to cluster %s", e.Addr, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrClusterMismatch) true.
func (e *ClusterMismatchError) Unwrap() error { return ErrClusterMismatch }

// WithClusterID makes the client talk only to nodes of the cluster id (as
// `dedupnode status` shows it). Without it the client takes the ID of the
// first node that answers. Either way a node that reports another ID fails
// the call with ErrClusterMismatch. A node that reports none (an older
// version, or a new node that has not applied the ID yet) is used.
func WithClusterID(id string) Option {
	return func(o *options) { o.clusterID = id }
}

// ClusterID returns the cluster ID the client checks nodes against: given
// with WithClusterID or learned from the first node that reported one; ""
// until then.
func (c *Client) ClusterID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clusterID
}

// observe checks the cluster ID in the response header md from the node at
// addr: the first one seen becomes the client's; one that differs marks the
// node foreign and is returned as a *ClusterMismatchError. A matching
// answer marks the node's current connection verified.
func (c *Client) observe(addr string, md metadata.MD) error {
	v := md.Get(dedupv1.HeaderClusterID)
	if len(v) == 0 || v[0] == "" {
		return nil
	}
	got := v[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clusterID == "" {
		c.clusterID = got
		c.opts.logger.Debug("dedupnode client: cluster", "id", got, "from", addr)
	}
	if got != c.clusterID {
		e := &ClusterMismatchError{Addr: addr, Want: c.clusterID, Got: got}
		c.foreign[addr] = e
		delete(c.verified, addr)
		if c.leader == addr {
			c.leader = ""
		}
		return e
	}
	delete(c.foreign, addr)
	c.verified[addr] = c.linkLocked(addr).state().dials
	return nil
}

// foreignLocked says whether addr last answered with another cluster's ID.
func (c *Client) foreignLocked(addr string) bool {
	_, ok := c.foreign[addr]
	return ok
}

// vet makes sure, before a call goes to addr, that the node there belongs
// to the client's cluster: a node not heard from on its current connection
// (a leader named by a redirect or a node table, a node whose connection
// broke)
// is asked for its Status first, so no write reaches another cluster's
// node that a stale address points to. Discovery's Status calls vet the
// nodes it asks. Only a mismatch, or a refused dial, fails the attempt.
func (c *Client) vet(ctx context.Context, addr string, cc *grpc.ClientConn, l *link) error {
	c.mu.Lock()
	if e := c.foreign[addr]; e != nil {
		c.mu.Unlock()
		return e
	}
	dials, ok := c.verified[addr]
	c.mu.Unlock()
	// Verified on the connection that is up now. With none up, the call
	// would dial one, to whatever listens at addr by then: ask first.
	if st := l.state(); ok && st.up && dials == st.dials {
		return nil
	}
	_, err := dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
	var mm *ClusterMismatchError
	if errors.As(err, &mm) || (err != nil && l.down()) {
		// A mismatch; or nothing accepts connections at addr, which the
		// call would only dial again to learn.
		return err
	}
	// Any other failure is the call's to meet; its answer's header is
	// checked all the same.
	return nil
}

// checkCluster is the connection to addr's header check (observe): a
// mismatched answer is replaced by the *ClusterMismatchError, it is
// another cluster's.
func (c *Client) checkCluster(addr string) headercheck.Check {
	return func(md metadata.MD) error { return c.observe(addr, md) }
}
