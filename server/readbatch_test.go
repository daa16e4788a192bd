package server

import (
	"fmt"
	"sync"
	"testing"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Concurrent linearizable Checks on a follower share read-index RPCs to
// the leader; each must still see every Mark acknowledged before it
// started (invariant 3), whichever node took the Mark.
func TestFollowerSharedReadIndexSeesAcknowledgedMarks(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	fs := tc.followers()
	reader, writers := fs[0], []*testNode{tc.leader(), fs[1]}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := writers[g%len(writers)]
			for i := range 15 {
				id := fmt.Appendf(nil, "lin-%d-%d", g, i)
				if _, err := w.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{id})}); err != nil {
					errs <- err
					return
				}
				c, err := reader.dedup.Check(ctx, &dedupv1.CheckRequest{Ids: [][]byte{id, fmt.Appendf(nil, "absent-%d-%d", g, i)}})
				if err != nil {
					errs <- err
					return
				}
				if c.Results[0].Code != dedupv1.CheckResult_SEEN || c.Results[1].Code != dedupv1.CheckResult_NOT_SEEN {
					errs <- fmt.Errorf("check after acknowledged mark of %s: %v", id, c.Results)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
