package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
)

var testRegions = map[string]string{"n1": "us", "n2": "eu", "n3": "ap"}

// regionTune puts n1, n2, n3 in us, eu, ap and seeds preferred, with a
// short hold so that the test runs in seconds.
func regionTune(preferred string, hold time.Duration) func(*cluster.Config) {
	return func(c *cluster.Config) {
		c.Region = testRegions[c.NodeID]
		if preferred != "" {
			c.SeedSettings = map[string]string{cluster.SettingPreferredLeaderRegions: preferred}
		}
		c.PreferHold = hold
		c.PreferMinInterval = 2 * hold
	}
}

// Every node learns every node's region (the leader records its own at
// term start and probes the others), and Status shows them and the
// cluster setting.
func TestRegions_EveryNodeKnowsEveryRegion(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, tune: regionTune("eu,us", time.Hour)})
	for _, nd := range tc.nodes {
		waitFor(t, 30*time.Second, nd.id+" knows every region", func() bool {
			st, err := nd.admin.Status(rpcCtx(t), &dedupv1.StatusRequest{})
			if err != nil || st.Region != testRegions[nd.id] || !slices.Equal(st.PreferredLeaderRegions, []string{"eu", "us"}) {
				return false
			}
			for _, m := range st.Members {
				if m.Region != testRegions[m.Id] {
					return false
				}
			}
			return len(st.Members) == 3
		})
	}
}

// After leadership is forced out of the preferred region, it comes back
// once the hold has passed, and then stays (no flapping); a changed
// setting moves it again; bad settings are refused.
func TestPreferredLeader_MovesBackAfterForcedTransferAndDoesNotFlap(t *testing.T) {
	const hold = time.Second
	tc := startCluster(t, clusterOpts{n: 3, tune: regionTune("us", hold)})
	byID := map[string]*testNode{}
	for _, nd := range tc.nodes {
		byID[nd.id] = nd
	}
	leaderIs := func(id string) func() bool {
		return func() bool { return byID[id].srv.Node().IsLeader() }
	}
	waitFor(t, 60*time.Second, "leadership in the preferred region us (n1)", leaderIs("n1"))
	tc.waitStable()

	// Forced out to ap, then back in us once n3 has held leadership
	// outside the preferred region for the hold. The test waits for that
	// outcome with a generous deadline; it does not time it (no timing
	// asserts: a measured duration depends on the machine's load).
	if _, err := byID["n1"].admin.TransferLeadership(rpcCtx(t), &dedupv1.TransferLeadershipRequest{NodeId: "n3"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "n3 leads after the forced transfer", func() bool {
		return byID["n3"].srv.Node().IsLeader() || byID["n1"].srv.Node().IsLeader()
	})
	waitFor(t, 60*time.Second, "leadership back in the preferred region us (n1) after the forced transfer", leaderIs("n1"))

	// It stays: one term for 4 holds.
	term := byID["n1"].srv.Node().Raft().CurrentTerm()
	deadline := time.Now().Add(4 * hold)
	for time.Now().Before(deadline) {
		if !byID["n1"].srv.Node().IsLeader() || byID["n1"].srv.Node().Raft().CurrentTerm() != term {
			t.Fatal("leadership left the preferred region again (flapping)")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The setting changes through Ops (from a follower: forwarded), and
	// leadership follows it to eu.
	ops := dedupv1.NewOpsClient(byID["n3"].cc)
	if _, err := ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: cluster.SettingPreferredLeaderRegions, Value: "eu"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "leadership in eu (n2) after the setting changed", leaderIs("n2"))

	_, err := ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: "colour", Value: "blue"})
	wantStatus(t, err, codes.InvalidArgument, "unknown cluster setting")
	_, err = ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: cluster.SettingPreferredLeaderRegions, Value: "eu,a b"})
	wantStatus(t, err, codes.InvalidArgument, `"a b"`)

	// Unset: nobody moves leadership any more.
	if _, err := ops.SetClusterSetting(rpcCtx(t), &dedupv1.SetClusterSettingRequest{Name: cluster.SettingPreferredLeaderRegions, Unset: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the setting unset everywhere", func() bool {
		for _, nd := range tc.nodes {
			if len(nd.srv.Node().PreferredLeaderRegions()) != 0 {
				return false
			}
		}
		return true
	})
	if _, err := byID["n2"].admin.TransferLeadership(rpcCtx(t), &dedupv1.TransferLeadershipRequest{NodeId: "n3"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "n3 leads", leaderIs("n3"))
	term = byID["n3"].srv.Node().Raft().CurrentTerm()
	time.Sleep(3 * hold)
	if !byID["n3"].srv.Node().IsLeader() || byID["n3"].srv.Node().Raft().CurrentTerm() != term {
		t.Fatal("leadership moved without a preferred region")
	}
}

// A preferred region without a voter (here: no node runs there) leaves
// leadership where it is.
func TestPreferredLeader_NoVoterThereNoTransfer(t *testing.T) {
	const hold = 500 * time.Millisecond
	tc := startCluster(t, clusterOpts{n: 3, tune: regionTune("mars", hold)})
	l := tc.waitStable()
	term := l.srv.Node().Raft().CurrentTerm()
	ctx, cancel := context.WithTimeout(context.Background(), 4*hold)
	defer cancel()
	<-ctx.Done()
	if !l.srv.Node().IsLeader() || l.srv.Node().Raft().CurrentTerm() != term {
		t.Fatal("leadership moved though no voter runs in the preferred region")
	}
}
