package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// status and members show each member's liveness as the leader sees it,
// asked through any node (a follower asks the leader): LIVENESS last in the
// table, reachability in JSON.
func TestStatusShowsMemberLiveness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	addrs := strings.Split(startDev(t), ",")
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for _, addr := range addrs {
		for {
			code, out, errs := runCLI(t, ctx, "", "status", "--addr", addr, "-o", "json")
			var st struct {
				Members []struct {
					ID           string `json:"id"`
					Reachability string `json:"reachability"`
				} `json:"members"`
			}
			ok := code == exitOK && json.Unmarshal([]byte(out), &st) == nil && len(st.Members) == 3
			for _, m := range st.Members {
				ok = ok && m.Reachability == "reachable"
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("status --addr %s -o json: exit %d, %s %s; want 3 members reachable", addr, code, out, errs)
			}
			<-time.After(100 * time.Millisecond) // poll interval, not a proof
		}
		for _, cmd := range []string{"status", "members"} {
			code, out, errs := runCLI(t, ctx, "", cmd, "--addr", addr)
			if code != exitOK {
				t.Fatalf("%s: exit %d: %s", cmd, code, errs)
			}
			i := strings.Index(out, "ID ")
			if i < 0 {
				t.Fatalf("%s: no members table in %q", cmd, out)
			}
			lines := strings.Split(strings.TrimSpace(out[i:]), "\n")
			if !strings.HasSuffix(strings.TrimSpace(lines[0]), "LEADER  LIVENESS") || len(lines) != 4 {
				t.Fatalf("%s: members table %q, want a LIVENESS column last and 3 members", cmd, out[i:])
			}
			for _, l := range lines[1:] {
				if !reachableCell.MatchString(l) {
					t.Errorf("%s --addr %s: member line %q does not end with reachable", cmd, addr, l)
				}
			}
		}
	}
}

// reachableCell matches a member line whose LIVENESS says reachable (a
// follower may trail by a few entries just after the cluster starts).
var reachableCell = regexp.MustCompile(`  reachable( \(\d+ entries behind\))?$`)

func TestLivenessCell(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC)
	for _, c := range []struct {
		m    client.Member
		want string
	}{
		{client.Member{Reachability: client.Reachable}, "reachable"},
		{client.Member{Reachability: client.Reachable, LogLag: 12}, "reachable (12 entries behind)"},
		{client.Member{Reachability: client.Unreachable, UnreachableSince: now.Add(-30 * time.Second), LastError: "dial tcp 127.0.0.1:7001: connect: connection refused"},
			"UNREACHABLE since 2026-12-01T10:00:00.000Z (30s): dial tcp 127.0.0.1:7001: connect: connection refused"},
		{client.Member{Reachability: client.Unreachable, UnreachableSince: now.Add(-5 * time.Second)}, "UNREACHABLE since 2026-12-01T10:00:25.000Z (5s)"},
		{client.Member{Reachability: client.ReachabilityUnknown}, "unknown (no leader answered)"},
		{client.Member{}, "unknown (no leader answered)"},
	} {
		if got := liveness(c.m, now); got != c.want {
			t.Errorf("liveness(%+v) = %q, want %q", c.m, got, c.want)
		}
	}
}
