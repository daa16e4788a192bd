package cluster

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The liveness rule on explicit times (the transport feeds record with
// real outcomes; server's TestStatus_ReportsUnreachableMembers runs it on a
// real cluster). A frozen peer (SIGSTOP) never fails a call within the
// transport's 10 s timeout: it must turn unreachable by silence alone.
func TestPeerTracker_Liveness(t *testing.T) {
	const hb = time.Second
	t0 := time.Unix(1_000_000, 0)
	var p peerTracker
	if _, ok := p.liveness("n2", t0, hb, 10); ok {
		t.Fatal("a node that does not lead reports liveness")
	}
	p.lead(t0)
	get := func(at time.Duration, last uint64) PeerLiveness {
		t.Helper()
		lv, ok := p.liveness("n2", t0.Add(at), hb, last)
		if !ok {
			t.Fatal("leader reports no liveness")
		}
		return lv
	}
	p.sending("n2", t0) // its first heartbeat of the term
	if lv := get(hb/2, 10); lv.Reachability != Reachable {
		t.Fatalf("new peer within a heartbeat timeout of the term's start: %+v, want reachable", lv)
	}
	if lv := get(2*hb, 10); lv.Reachability != Unreachable || !lv.UnreachableSince.Equal(t0) {
		t.Fatalf("peer that never answered this term: %+v, want unreachable since the term's start", lv)
	}
	p.record("n2", &raft.AppendEntriesResponse{LastLog: 7}, nil, t0.Add(3*hb))
	if lv := get(3*hb+hb/2, 10); lv.Reachability != Reachable || lv.LogLag != 3 {
		t.Fatalf("after an answer: %+v, want reachable, 3 entries behind", lv)
	}
	// Frozen: no answer and no failure for more than a heartbeat timeout.
	if lv := get(5*hb, 10); lv.Reachability != Unreachable || !lv.UnreachableSince.Equal(t0.Add(3*hb)) || lv.LastError != "" {
		t.Fatalf("silent peer: %+v, want unreachable since its last answer, no error", lv)
	}
	p.record("n2", &raft.AppendEntriesResponse{LastLog: 10}, nil, t0.Add(6*hb))
	// Killed: a failed call makes it unreachable at once.
	p.record("n2", nil, errors.New("connection refused"), t0.Add(6*hb+time.Millisecond))
	if lv := get(6*hb+2*time.Millisecond, 10); lv.Reachability != Unreachable || lv.LastError != "connection refused" || !lv.UnreachableSince.Equal(t0.Add(6*hb)) {
		t.Fatalf("failing peer: %+v, want unreachable since its last answer with the error", lv)
	}
	// This node's own stalled disk is not the peer's fault.
	p.record("n2", &raft.AppendEntriesResponse{LastLog: 10}, nil, t0.Add(7*hb))
	p.record("n2", nil, errStalled, t0.Add(7*hb+time.Millisecond))
	if lv := get(7*hb+2*time.Millisecond, 10); lv.Reachability != Reachable || lv.LogLag != 0 {
		t.Fatalf("after a stalled-disk refusal: %+v, want reachable, caught up", lv)
	}
	// A member added during the term (join --force) that never answers is
	// unreachable since the leader first sent to it, not since the term
	// began; before that it is not judged.
	if lv, _ := p.liveness("n4", t0.Add(10*hb), hb, 10); lv.Reachability != Reachable {
		t.Fatalf("member not yet sent to: %+v, want reachable (not judged)", lv)
	}
	p.sending("n4", t0.Add(10*hb))
	if lv, _ := p.liveness("n4", t0.Add(12*hb), hb, 10); lv.Reachability != Unreachable || !lv.UnreachableSince.Equal(t0.Add(10*hb)) {
		t.Fatalf("member added during the term that never answered: %+v, want unreachable since it was first sent to (%v)", lv, t0.Add(10*hb))
	}
	p.stop()
	if _, ok := p.liveness("n2", t0.Add(8*hb), hb, 10); ok {
		t.Fatal("liveness reported after leadership ended")
	}
}

// On a real node: a member added during the leader's term that never
// answers (join --force of a node that is not there) is reported
// unreachable since it was added, not since the term began.
func TestStatus_MemberAddedDuringTermUnreachableSinceAdded(t *testing.T) {
	n := startNode(t, testConfig(t.TempDir(), true))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there: every AppendEntries fails
	added := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Join(ctx, "ghost", dead, "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	var got PeerLiveness
	waitFor(t, 30*time.Second, "ghost reported unreachable", func() bool {
		st, err := n.Status()
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID == "ghost" {
				got = m.PeerLiveness
				return got.Reachability == Unreachable
			}
		}
		return false
	})
	if got.UnreachableSince.Before(added) {
		t.Fatalf("ghost unreachable since %v, before it was added (%v)", got.UnreachableSince, added)
	}
}
