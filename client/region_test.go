package client_test

import (
	"context"
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
	testcluster.WaitFor(t, 30*time.Second, "every region recorded, n1 (us) leading", func() bool {
		st, err := srvs[leader].Status(context.Background(), &dedupv1.StatusRequest{})
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.Region == "" {
				return false
			}
		}
		return srvs[0].Node().IsLeader()
	})
	var log rpcLog
	c := newClient(t, addrs[:1], client.WithRegion("eu"), client.WithDialOptions(log.interceptor()))
	ctx := testCtx(t, 60*time.Second)
	id := ids("region", 4)
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
			t.Fatalf("a check went to %s, want eu's node %s", call.target, addrs[1])
		}
	}
	for _, call := range log.of(dedupv1.Dedup_Mark_FullMethodName) {
		if call.target != addrs[0] {
			t.Fatalf("a mark went to %s, want the leader %s", call.target, addrs[0])
		}
	}
	if n := len(log.of(dedupv1.Dedup_Check_FullMethodName)); n != 2 {
		t.Fatalf("%d check RPCs, want 2", n)
	}

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

	// A region no node runs in: linearizable checks go to the leader.
	var log2 rpcLog
	c2 := newClient(t, addrs[2:], client.WithRegion("mars"), client.WithDialOptions(log2.interceptor()))
	if _, err := c2.Check(ctx, "default", id[:1], client.Linearizable); err != nil {
		t.Fatal(err)
	}
	if calls := log2.of(dedupv1.Dedup_Check_FullMethodName); len(calls) != 1 || calls[0].target != addrs[0] {
		t.Fatalf("checks %+v, want one to the leader %s", calls, addrs[0])
	}
}
