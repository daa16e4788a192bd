package server_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// TestInvariant1_7_LeaderCrashDuringWrites crashes the leader (Raft shut
// down without a leadership transfer) while writers keep marking unique IDs
// through the followers, retrying Unavailable/DeadlineExceeded with the
// same request token. Every acknowledged answer must be NEW (a retry never
// turns the winner's NEW into DUPLICATE), and every ID must be SEEN after.
func TestInvariant1_7_LeaderCrashDuringWrites(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	leader := tc.leader()
	writersVia := tc.followers()

	const writers = 6
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written [][]byte
		batches atomic.Int64
		stop    = make(chan struct{})
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := 0; ; b++ {
				select {
				case <-stop:
					return
				default:
				}
				batch := ids(fmt.Sprintf("w%d-b%d", w, b), 20)
				nd := writersVia[rand.IntN(len(writersVia))]
				resp, err := markRetrying(ctx, nd.dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: fmt.Appendf(nil, "w%d-b%d", w, b)})
				if err != nil {
					t.Errorf("writer %d batch %d: %v", w, b, err)
					return
				}
				for i, r := range resp.Results {
					if r.Code != dedupv1.MarkResult_NEW {
						t.Errorf("writer %d batch %d item %d: %v, want NEW", w, b, i, r.Code)
					}
				}
				mu.Lock()
				written = append(written, batch...)
				mu.Unlock()
				batches.Add(1)
			}
		}()
	}
	waitFor(t, 30*time.Second, "writes before the crash", func() bool { return batches.Load() >= 20 })
	if err := leader.srv.Node().Raft().Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	atCrash := batches.Load()
	waitFor(t, 60*time.Second, "writes after the crash", func() bool { return batches.Load() >= atCrash+40 })
	close(stop)
	wg.Wait()
	tc.close(leader)
	if t.Failed() {
		return
	}

	for _, nd := range tc.live() {
		for i := 0; i < len(written); i += 1000 {
			part := written[i:min(i+1000, len(written))]
			c, err := checkRetrying(ctx, nd.dedup, &dedupv1.CheckRequest{Ids: part})
			if err != nil {
				t.Fatal(err)
			}
			wantCheckCodes(t, c, len(part), dedupv1.CheckResult_SEEN)
		}
	}
}

// TestInvariant2_NoLostMarks_RestartAll stops every node (one of them
// right after a snapshot) and restarts them on the same addresses and
// directories: every acknowledged mark is still there.
func TestInvariant2_NoLostMarks_RestartAll(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	batch := ids("keep", 500)
	resp, err := markRetrying(ctx, tc.nodes[1].dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, len(batch), dedupv1.MarkResult_NEW)
	if err := tc.nodes[0].srv.Node().Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	applied := map[string]uint64{}
	for _, nd := range tc.nodes {
		applied[nd.id] = nd.srv.Node().FSM().AppliedIndex()
	}
	tc.closeAll()
	for _, nd := range tc.nodes {
		tc.start(nd)
		if got := nd.srv.Node().FSM().AppliedIndex(); got < applied[nd.id] {
			t.Fatalf("%s restarted at applied index %d, below %d", nd.id, got, applied[nd.id])
		}
	}
	// waitStable saw a ready leader, but on loaded cores another election
	// can follow the restart: linearizable reads and writes then fail with
	// Unavailable, and are retried as documented.
	tc.waitStable()
	for _, nd := range tc.nodes {
		c, err := checkRetrying(ctx, nd.dedup, &dedupv1.CheckRequest{Ids: batch})
		if err != nil {
			t.Fatal(err)
		}
		wantCheckCodes(t, c, len(batch), dedupv1.CheckResult_SEEN)
	}
	again, err := markRetrying(ctx, tc.nodes[2].dedup, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("other")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, again, len(batch), dedupv1.MarkResult_DUPLICATE)
	retry, err := tc.nodes[0].dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(batch), RequestToken: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, retry, len(batch), dedupv1.MarkResult_NEW)
}
