package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

func TestCheckHostPort(t *testing.T) {
	for _, a := range []string{"127.0.0.1:7000", "[::1]:7000", "node-3.eu_west.example:65535", "localhost:1", "[fe80::1%eth0]:7000"} {
		if err := CheckHostPort(a); err != nil {
			t.Errorf("CheckHostPort(%q) = %v, want nil", a, err)
		}
	}
	for _, a := range []string{"", "nonsense", "garbage", "127.0.0.1", ":7000", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000", "host:http",
		"http://127.0.0.1:7000", "a b:7000", "::1:7000", "127.0.0.1:7000/", "0.0.0.0:7000", "[::]:7000"} {
		if err := CheckHostPort(a); err == nil {
			t.Errorf("CheckHostPort(%q) = nil, want an error", a)
		}
	}
	if err := CheckHostPort("nonsense"); err == nil || !strings.Contains(err.Error(), "want HOST:PORT") {
		t.Errorf("CheckHostPort(nonsense) = %v, want it to say HOST:PORT", err)
	}
}

func TestCheckListenAddr(t *testing.T) {
	for a, every := range map[string]bool{"127.0.0.1:7000": false, "127.0.0.1:0": false, "localhost:7070": false, "[::1]:0": false,
		":7000": true, ":0": true, "0.0.0.0:7000": true, "[::]:7070": true} {
		if got, err := CheckListenAddr(a); err != nil || got != every {
			t.Errorf("CheckListenAddr(%q) = %v, %v, want %v, nil", a, got, err, every)
		}
	}
	for _, a := range []string{"", "nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:-1", "host:http", "a b:7000", "::1:7000"} {
		if _, err := CheckListenAddr(a); err == nil {
			t.Errorf("CheckListenAddr(%q) = nil error, want one", a)
		}
	}
}

// TestJoin_RefusesAddressesThatAreNotHostPort: a join whose Raft or gRPC
// address is not HOST:PORT is refused as an invalid raft_addr/grpc_addr
// before the configuration changes (join --force with --raft-addr
// nonsense used to add a member at "nonsense").
func TestJoin_RefusesAddressesThatAreNotHostPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t.TempDir(), true)
	cfg.NodeID = "n1"
	n1 := startNode(t, cfg)
	before := n1.Raft().LastIndex()
	for _, c := range []struct{ raft, grpc, field string }{
		{"nonsense", "127.0.0.1:17073", "raft_addr"},
		{"127.0.0.1:0", "127.0.0.1:17073", "raft_addr"},
		{"127.0.0.1:17003", "garbage", "grpc_addr"},
	} {
		err := n1.Join(ctx, "n4", c.raft, c.grpc)
		var inv *fsm.InvalidError
		if !errors.As(err, &inv) || inv.Field != c.field {
			t.Fatalf("join at %s / %s: %v, want an invalid %s", c.raft, c.grpc, err, c.field)
		}
		if got := members(t, n1); len(got) != 1 {
			t.Fatalf("refused join changed the configuration: %q", got)
		}
	}
	if after := n1.Raft().LastIndex(); after != before {
		t.Fatalf("refused joins wrote log entries %d..%d", before+1, after)
	}
}
