package cluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
)

// syncBuffer is a log destination that nodes' goroutines may write to
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func stopNode(t *testing.T, n *Node) {
	t.Helper()
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// listenAt binds addr again (a port this test had and released), retrying
// while the kernel still holds it.
func listenAt(t *testing.T, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	waitFor(t, 30*time.Second, "listen on "+addr, func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	return ln
}

func wantMismatch(t *testing.T, err error, dir, recorded string) {
	t.Helper()
	var me *NodeIDMismatchError
	if !errors.As(err, &me) || me.Recorded != recorded {
		t.Fatalf("got %v, want a *NodeIDMismatchError naming %q", err, recorded)
	}
	for _, want := range []string{dir, `"` + recorded + `"`, "--node-id " + recorded, "empty --data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestNodeID_DataDirOfAnotherNodeIsRefused: a node started with another
// member's data dir would run as a member nobody replicates to. The ID is
// recorded at first start, and a start with another ID is refused before
// anything is opened; the right ID still starts.
func TestNodeID_DataDirOfAnotherNodeIsRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, true)
	cfg.NodeID = "n3"
	stopNode(t, startNode(t, cfg))
	if id, err := RecordedNodeID(dir); err != nil || id != "n3" {
		t.Fatalf("recorded node ID %q, %v; want n3", id, err)
	}

	wrong := cfg
	wrong.NodeID, wrong.Bootstrap = "n9", false
	n, err := New(wrong)
	if err == nil {
		stopNode(t, n)
		t.Fatal("n9 started on n3's data dir")
	}
	wantMismatch(t, err, dir, "n3")
	if !strings.Contains(err.Error(), "recorded at first start") {
		t.Errorf("error does not say where the ID comes from: %v", err)
	}

	cfg.Bootstrap = false
	stopNode(t, startNode(t, cfg))
}

// TestNodeID_LegacyDataDirAdoptsTheGivenID: a data dir of a version
// before the node-id file (the v1 fixture's Raft log) starts with the ID
// it is given, which is recorded then, so the next start with another ID
// is refused.
func TestNodeID_LegacyDataDirAdoptsTheGivenID(t *testing.T) {
	dir := v1DataDir(t)
	var logs syncBuffer
	cfg := testConfig(dir, false)
	cfg.NodeID, cfg.LogStore = "v1", LogStoreBoltDB
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	stopNode(t, startNode(t, cfg))
	if id, err := RecordedNodeID(dir); err != nil || id != "v1" {
		t.Fatalf("recorded node ID %q, %v; want v1", id, err)
	}
	if !strings.Contains(logs.String(), "adopted the node ID") {
		t.Errorf("no log line says the ID was adopted:\n%s", logs.String())
	}
	cfg.NodeID = "v9"
	if n, err := New(cfg); err == nil {
		stopNode(t, n)
		t.Fatal("v9 started on v1's data dir")
	} else {
		wantMismatch(t, err, dir, "v1")
	}
}

// TestNodeID_LegacyDataDirOfAnotherNodeAtThisAddressIsRefused: without a
// node-id file, a start whose ID the Raft configuration does not list,
// while it lists another ID at this very Raft address, is that node's
// data dir under a wrong --node-id: refused, and nothing recorded (the
// right ID still starts).
func TestNodeID_LegacyDataDirOfAnotherNodeAtThisAddressIsRefused(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	cfg := testConfig(dir, true)
	cfg.NodeID, cfg.RaftListener = "n3", ln
	stopNode(t, startNode(t, cfg))
	if err := os.Remove(filepath.Join(dir, NodeIDFile)); err != nil { // as an earlier version left it
		t.Fatal(err)
	}

	wrong := cfg
	wrong.NodeID, wrong.Bootstrap, wrong.RaftListener = "n9", false, listenAt(t, addr)
	n, err := New(wrong)
	if err == nil {
		stopNode(t, n)
		t.Fatal("n9 started on n3's data dir")
	}
	wantMismatch(t, err, dir, "n3")
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("error does not name the address: %v", err)
	}
	if id, _ := RecordedNodeID(dir); id != "" {
		t.Fatalf("the refused start recorded %q", id)
	}

	cfg.Bootstrap, cfg.RaftListener = false, listenAt(t, addr)
	stopNode(t, startNode(t, cfg))
	if id, _ := RecordedNodeID(dir); id != "n3" {
		t.Fatalf("recorded %q after n3's start, want n3", id)
	}
}

// TestRaftAddrChanged_WarnsAndJoinRecordsTheNewAddress: n3 of a 3-node
// cluster restarted on another Raft address hears from no leader (the
// others dial the old one). At start it says so in a WARN naming both
// addresses and the fix; the fix it names — a join through a member with
// the new address — brings it back as a voter that applies new entries.
func TestRaftAddrChanged_WarnsAndJoinRecordsTheNewAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	lead := testConfig(t.TempDir(), true)
	lead.NodeID = "n1"
	n1 := startNode(t, lead)
	nodes := map[string]*Node{}
	cfgs := map[string]Config{}
	for _, id := range []string{"n2", "n3"} {
		cfg := testConfig(t.TempDir(), false)
		cfg.NodeID = id
		nodes[id], cfgs[id] = startNode(t, cfg), cfg
		if err := n1.Join(ctx, id, nodes[id].RaftAddr(), "127.0.0.1:1"); err != nil {
			t.Fatalf("join %s: %v", id, err)
		}
		if err := n1.Promote(ctx, id, true); err != nil {
			t.Fatalf("promote %s: %v", id, err)
		}
	}
	oldAddr := nodes["n3"].RaftAddr()
	stopNode(t, nodes["n3"])

	var logs syncBuffer
	cfg := cfgs["n3"]
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	n3 := startNode(t, cfg) // 127.0.0.1:0: another port
	newAddr := n3.RaftAddr()
	if newAddr == oldAddr {
		t.Fatalf("n3 got its old port %s again", oldAddr)
	}
	warn := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, oldAddr) && strings.Contains(l, newAddr) {
			warn = l
		}
	}
	if warn == "" || !strings.Contains(warn, "join --node-id n3 --raft-addr "+newAddr) || !strings.Contains(warn, "--raft-addr "+oldAddr) {
		t.Fatalf("no WARN names both addresses and the fix:\n%s", logs.String())
	}

	if err := n1.Join(ctx, "n3", newAddr, "127.0.0.1:1"); err != nil {
		t.Fatalf("join n3 at its new address: %v", err)
	}
	if _, err := n1.Propose(ctx, []fsm.Op{markOp("after-move")}); err != nil {
		t.Fatal(err)
	}
	target := n1.Raft().CommitIndex()
	waitFor(t, 60*time.Second, "n3 a voter at its new address that applies new entries", func() bool {
		if n3.FSM().AppliedIndex() < target {
			return false
		}
		st, err := n1.Status()
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID == "n3" {
				return m.Suffrage == "voter" && m.RaftAddr == newAddr
			}
		}
		return false
	})
}

// TestRaftAddrChanged_RefusedWhenAsked: with RefuseRaftAddrChange the
// start on another address fails with *RaftAddrChangedError; without it a
// lone voter, which needs nobody to reach it, starts and leads.
func TestRaftAddrChanged_RefusedWhenAsked(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, true)
	first := startNode(t, cfg)
	oldAddr := first.RaftAddr()
	stopNode(t, first)

	cfg.Bootstrap, cfg.RefuseRaftAddrChange = false, true
	n, err := New(cfg)
	var moved *RaftAddrChangedError
	if !errors.As(err, &moved) || moved.Recorded != oldAddr {
		if err == nil {
			stopNode(t, n)
		}
		t.Fatalf("got %v, want a *RaftAddrChangedError recording %s", err, oldAddr)
	}

	cfg.RefuseRaftAddrChange = false
	n = startNode(t, cfg)
	waitFor(t, 30*time.Second, "the lone voter leads on its new address", n.IsLeader)
	var conf raft.Configuration
	if f := n.Raft().GetConfiguration(); f.Error() == nil {
		conf = f.Configuration()
	}
	if len(conf.Servers) != 1 {
		t.Fatalf("configuration %+v", conf)
	}
}
