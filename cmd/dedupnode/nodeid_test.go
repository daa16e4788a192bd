package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// TestNodeIDFlagsRefusedBeforeAnythingIsWritten: serve, join and restore
// refuse a --node-id the state machine cannot record (and a --peers entry
// naming one) as a usage error naming the flag and the limit, before
// they create a data dir or ask a cluster anything. (serve --bootstrap
// with a 200-byte ID never became ready; join --force added a member
// that could never be removed.)
func TestNodeIDFlagsRefusedBeforeAnythingIsWritten(t *testing.T) {
	long := strings.Repeat("x", fsm.MaxNodeIDBytes+1)
	dir := filepath.Join(t.TempDir(), "data")
	backup := filepath.Join(t.TempDir(), "b.snap")
	if err := os.WriteFile(backup, []byte("not read"), 0o644); err != nil {
		t.Fatal(err)
	}
	closed := closedAddr(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"serve", []string{"serve", "--node-id", long, "--data-dir", dir, "--bootstrap", "--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, "--node-id: "},
		{"serve 200 bytes", []string{"serve", "--node-id", strings.Repeat("y", 200), "--data-dir", dir, "--bootstrap"}, "is 200 bytes, longer than the 128 bytes"},
		{"serve join", []string{"serve", "--node-id", long, "--data-dir", dir, "--join", closed}, "--node-id: "},
		{"serve peers", []string{"serve", "--node-id", "n1", "--data-dir", dir, "--peers", "n1=127.0.0.1:1=127.0.0.1:2," + long + "=127.0.0.1:3=127.0.0.1:4"}, "--peers entry"},
		{"serve space", []string{"serve", "--node-id", "n1 ", "--data-dir", dir, "--bootstrap"}, "--node-id: \"n1 \" ends with a space"},
		{"join", []string{"join", "--addr", closed, "--node-id", long, "--raft-addr", "127.0.0.1:1", "--grpc-addr", "127.0.0.1:2", "--force"}, "--node-id: "},
		{"restore", []string{"restore", "--from", backup, "--node-id", long, "--data-dir", dir, "--raft-addr", "127.0.0.1:1"}, "--node-id: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, context.Background(), "", c.args...)
			if code != exitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want a usage error", code, out, errs)
			}
			assertOneLine(t, errs)
			if !strings.Contains(errs, c.want) || (c.name != "serve space" && !strings.Contains(errs, "128 bytes")) {
				t.Fatalf("stderr %q lacks %q or the limit", errs, c.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("%s was created (%v)", dir, err)
			}
		})
	}
}

// TestRemove_MemberWhoseIDTheFSMCannotRecord: 'remove' takes out a member
// an older version let in under an over-long ID (added here straight
// through Raft, as it did), says that the ID could not be retired, and the
// cluster is back to its real members.
func TestRemove_MemberWhoseIDTheFSMCannotRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := testcluster.New(t, devcluster.Config{Nodes: 1})
	addr := cl.Addrs()[0]
	long := strings.Repeat("x", fsm.MaxNodeIDBytes+1)
	if err := cl.Server(0).Node().Raft().AddNonvoter(raft.ServerID(long), raft.ServerAddress(closedAddr(t)), 0, 10*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	waitSuffrage(t, ctx, addr, long, "nonvoter", "added through raft")
	code, out, errb := runCLI(t, ctx, "", "remove", "--addr", addr, long)
	if code != 0 || !strings.Contains(out, "removed from the Raft configuration") || !strings.Contains(out, "not retired") {
		t.Fatalf("remove: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	waitSuffrage(t, ctx, addr, long, "", "removed")
}

// TestRaftAddrFlagsMustBeHostPort: join (with --force too) and restore
// refuse a --raft-addr or --grpc-addr that is not HOST:PORT, as --addr is,
// before they ask a cluster anything or write a data dir (both used to
// record "nonsense" or "garbage" as a member's Raft address).
func TestRaftAddrFlagsMustBeHostPort(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	backup := filepath.Join(t.TempDir(), "b.snap")
	if err := os.WriteFile(backup, []byte("not read"), 0o644); err != nil {
		t.Fatal(err)
	}
	closed := closedAddr(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"join force raft", []string{"join", "--addr", closed, "--node-id", "n4", "--raft-addr", "nonsense", "--grpc-addr", "127.0.0.1:17073", "--force"}, `--raft-addr "nonsense": want HOST:PORT`},
		{"join raft port", []string{"join", "--addr", closed, "--node-id", "n4", "--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:17073"}, `--raft-addr "127.0.0.1:0": port "0"`},
		{"join grpc", []string{"join", "--addr", closed, "--node-id", "n4", "--raft-addr", "127.0.0.1:17003", "--grpc-addr", "garbage", "--force"}, `--grpc-addr "garbage": want HOST:PORT`},
		{"restore", []string{"restore", "--from", backup, "--node-id", "r9", "--data-dir", dir, "--raft-addr", "garbage"}, `--raft-addr "garbage": want HOST:PORT`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, context.Background(), "", c.args...)
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
