package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// A refused connection to an address the user did not give (a member the
// nodes at --addr pointed to) is not "no node at --addr". The client's
// typed error (from its own dial) says which address refused.
func TestExplainRefusedLeaderIsNotRefusedAddr(t *testing.T) {
	dead := closedAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, []string{dead}, client.WithRetry(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Check(ctx, "default", [][]byte{[]byte("x")}, client.Linearizable)
	if !errors.Is(err, client.ErrRefused) {
		t.Fatalf("check at a closed port: %v, want ErrRefused", err)
	}
	f := &clientFlags{addrs: []string{"127.0.0.1:7071"}}
	if msg := explain(err, f, "").Error(); !strings.Contains(msg, "the member at "+dead+", learned from the cluster, accepts no connections") || !strings.Contains(msg, "127.0.0.1:7071 is up") {
		t.Errorf("member refused: %q", msg)
	}
	f = &clientFlags{addrs: []string{dead}}
	if msg := explain(err, f, "").Error(); !strings.HasPrefix(msg, "no node at "+dead+" accepts connections") {
		t.Errorf("--addr refused: %q", msg)
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
	// were read. A --ttl over the namespace's max TTL is refused before
	// anything is sent.
	code, _, errs = runCLI(t, ctx, "a\nb\nc\n", "import", "--addr", addrs, "--ttl", "8d", "-")
	if code != exitUsage || !strings.Contains(errs, "--ttl gives a TTL of 8d, over the max TTL of namespace default (7d); nothing imported") {
		t.Errorf("import over the max TTL: exit %d, stderr %q", code, errs)
	}
	code, _, errs = runCLI(t, ctx, "d\ne\n{\"id\":\"f\",\"ttl\":\"8d\"}\n", "import", "--addr", addrs, "--batch", "2", "-")
	if code != exitError || !strings.Contains(errs, "lines 1-2 are imported (2 IDs,") {
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
