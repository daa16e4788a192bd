package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/dedupnode/dedupnode/client"
)

// coalescing is the --coalesce mode: every ID of a caller's call goes
// through one shared client.Batcher as its own single-ID call, the way a
// consumer with one goroutine per message uses the Go client. The Batcher
// merges whatever is waiting into one RPC per group (up to
// client.DefaultBatchInflight in flight), so the server sees a few large
// calls instead of one per caller; the figures are still per caller call.
type coalescing struct {
	c *client.Client
	b *client.Batcher
}

// coalesceWorkloads are the workloads --coalesce supports.
var coalesceWorkloads = []string{MarkNew, MarkMixed, CheckHit, CheckMiss}

// checkCoalesce rejects workloads that --coalesce does not support.
func checkCoalesce(workload string) error {
	for _, w := range coalesceWorkloads {
		if w == workload {
			return nil
		}
	}
	return fmt.Errorf("workload %q cannot be coalesced (with coalescing: %s)", workload, strings.Join(coalesceWorkloads, ", "))
}

func newCoalescing(ctx context.Context, cfg Config) (*coalescing, error) {
	c, err := client.New(ctx, cfg.Addrs, append(cfg.clientOptions(), client.WithTimeout(cfg.Timeout), client.WithMaxStaleness(cfg.MaxStaleness))...)
	if err != nil {
		return nil, err
	}
	return &coalescing{c: c, b: c.NewBatcher(client.WithBatchTransport(cfg.transport()))}, nil
}

// stats describes the RPCs the Batcher sent, for the result's note.
func (co *coalescing) stats() string {
	st := co.b.Stats()
	if st.RPCs == 0 {
		return "coalesced by client.Batcher: no RPC sent"
	}
	return fmt.Sprintf("coalesced by client.Batcher: %d caller IDs in %d RPCs (%.1f IDs per RPC)",
		st.Calls, st.RPCs, float64(st.Items)/float64(st.RPCs))
}

func (co *coalescing) close() {
	co.b.Close()
	co.c.Close()
}

// op returns one worker's op: n single-ID Batcher calls at once (n-1 extra
// goroutines), waiting for all of them.
func (co *coalescing) op(cfg Config, gen *IDGen, hits [][]byte) Op {
	batch := make([][]byte, cfg.Batch)
	isDup := make([]bool, cfg.Batch)
	codes := make([]client.Code, cfg.Batch)
	errs := make([]error, cfg.Batch)
	cons := client.Linearizable
	switch cfg.Consistency {
	case "stale":
		cons = client.Stale
	case "bounded":
		cons = client.Bounded
	}
	one := func(ctx context.Context, i int) {
		var r client.Result
		switch cfg.Workload {
		case CheckHit, CheckMiss:
			r, errs[i] = co.b.Check(ctx, cfg.Namespace, batch[i], cons)
		default:
			r, errs[i] = co.b.Mark(ctx, cfg.Namespace, client.Item{ID: batch[i]}, cfg.TTL)
		}
		codes[i] = r.Code
	}
	return func(ctx context.Context, n int, t *Tally) (int, int, error) {
		switch cfg.Workload {
		case MarkMixed:
			gen.Mixed(batch[:n], isDup[:n], cfg.DuplicateRatio)
		case CheckHit:
			for i := 0; i < n; i++ {
				batch[i] = hits[gen.Intn(len(hits))]
			}
		default:
			gen.FreshBatch(batch[:n])
		}
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		var wg sync.WaitGroup
		for i := 1; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				one(cctx, i)
			}()
		}
		one(cctx, 0)
		wg.Wait()
		for i := 0; i < n; i++ {
			if errs[i] != nil {
				return 0, 0, errs[i]
			}
		}
		want := client.CodeNew
		switch cfg.Workload {
		case CheckHit:
			want = client.CodeSeen
		case CheckMiss:
			want = client.CodeNotSeen
		}
		for i := 0; i < n; i++ {
			t.Add(codeName(codes[i]), 1)
			fresh := cfg.Workload != MarkMixed || !isDup[i]
			if fresh && codes[i] != want {
				t.Unexpected(1)
			}
		}
		return n, 1, nil
	}
}

// codeNames spell each client.Code as the answers are counted (NEW,
// NOT_SEEN, ...: the API's enum names, as before the bench went through
// the client): the client's names in upper case, computed once so that
// counting allocates nothing.
var codeNames = func() (names [256]string) {
	for i := range names {
		names[i] = strings.ToUpper(client.Code(i).String())
	}
	return names
}()

func codeName(c client.Code) string { return codeNames[c] }
