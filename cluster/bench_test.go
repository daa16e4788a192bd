package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/fsm"
)

// BenchmarkPropose1Node measures the group commit on a single node (no
// network): 50 concurrent callers, 16 IDs per call. b.N counts IDs.
//
//	go test ./cluster -run '^$' -bench Propose1Node -benchtime 200000x
func BenchmarkPropose1Node(b *testing.B) {
	n, err := New(testConfig(b.TempDir(), true))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for !n.IsLeader() {
		time.Sleep(10 * time.Millisecond)
	}
	if err := n.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	const callers, perCall = 50, 16
	calls := (b.N + perCall - 1) / perCall
	var next atomic.Int64
	first := n.Raft().LastIndex()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(calls) {
					return
				}
				op := fsm.Op{Kind: fsm.OpMark}
				for j := range perCall {
					op.Items = append(op.Items, fsm.Item{ID: fmt.Appendf(nil, "b-%d-%d", i, j)})
				}
				if _, err := n.Propose(ctx, []fsm.Op{op}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	entries := n.Raft().LastIndex() - first
	b.ReportMetric(float64(calls*perCall)/elapsed.Seconds(), "ids/s")
	b.ReportMetric(float64(calls*perCall)/float64(max(entries, 1)), "ids/entry")
	b.ReportMetric(float64(entries)/elapsed.Seconds(), "entries/s")
}
