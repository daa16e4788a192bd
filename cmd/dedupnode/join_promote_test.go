package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// suffrageIn returns id's suffrage as 'members --output json' lists it at
// addr, "" when id is no member.
func suffrageIn(t *testing.T, ctx context.Context, addr, id string) string {
	t.Helper()
	code, out, errb := runCLI(t, ctx, "", "members", "--addr", addr, "--output", "json")
	if code != 0 {
		t.Fatalf("members: exit %d %s", code, errb)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, `"id":"`+id+`"`) {
			for _, s := range []string{"nonvoter", "voter", "replica"} {
				if strings.Contains(line, `"suffrage":"`+s+`"`) {
					return s
				}
			}
		}
	}
	return ""
}

// waitSuffrage waits until id's suffrage at addr is want ("" for no
// member): addr may be a follower, which learns a configuration change
// the leader committed a moment later.
func waitSuffrage(t *testing.T, ctx context.Context, addr, id, want, after string) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, after+": "+id+" a "+strconv.Quote(want), func() bool {
		return suffrageIn(t, ctx, addr, id) == want
	})
}

// join refuses a node that does not answer at --grpc-addr (nothing
// changes) unless --force; promote refuses a node the leader cannot reach
// unless --force; a running node joins and is promoted.
func TestJoinAndPromoteRefuseANodeThatIsNotRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := testcluster.New(t, devcluster.Config{Nodes: 3})
	addr := cl.Addrs()[0]
	deadRaft, deadGRPC := closedAddr(t), closedAddr(t)
	join := []string{"join", "--addr", addr, "--node-id", "r3", "--raft-addr", deadRaft, "--grpc-addr", deadGRPC, "--timeout", "10s"}

	code, _, errb := runCLI(t, ctx, "", join...)
	if code != exitError || !strings.Contains(errb, "no dedupnode node answers at --grpc-addr "+deadGRPC) || !strings.Contains(errb, "--force") {
		t.Fatalf("join of a node that is not running: exit %d, stderr %q", code, errb)
	}
	waitSuffrage(t, ctx, addr, "r3", "", "refused join")

	if code, _, errb = runCLI(t, ctx, "", append(join, "--force")...); code != 0 {
		t.Fatalf("join --force: exit %d %s", code, errb)
	}
	waitSuffrage(t, ctx, addr, "r3", "nonvoter", "after join --force")
	code, _, errb = runCLI(t, ctx, "", "promote", "--addr", addr, "--timeout", "10s", "r3")
	if code != exitError || !strings.Contains(errb, `"r3"`) || !strings.Contains(errb, "cannot reach it at "+deadGRPC) || !strings.Contains(errb, "--force") {
		t.Fatalf("promote of a node that is not running: exit %d, stderr %q", code, errb)
	}
	waitSuffrage(t, ctx, addr, "r3", "nonvoter", "refused promote")
	// Three voters up of four: a quorum still.
	if code, _, errb = runCLI(t, ctx, "", "promote", "--addr", addr, "--timeout", "20s", "--force", "r3"); code != 0 {
		t.Fatalf("promote --force: exit %d %s", code, errb)
	}
	waitSuffrage(t, ctx, addr, "r3", "voter", "after promote --force")
	if code, _, errb = runCLI(t, ctx, "", "remove", "--addr", addr, "--timeout", "20s", "r3"); code != 0 {
		t.Fatalf("remove r3: exit %d %s", code, errb)
	}

	// A running node that waits to be added: join asks it, then it joins;
	// promote succeeds once it has caught up.
	i, err := cl.Add(ctx, devcluster.AddConfig{ID: "n4", NoJoin: true})
	if err != nil {
		t.Fatal(err)
	}
	n4 := cl.Nodes()[i]
	wrongID := []string{"join", "--addr", addr, "--node-id", "n5", "--raft-addr", n4.Raft, "--grpc-addr", n4.GRPC, "--timeout", "10s"}
	if code, _, errb = runCLI(t, ctx, "", wrongID...); code != exitError || !strings.Contains(errb, `is "n4", not "n5"`) {
		t.Fatalf("join naming the wrong ID: exit %d, stderr %q", code, errb)
	}
	if code, _, errb = runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "n4", "--raft-addr", n4.Raft, "--grpc-addr", n4.GRPC, "--timeout", "10s"); code != 0 {
		t.Fatalf("join of a running node: exit %d %s", code, errb)
	}
	testcluster.WaitFor(t, 60*time.Second, "n4 promoted", func() bool {
		if suffrageIn(t, ctx, addr, "n4") == "voter" {
			return true // the leader promoted it by itself
		}
		code, _, _ := runCLI(t, ctx, "", "promote", "--addr", addr, "--timeout", "5s", "n4")
		return code == 0
	})
	// Joining it again changes nothing, and says so.
	code, out, errb := runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "n4", "--raft-addr", n4.Raft, "--grpc-addr", n4.GRPC, "--timeout", "10s")
	if code != 0 || !strings.Contains(out, "n4 is a member already (voter); nothing changed") {
		t.Fatalf("join of a voter: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	waitSuffrage(t, ctx, addr, "n4", "voter", "after joining a voter again")
	// Joining it at another Raft address records that address and keeps its
	// vote (three voters of four still answer), and says where it moved;
	// joining it back restores it.
	moved := "127.0.0.1:1"
	code, out, errb = runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "n4", "--raft-addr", moved, "--grpc-addr", n4.GRPC, "--timeout", "10s", "--force")
	if want := "n4 is a member already (voter); its Raft address is now " + moved + " (was " + n4.Raft + ")"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("join of a voter at another address: exit %d, stdout %q, stderr %q; want %q", code, out, errb, want)
	}
	waitSuffrage(t, ctx, addr, "n4", "voter", "after moving its address")
	if code, out, errb = runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "n4", "--raft-addr", n4.Raft, "--grpc-addr", n4.GRPC, "--timeout", "10s"); code != 0 || !strings.Contains(out, "(was "+moved+")") {
		t.Fatalf("join back at its own address: exit %d, stdout %q, stderr %q", code, out, errb)
	}

	// A new member's ID must be one serve --peers can name (join --force
	// added "r,5"); a member that has one already (added before the
	// rule; here straight through Raft) can still move.
	code, out, errb = runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "r,5", "--raft-addr", deadRaft, "--grpc-addr", deadGRPC, "--timeout", "10s", "--force")
	if code != exitUsage || !strings.Contains(errb, `--node-id: "r,5" contains ",", which separates serve --peers`) {
		t.Fatalf("join --force of a new ID with ',': exit %d, stdout %q, stderr %q", code, out, errb)
	}
	waitSuffrage(t, ctx, addr, "r,5", "", "refused join")
	testcluster.WaitFor(t, 60*time.Second, "o,6 added through the leader's Raft", func() bool {
		li := cl.Leader()
		return li >= 0 && cl.Server(li).Node().Raft().AddNonvoter("o,6", raft.ServerAddress(deadRaft), 0, 10*time.Second).Error() == nil
	})
	waitSuffrage(t, ctx, addr, "o,6", "nonvoter", "added through raft")
	if code, out, errb = runCLI(t, ctx, "", "join", "--addr", addr, "--node-id", "o,6", "--raft-addr", moved, "--grpc-addr", deadGRPC, "--timeout", "10s", "--force"); code != 0 || !strings.Contains(out, "(was "+deadRaft+")") {
		t.Fatalf("join of a member whose ID has ',' at another address: exit %d, stdout %q, stderr %q", code, out, errb)
	}
}
