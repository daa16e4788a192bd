// Package testcluster is the tests' side of internal/devcluster: real
// in-process dedupnode nodes (server.Start: real Raft, Pebble and gRPC) on
// loopback ports from 127.0.0.1:0, closed when the test ends, plus client
// helpers. It imports server, so only tests outside package server
// (including server_test) may use it.
package testcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/server"
)

// Election is the Raft election (and heartbeat) timeout of nodes started
// here (devcluster.FastElection, as the demo's).
const Election = devcluster.FastElection

// Demo starts a cluster as the demo does (three nodes, namespaces created
// on first use) in a temporary directory and closes it at cleanup.
func Demo(t testing.TB) *devcluster.Cluster {
	t.Helper()
	return New(t, devcluster.Config{Nodes: 3, AutoCreateNamespaces: true})
}

// New starts cfg (Dir, ElectionTimeout and LogStore set here),
// waiting until a ready leader is known to every node, and closes it at
// cleanup.
func New(t testing.TB, cfg devcluster.Config) *devcluster.Cluster {
	t.Helper()
	cfg.Dir, cfg.ElectionTimeout, cfg.LogStore = t.TempDir(), Election, LogStore()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Logf("close cluster: %v", err)
		}
	})
	return c
}

// PatientRetry rides out an election on two loaded cores.
var PatientRetry = client.WithRetry(100, 20*time.Millisecond, 500*time.Millisecond)

// Client connects to addrs with PatientRetry followed by opts, and closes
// the client at cleanup.
func Client(t testing.TB, addrs []string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, addrs, append([]client.Option{PatientRetry}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Batcher is Client's Batcher; it is closed at cleanup, before the client.
func Batcher(t testing.TB, addrs []string, opts ...client.Option) *client.Batcher {
	t.Helper()
	b := Client(t, addrs, opts...).NewBatcher()
	t.Cleanup(func() { b.Close() })
	return b
}

// WaitFor polls cond until it holds, failing the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Listen opens a TCP listener on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// LogStoreEnv names the environment variable that picks the Raft log store
// of every node these helpers configure (as serve's
// DEDUPNODE_RAFT_LOG_STORE), so a package's tests can be run with each
// store: DEDUPNODE_RAFT_LOG_STORE=boltdb go test ./server/. Unset or
// empty: cluster.DefaultLogStore.
const LogStoreEnv = "DEDUPNODE_RAFT_LOG_STORE"

// LogStore is the store named by LogStoreEnv ("" = the default). An
// unknown name panics: a typo must not silently test the default.
func LogStore() cluster.LogStore {
	v := os.Getenv(LogStoreEnv)
	if v == "" {
		return ""
	}
	ls, err := cluster.ParseLogStore(v)
	if err != nil {
		panic(fmt.Sprintf("%s: %v", LogStoreEnv, err))
	}
	return ls
}

// Start starts n nodes n1..nN (devcluster.Start) with Election-based
// timings; tune, if not nil, adjusts node i's config (peers already set)
// before it starts. It waits until a ready leader is known to every node,
// returns the servers and the leader's index, and closes every node at
// cleanup.
func Start(t testing.TB, n int, tune func(i int, cfg *server.Config)) ([]*server.Server, int) {
	t.Helper()
	c := New(t, devcluster.Config{Nodes: n, Tune: tune})
	return c.Servers(), c.Leader()
}
