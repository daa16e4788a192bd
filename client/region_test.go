package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/server"
)

// With WithRegion, checks of both consistencies go to the node of the
// caller's region and writes to the leader; when the region's node is
// gone, checks still succeed elsewhere; a region without nodes reads as
// without the option.
func TestWithRegion_ChecksStayInRegionWritesGoToLeader(t *testing.T) {
	regions := []string{"us", "eu", "ap"}
	srvs, leader := testcluster.Start(t, 3, func(i int, cfg *server.Config) {
		cfg.Cluster.Region = regions[i]
		cfg.Cluster.SeedSettings = map[string]string{"preferred-leader-regions": "us"}
		cfg.Cluster.PreferHold = time.Second
	})
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.GRPCAddr())
	}
	testcluster.WaitFor(t, 30*time.Second, "every region recorded", func() bool {
		st, err := srvs[leader].Status(context.Background(), &dedupv1.StatusRequest{})
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.Region == "" {
				return false
			}
		}
		return true
	})
	ctx := testCtx(t, 120*time.Second)
	id := ids("region", 4)
	var c *client.Client
	whileN1Leads(t, srvs, srvs[1:], addrs, "marks to the leader, checks to eu's node", func() error {
		var log rpcLog
		c = newClient(t, addrs[:1], client.WithRegion("eu"), client.WithDialOptions(log.interceptor()))
		if _, err := c.Mark(ctx, "default", []client.Item{{ID: id[0]}}, time.Hour); err != nil {
			t.Fatal(err)
		}
		for _, cons := range []client.Consistency{client.Linearizable, client.Stale} {
			res, err := c.Check(ctx, "default", id[:1], cons)
			if err != nil {
				t.Fatal(err)
			}
			if cons == client.Linearizable && res[0].Code != client.CodeSeen {
				t.Fatalf("linearizable check after an acknowledged mark: %v", res[0].Code)
			}
		}
		for _, call := range log.of(dedupv1.Dedup_Check_FullMethodName) {
			if call.target != addrs[1] {
				return fmt.Errorf("a check went to %s, want eu's node %s", call.target, addrs[1])
			}
		}
		for _, call := range log.of(dedupv1.Dedup_Mark_FullMethodName) {
			if call.target != addrs[0] {
				return fmt.Errorf("a mark went to %s, want the leader %s", call.target, addrs[0])
			}
		}
		if n := len(log.of(dedupv1.Dedup_Check_FullMethodName)); n != 2 {
			return fmt.Errorf("%d check RPCs, want 2", n)
		}
		return nil
	})

	// eu's node goes away: checks are answered elsewhere.
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srvs[1].Close(cctx); err != nil {
		t.Fatal(err)
	}
	for _, cons := range []client.Consistency{client.Linearizable, client.Stale} {
		if _, err := c.Check(ctx, "default", id[1:2], cons); err != nil {
			t.Fatalf("%v check with eu's node gone: %v", cons, err)
		}
	}

	// A region no node runs in: linearizable checks go to the leader, not
	// to the client's seed (n3, ap).
	whileN1Leads(t, srvs, srvs[2:], addrs, "a check for a region without nodes to the leader", func() error {
		var log2 rpcLog
		c2 := newClient(t, addrs[2:], client.WithRegion("mars"), client.WithDialOptions(log2.interceptor()))
		if _, err := c2.Check(ctx, "default", id[:1], client.Linearizable); err != nil {
			t.Fatal(err)
		}
		if calls := log2.of(dedupv1.Dedup_Check_FullMethodName); len(calls) != 1 || calls[0].target != addrs[0] {
			return fmt.Errorf("checks %+v, want one to the leader %s", calls, addrs[0])
		}
		return nil
	})
}

// whileN1Leads runs try, which checks where a client sent its calls, once
// n1 (srvs[0], addrs[0]) leads and the followers in live know it, and
// fails the test with try's error if n1 led throughout (same Raft term
// before and after). Where the calls went says nothing about the client when the
// leadership moved meanwhile (an election on loaded cores, then the move
// back to the preferred region): then try runs again, at most 5 times.
func whileN1Leads(t *testing.T, srvs, live []*server.Server, addrs []string, what string, try func() error) {
	t.Helper()
	for round := 1; ; round++ {
		var term uint64
		testcluster.WaitFor(t, 30*time.Second, "n1 (us) leading, known to the live followers", func() bool {
			term = leadingTerm(srvs[0])
			for _, s := range live {
				st, err := s.Status(context.Background(), &dedupv1.StatusRequest{})
				if err != nil || st.GetLeaderGrpcAddr() != addrs[0] {
					return false
				}
			}
			return term != 0
		})
		err := try()
		if err == nil {
			return
		}
		now := leadingTerm(srvs[0])
		if now == term {
			t.Fatalf("%s: %v (n1 led throughout, term %d)", what, err, term)
		}
		if round == 5 {
			t.Fatalf("%s: the leadership moved during each of %d rounds; last: %v", what, round, err)
		}
		t.Logf("%s: the leadership moved (n1 led in term %d, now in %d; 0 = not leading): %v; again", what, term, now, err)
	}
}

// leadingTerm returns the Raft term in which s leads, 0 if it does not.
func leadingTerm(s *server.Server) uint64 {
	st, err := s.Status(context.Background(), &dedupv1.StatusRequest{})
	if err != nil || st.GetNodeId() != st.GetLeaderId() || !s.Node().IsLeader() {
		return 0
	}
	return st.GetTerm()
}
