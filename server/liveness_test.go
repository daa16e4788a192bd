package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// memberView is what nd's Status says of member id: its reachability and,
// when unreachable, since when and the last error ("" if nd did not
// answer or does not list id).
func memberView(t *testing.T, nd *testNode, id string) (dedupv1.Reachability, *dedupv1.Member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := nd.admin.Status(ctx, &dedupv1.StatusRequest{})
	if err != nil {
		return dedupv1.Reachability_REACHABILITY_UNKNOWN, nil
	}
	for _, m := range st.Members {
		if m.Id == id {
			return m.Reachability, m
		}
	}
	return dedupv1.Reachability_REACHABILITY_UNKNOWN, nil
}

// A member that is stopped or cut off is reported UNREACHABLE by status,
// whichever node answers (a follower asks the leader), with since when;
// once back, REACHABLE again. Before, status listed it like the others.
func TestStatus_ReportsUnreachableMembers(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, proxied: true})
	l := tc.leader()
	fs := tc.followers()
	victim, other := fs[0], fs[1]

	// everyone answers: every node's status says every member is reachable
	// (a follower's view comes from the leader).
	waitFor(t, 30*time.Second, "every member reachable in every node's status", func() bool {
		for _, nd := range []*testNode{l, other, victim} {
			for _, m := range []*testNode{l, other, victim} {
				if r, _ := memberView(t, nd, m.id); r != dedupv1.Reachability_REACHABILITY_REACHABLE {
					return false
				}
			}
		}
		return true
	})

	wantUnreachable := func(what string, wantErr bool) {
		t.Helper()
		before := time.Now().Add(-time.Minute)
		waitFor(t, 30*time.Second, fmt.Sprintf("%s reported unreachable by the leader and by %s (%s)", victim.id, other.id, what), func() bool {
			for _, nd := range []*testNode{tc.leader(), other} {
				r, m := memberView(t, nd, victim.id)
				if r != dedupv1.Reachability_REACHABILITY_UNREACHABLE || m.UnreachableSinceUnixMs < before.UnixMilli() ||
					m.UnreachableSinceUnixMs > time.Now().UnixMilli() || (wantErr && m.LastError == "") {
					return false
				}
			}
			return true
		})
		// The others stay reachable meanwhile.
		waitFor(t, 30*time.Second, "the live members reachable", func() bool {
			r1, _ := memberView(t, other, tc.leader().id)
			r2, _ := memberView(t, tc.leader(), other.id)
			return r1 == dedupv1.Reachability_REACHABILITY_REACHABLE && r2 == dedupv1.Reachability_REACHABILITY_REACHABLE
		})
	}
	wantReachable := func(what string) {
		t.Helper()
		waitFor(t, 60*time.Second, fmt.Sprintf("%s reachable again in every node's status (%s)", victim.id, what), func() bool {
			for _, nd := range []*testNode{tc.leader(), other, victim} {
				r, m := memberView(t, nd, victim.id)
				if r != dedupv1.Reachability_REACHABILITY_REACHABLE || m.UnreachableSinceUnixMs != 0 || m.LastError != "" {
					return false
				}
			}
			return true
		})
	}

	// Raft traffic to it cut (the leader's calls fail).
	tc.cut(victim)
	wantUnreachable("cut", true)
	tc.heal(victim)
	wantReachable("healed")

	// Stopped, then started again on its data.
	tc.close(victim)
	wantUnreachable("stopped", true)
	tc.start(victim)
	wantReachable("restarted")
}
