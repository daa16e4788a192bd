package main

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A refused connection to an address the user did not give (the leader
// the nodes at --addr pointed to) is not "no node at --addr".
func TestExplainRefusedLeaderIsNotRefusedAddr(t *testing.T) {
	f := &clientFlags{addrs: []string{"127.0.0.1:7071"}}
	leaderDown := status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7070: connect: connection refused"`)
	msg := explain(leaderDown, f, "").Error()
	if !strings.Contains(msg, "leader as last known, at 127.0.0.1:7070") || !strings.Contains(msg, "127.0.0.1:7071 is up") {
		t.Errorf("leader refused: %q", msg)
	}
	for _, addrs := range [][]string{{"127.0.0.1:7070"}, {"localhost:7070"}} {
		f := &clientFlags{addrs: addrs}
		if msg := explain(leaderDown, f, "").Error(); !strings.HasPrefix(msg, "no node at "+addrs[0]+" accepts connections") {
			t.Errorf("--addr %v refused: %q", addrs, msg)
		}
	}
}

func TestNewcomerCommandsAgainstDevCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	addrs := startDev(t)
	ctx := context.Background()

	// transfer-leader to the node that leads already: says so, exit 0.
	code, out, errs := runCLI(t, ctx, "", "status", "--addr", addrs, "-o", "json")
	var st struct {
		LeaderID string `json:"leader_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.LeaderID == "" {
		t.Fatalf("status: %d %q %s", code, out, errs)
	}
	code, out, errs = runCLI(t, ctx, "", "transfer-leader", "--addr", addrs, st.LeaderID)
	if code != 0 || out != st.LeaderID+" already leads\n" {
		t.Errorf("transfer-leader to the leader: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// import that fails says how many IDs the cluster took, not how many
	// were read.
	code, _, errs = runCLI(t, ctx, "a\nb\nc\n", "import", "--addr", addrs, "--ttl", "8d", "-")
	if code != exitError || !strings.Contains(errs, "exceeds the max TTL of namespace default (7d); nothing of that request applied (no ID imported)") {
		t.Errorf("import over the max TTL: exit %d, stderr %q", code, errs)
	}
	code, _, errs = runCLI(t, ctx, "d\ne\n{\"id\":\"f\",\"ttl\":\"8d\"}\n", "import", "--addr", addrs, "--batch", "2", "-")
	if code != exitError || !strings.Contains(errs, "(2 IDs imported before it;") {
		t.Errorf("import with a bad line after a batch: exit %d, stderr %q", code, errs)
	}
}

// dev on a port in use: one line naming the port, with the --base-port
// hint.
func TestDevStartErrorsSayWhatToDo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	code, _, errs := runCLI(t, context.Background(), "", "dev", "--nodes", "1", "--base-port", strconv.Itoa(port))
	if code != exitError || !strings.Contains(errs, "address already in use") || !strings.Contains(errs, "--base-port 0") {
		t.Errorf("dev on a taken port: exit %d, stderr %q", code, errs)
	}
	assertOneLine(t, errs)
}
