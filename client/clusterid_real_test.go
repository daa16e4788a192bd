package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// wantMismatch checks that err is ErrClusterMismatch, typed, naming both
// clusters and the node.
func wantMismatch(t *testing.T, err error, addr, want, got string) {
	t.Helper()
	var mm *client.ClusterMismatchError
	if !errors.Is(err, client.ErrClusterMismatch) || !errors.As(err, &mm) {
		t.Fatalf("got %v, want ErrClusterMismatch", err)
	}
	if mm.Addr != addr || mm.Want != want || mm.Got != got {
		t.Fatalf("mismatch %+v: want addr %s, want %s, got %s", mm, addr, want, got)
	}
}

// wantNotWritten checks that the cluster behind c holds nothing of id in
// namespace ns (no namespace at all counts).
func wantNotWritten(t *testing.T, c *client.Client, ns, id string) {
	t.Helper()
	res, err := c.Check(testCtx(t, 30*time.Second), ns, [][]byte{[]byte(id)}, client.Linearizable)
	if errors.Is(err, client.ErrNamespaceNotFound) {
		return
	}
	if err != nil || res[0].Code != client.CodeNotSeen {
		t.Fatalf("check %s/%s on the other cluster: %v %v, want not seen", ns, id, res, err)
	}
}

// A client told which cluster it serves (WithClusterID) refuses a node of
// another one before sending it anything: the write does not reach it.
func TestClient_WithClusterIDRefusesAnotherClustersNode(t *testing.T) {
	a := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	b := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	ctx := testCtx(t, 60*time.Second)
	ca := newClient(t, a.Addrs())
	if _, err := ca.Mark(ctx, "orders", []client.Item{{ID: []byte("o-1")}}, 0); err != nil {
		t.Fatal(err)
	}
	idA := ca.ClusterID()
	st, err := ca.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if idA == "" || st.ClusterID != idA {
		t.Fatalf("client learned cluster %q, status says %q", idA, st.ClusterID)
	}

	wrong := newClient(t, b.Addrs(), client.WithClusterID(idA))
	_, err = wrong.Mark(ctx, "orders", []client.Item{{ID: []byte("o-2")}}, 0)
	cb := newClient(t, b.Addrs())
	if _, serr := cb.Status(ctx); serr != nil {
		t.Fatal(serr)
	}
	wantMismatch(t, err, b.Addrs()[0], idA, cb.ClusterID())
	if e := client.AsError(err); e.Attempts != 1 {
		t.Fatalf("a mismatch was retried: %d attempts", e.Attempts)
	}
	wantNotWritten(t, cb, "orders", "o-2")
}

// The address a client knows is taken over by another cluster's node (a
// stale node table, a cluster rebuilt on the same ports): the client,
// which learned its cluster from the first node it talked to, notices on
// the new connection and writes nothing there.
func TestClient_AddressTakenOverByAnotherClusterIsRefused(t *testing.T) {
	a := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	addr := a.Addrs()[0]
	ctx := testCtx(t, 90*time.Second)
	c := newClient(t, []string{addr})
	if _, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("o-1")}}, 0); err != nil {
		t.Fatal(err)
	}
	idA := c.ClusterID()
	if idA == "" {
		t.Fatal("the client learned no cluster ID from its first node")
	}
	if err := a.Stop(ctx, 0); err != nil {
		t.Fatal(err)
	}
	b := testcluster.New(t, devcluster.Config{AutoCreateNamespaces: true,
		Addrs: []devcluster.Node{{ID: "b1", GRPC: addr, Raft: "127.0.0.1:0"}}})
	cb := newClient(t, b.Addrs())
	if _, err := cb.Status(ctx); err != nil {
		t.Fatal(err)
	}

	_, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("o-2")}}, 0)
	wantMismatch(t, err, addr, idA, cb.ClusterID())
	wantNotWritten(t, cb, "orders", "o-2")
	// And it stays refused: the node is not used again.
	_, err = c.Check(ctx, "orders", [][]byte{[]byte("o-1")}, client.Stale)
	wantMismatch(t, err, addr, idA, cb.ClusterID())
}
