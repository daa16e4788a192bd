package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
				// A leader that loses its lease on a loaded machine answers
				// Unavailable; the retry carries the same token, and the
				// assertion below starts only once the Mark is acknowledged.
				req := &dedupv1.MarkRequest{Items: markItems([][]byte{id}), RequestToken: fmt.Appendf(nil, "tok-%d-%d", g, i)}
				if _, err := markRetrying(ctx, w.dedup, req); err != nil {
					errs <- err
					return
				}
				c, err := checkRetrying(ctx, reader.dedup, &dedupv1.CheckRequest{Ids: [][]byte{id, fmt.Appendf(nil, "absent-%d-%d", g, i)}})
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

// checkRetrying checks, retrying while the answer is Unavailable (a read
// index the leader could not confirm: no answer, never a wrong one), until
// ctx ends.
func checkRetrying(ctx context.Context, c dedupv1.DedupClient, req *dedupv1.CheckRequest) (*dedupv1.CheckResponse, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.Check(actx, req)
		cancel()
		if err == nil {
			return resp, nil
		}
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
