package server_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// TestFencingTokensAfterRestoreExceedSource: issue 12 input 5. A source
// cluster is backed up and then grants more fencing tokens; a cluster
// seeded from the backup continues the Raft log from the backup's index
// (lower than the source's by then), yet every token it grants exceeds
// every token the source granted after the backup. A node that joins the
// restored cluster holds the same epoch (it comes in the Raft snapshot).
func TestFencingTokensAfterRestoreExceedSource(t *testing.T) {
	ctx := callCtx(t)
	srcs, leader := testcluster.Start(t, 1, nil)
	src := testcluster.Client(t, []string{srcs[leader].GRPCAddr()})
	claim := func(c *client.Client, id string) uint64 {
		t.Helper()
		res, err := c.Claim(ctx, "", []client.Item{{ID: []byte(id), RequestToken: []byte("holder-of-" + id)}}, time.Minute)
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		if res[0].Code != client.CodeAcquired || res[0].Record == nil {
			t.Fatalf("claim %s: %v", id, res[0].Code)
		}
		return res[0].Record.FencingToken
	}
	before := claim(src, "before-backup")
	data, index := backup(t, ctx, dialPlain(t, srcs[leader].GRPCAddr()))

	// The source goes on granting tokens after the backup.
	var srcMax uint64
	for i := range 30 {
		srcMax = max(srcMax, claim(src, fmt.Sprintf("after-backup-%d", i)))
	}
	if srcMax <= before || srcMax < index+30 {
		t.Fatalf("source tokens: %d before the backup (index %d), %d after", before, index, srcMax)
	}

	tb := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"r1"}, backup: data})
	seeded := tb.c.Seeded()
	if seeded.FenceEpoch != fsm.FenceEpochOf(before)+1 {
		t.Fatalf("seeded fence epoch %d, want one past the backup's %d", seeded.FenceEpoch, fsm.FenceEpochOf(before))
	}
	if seeded.Records.Leased != 1 || seeded.Records.Committed != 0 {
		t.Fatalf("seeded record counts %+v, want the one lease", seeded.Records)
	}
	b := tb.nodes[0].srv
	waitHealthy(t, b)
	dst := testcluster.Client(t, []string{b.GRPCAddr()})
	got := claim(dst, "after-restore")
	if got <= srcMax {
		t.Fatalf("token after restore %d (%#x) does not exceed the source's %d", got, got, srcMax)
	}
	// Without the epoch the token would have gone backwards: the restored
	// log continues from the backup's index.
	if idx := got & (1<<fsm.FenceIndexBits - 1); idx >= srcMax {
		t.Fatalf("restored Raft index %d not below the source's last token %d: the test proves nothing", idx, srcMax)
	}
	// The lease taken before the backup is still held in the restored
	// cluster (as leased, with its old token): in progress for another
	// claim, its own claim's retry gets it back.
	res, err := dst.Claim(ctx, "", []client.Item{{ID: []byte("before-backup")}}, time.Minute)
	if err != nil || res[0].Code != client.CodeInProgress {
		t.Fatalf("claim of the lease restored from the backup: %v %+v", err, res)
	}
	if got := claim(dst, "before-backup"); got != before {
		t.Fatalf("the holder's claim retried after the restore: fencing token %d, want its old %d", got, before)
	}

	// A node joining the restored cluster gets the epoch with the state.
	c := tb.add(devcluster.AddConfig{ID: "r2", Join: []string{b.GRPCAddr()}}).srv
	waitHealthy(t, c)
	testcluster.WaitFor(t, 60*time.Second, "the joined node to apply the leader's index", func() bool {
		return c.Node().FSM().AppliedIndex() >= b.Node().FSM().AppliedIndex()
	})
	if e := c.Node().FSM().FenceEpoch(); e != seeded.FenceEpoch {
		t.Fatalf("joined node's fence epoch %d, want %d", e, seeded.FenceEpoch)
	}
	dB, err := b.Node().FSM().Digest()
	if err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 60*time.Second, "equal digests on the restored and the joined node", func() bool {
		dC, err := c.Node().FSM().Digest()
		dB, _ = b.Node().FSM().Digest()
		return err == nil && bytes.Equal(dB, dC) && b.Node().FSM().AppliedIndex() == c.Node().FSM().AppliedIndex()
	})
}
