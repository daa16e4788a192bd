package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/internal/devcluster"
)

// TestServeRefusesAddressesAndIDsNoOneCouldUse: serve refuses, as a usage
// error naming the flag or the --peers entry and why, before it writes or
// listens on anything, an address that is not HOST:PORT, one that listens
// on every interface without an address to advertise, a --peers entry at
// an address no node can dial, and a node ID --peers could never name.
// (--grpc-addr "" served on every interface at a port from the OS while
// advertising 127.0.0.1; --raft-addr nonsense exited 1 with a hint about
// free addresses and the data dir; a --peers entry b=foo=bar, and
// --bootstrap with --node-id a,b, were accepted.)
func TestServeRefusesAddressesAndIDsNoOneCouldUse(t *testing.T) {
	// Each case's command line names its own data dir, dataDir.
	const dataDir = "DATA_DIR"
	raft, grpc := closedAddr(t), closedAddr(t)
	self := "n1=" + raft + "=" + grpc
	serve := func(mode string, flags ...string) []string {
		args := []string{"serve", "--node-id", "n1", "--data-dir", dataDir, "--raft-addr", raft, "--grpc-addr", grpc}
		switch mode {
		case "bootstrap":
			args = append(args, "--bootstrap")
		case "join":
			args = append(args, "--join", grpc)
		}
		return append(args, flags...) // a flag given twice: the last wins
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"empty grpc addr", serve("bootstrap", "--grpc-addr", ""), `--grpc-addr "": want HOST:PORT`},
		{"nonsense raft addr", serve("bootstrap", "--raft-addr", "nonsense"), `--raft-addr "nonsense": want HOST:PORT`},
		{"nonsense grpc addr", serve("bootstrap", "--grpc-addr", "nonsense"), `--grpc-addr "nonsense": want HOST:PORT`},
		{"grpc port out of range", serve("bootstrap", "--grpc-addr", "127.0.0.1:70000"), `--grpc-addr "127.0.0.1:70000": port "70000": want a number from 0 to 65535`},
		{"grpc on every interface", serve("bootstrap", "--grpc-addr", ":0"), `--grpc-addr ":0" listens on every interface, an address no other node or client can dial: give --grpc-advertise HOST:PORT too`},
		{"raft on every interface", serve("bootstrap", "--raft-addr", "0.0.0.0:0"), `--raft-addr "0.0.0.0:0" listens on every interface, an address no other node or client can dial: give --raft-advertise HOST:PORT too`},
		{"raft advertise every interface", serve("bootstrap", "--raft-addr", "[::]:0", "--raft-advertise", "0.0.0.0:7000"), `--raft-advertise "0.0.0.0:7000": 0.0.0.0 means every interface`},
		{"grpc advertise nonsense", serve("bootstrap", "--grpc-addr", ":0", "--grpc-advertise", "nonsense"), `--grpc-advertise "nonsense": want HOST:PORT`},
		{"grpc advertise port 0", serve("bootstrap", "--grpc-advertise", "10.0.0.4:0"), `--grpc-advertise "10.0.0.4:0": port "0": want a number from 1 to 65535`},
		{"admin addr nonsense", serve("bootstrap", "--admin-addr", "nonsense"), `--admin-addr "nonsense": want HOST:PORT`},
		{"join nonsense", serve("join", "--join", "nonsense"), `--join "nonsense": want HOST:PORT`},
		{"peers raft addr", serve("", "--peers", self+",b=foo=bar"), `--peers entry "b=foo=bar": raft_addr "foo": want HOST:PORT`},
		{"peers grpc addr", serve("", "--peers", self+",b=127.0.0.1:7001=bar"), `--peers entry "b=127.0.0.1:7001=bar": grpc_addr "bar": want HOST:PORT`},
		{"peers every interface", serve("", "--peers", self+",b=0.0.0.0:7001=127.0.0.1:7071"), `raft_addr "0.0.0.0:7001": 0.0.0.0 means every interface`},
		{"peers id with =", serve("", "--peers", self+",a=b=127.0.0.1:7001=127.0.0.1:7071"), `--peers entry "a=b=127.0.0.1:7001=127.0.0.1:7071": want id=raft_addr=grpc_addr, e.g. n1=127.0.0.1:7000=127.0.0.1:7070 (',' separates the entries and '=' the fields, so neither can be part of a node ID)`},
		{"node id with ,", serve("bootstrap", "--node-id", "a,b"), `--node-id: "a,b" contains ",", which separates serve --peers (id=raft_addr=grpc_addr,...): a node with this ID could never be named there`},
		{"node id with =", serve("join", "--node-id", "a=b"), `--node-id: "a=b" contains "=", which separates serve --peers`},
		{"restore node id with =", []string{"restore", "--from", "x.snap", "--node-id", "r=1", "--data-dir", dataDir, "--raft-addr", raft}, `--node-id: "r=1" contains "="`},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Bounds the old behaviour, a node that served (or waited
			// for an election) until cancelled.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := filepath.Join(t.TempDir(), "data")
			args := slices.Clone(c.args)
			args[slices.Index(args, dataDir)] = dir
			code, out, errs := runCLI(t, ctx, "", args...)
			if code != exitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want a usage error", code, out, errs)
			}
			assertOneLine(t, errs)
			if !strings.Contains(errs, c.want) {
				t.Fatalf("stderr %q lacks %q", errs, c.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("%s was created (%v)", dir, err)
			}
		})
	}
}

// TestServeEmptyGRPCAddrProcessExits2: the dedupnode process given
// --grpc-addr "" exits 2 at once with the usage error (it served on every
// interface, at a port from the OS, until stopped).
func TestServeEmptyGRPCAddrProcessExits2(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	var errs syncBuffer
	p := startProc(t, nil, io.Discard, &errs, "serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap", "--raft-addr", closedAddr(t), "--grpc-addr", "")
	if !p.wait(60 * time.Second) {
		t.Fatalf("serve --grpc-addr \"\" still ran after 60s; stderr %q", errs.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(errs.String(), `--grpc-addr "": want HOST:PORT`) {
		t.Fatalf("exit %d, stderr %q; want exit %d naming --grpc-addr", code, errs.String(), exitUsage)
	}
}

// TestServeStartsADataDirWhoseIDHasASeparator: a data dir made under a
// node ID with ',' (as --bootstrap allowed) still starts with that
// --node-id: the separator rule is for new nodes only.
func TestServeStartsADataDirWhoseIDHasASeparator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	base := t.TempDir()
	node := devcluster.Node{ID: "a,b", GRPC: closedAddr(t), Raft: closedAddr(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Config{Dir: base, Addrs: []devcluster.Node{node}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r := startCmd("serve", "--node-id", node.ID, "--data-dir", filepath.Join(base, node.ID),
		"--raft-addr", node.Raft, "--grpc-addr", node.GRPC, "--log-level", "info")
	t.Cleanup(func() { r.stop(t) })
	r.wait(t, "serving log line", func() (string, bool) {
		return "", strings.Contains(r.errs.String(), "dedupnode serving")
	})
	if code := r.stop(t); code != 0 {
		t.Fatalf("serve exited %d: %s", code, r.errs.String())
	}
}
