package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// BenchmarkMark3Nodes marks unique IDs through an in-process 3-node
// cluster from 50 concurrent callers, 16 IDs per call, spread over all
// nodes (followers forward). b.N counts IDs; see the ids/s metric.
//
//	go test ./server -run '^$' -bench Mark3Nodes -benchtime 200000x
func BenchmarkMark3Nodes(b *testing.B) {
	tc := startCluster(b, clusterOpts{n: 3})
	const callers, perCall = 50, 16
	var next atomic.Int64
	calls := (b.N + perCall - 1) / perCall
	leader := tc.leader().srv.Node().Raft()
	first := leader.LastIndex()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := tc.nodes[c%len(tc.nodes)]
			for {
				i := next.Add(1) - 1
				if i >= int64(calls) {
					return
				}
				req := &dedupv1.MarkRequest{RequestToken: fmt.Appendf(nil, "c%d", i)}
				for j := range perCall {
					req.Items = append(req.Items, &dedupv1.MarkItem{Id: fmt.Appendf(nil, "bench-%d-%d", i, j)})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := nd.dedup.Mark(ctx, req)
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	entries := leader.LastIndex() - first
	b.ReportMetric(float64(calls*perCall)/elapsed.Seconds(), "ids/s")
	b.ReportMetric(float64(calls*perCall)/float64(max(entries, 1)), "ids/entry")
	b.ReportMetric(float64(entries)/elapsed.Seconds(), "entries/s")
}
