package devcluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/internal/devcluster"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A node added to a running cluster joins it and becomes a voter; it can
// be cut off, healed, stopped and restarted like the first nodes.
func TestAddStopRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Config{Nodes: 1, Dir: t.TempDir(), ElectionTimeout: devcluster.FastElection, RaftProxies: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	if _, err := c.Add(ctx, devcluster.AddConfig{ID: "n1"}); err == nil {
		t.Fatal("added a second n1")
	}
	i, err := c.Add(ctx, devcluster.AddConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 2 || c.NodeID(i) != "n2" || len(c.Addrs()) != 2 {
		t.Fatalf("after Add: size %d, node %d is %q, addrs %v", c.Size(), i, c.NodeID(i), c.Addrs())
	}
	voters := func() int {
		st, err := c.Server(0).Node().Status()
		if err != nil {
			return 0
		}
		n := 0
		for _, m := range st.Members {
			if m.Suffrage == "voter" {
				n++
			}
		}
		return n
	}
	waitFor(t, "n2 a voter", func() bool { return voters() == 2 })
	if err := c.Cut(i); err != nil {
		t.Fatal(err)
	}
	if err := c.Heal(i); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx, i); err != nil {
		t.Fatal(err)
	}
	if c.Server(i) != nil {
		t.Fatal("stopped node still has a server")
	}
	if err := c.Restart(ctx, i); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(c.DataDir(i), "n2") {
		t.Fatalf("n2's data dir %s", c.DataDir(i))
	}
}

func TestRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := devcluster.Start(ctx, devcluster.Config{Nodes: 2, Dir: t.TempDir(), Backup: strings.NewReader("x")}); err == nil {
		t.Fatal("started 2 nodes from a backup")
	}
	c, err := devcluster.Start(ctx, devcluster.Config{Nodes: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := c.Cut(0); err == nil {
		t.Fatal("cut without RaftProxies")
	}
}
