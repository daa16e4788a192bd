// Package replicacheck compares the state digests of a cluster's replicas
// (dedup.v1 Ops.Digest). A digest is only comparable with another taken at
// the same applied index, and a replica cannot be asked for its digest at a
// past index, so Compare asks every node in rounds until one round finds
// every node at the same applied index (or the context ends): a quiet
// cluster gets there in the first round or two; under continuous writes it
// may never, which Compare reports as such rather than as a divergence.
package replicacheck

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// AskFunc asks one node for its digest.
type AskFunc func(ctx context.Context, node string) (*dedupv1.DigestResponse, error)

// Answer is one node's reply in a round.
type Answer struct {
	Node string
	Resp *dedupv1.DigestResponse // nil when Err is set
	Err  error
}

// Result is the last round Compare took.
type Result struct {
	// Answers are in the order of the nodes given.
	Answers []Answer
	// Rounds is how many rounds were taken.
	Rounds int
	// Answered: every node answered. SameIndex: and all at one applied
	// index (Index). Agree: and with one digest. Compare is meaningful
	// only when SameIndex: a different digest at the same index is a
	// divergence.
	Answered  bool
	SameIndex bool
	Agree     bool
	Index     uint64
}

// Options tune Compare.
type Options struct {
	// Interval between rounds (default 200 ms).
	Interval time.Duration
	// CallTimeout bounds one node's answer in a round (default 30 s, cut
	// to ctx's deadline).
	CallTimeout time.Duration
}

// Compare asks every node for its digest, all at once, in rounds, until a
// round finds every node answering at the same applied index or ctx ends;
// it returns that round (or the last one). It returns at once after a round
// at the same index, whether the digests agree or not.
func Compare(ctx context.Context, nodes []string, ask AskFunc, opt Options) Result {
	if opt.Interval <= 0 {
		opt.Interval = 200 * time.Millisecond
	}
	if opt.CallTimeout <= 0 {
		opt.CallTimeout = 30 * time.Second
	}
	var res Result
	for rounds := 1; ; rounds++ {
		res = round(ctx, nodes, ask, opt.CallTimeout)
		res.Rounds = rounds
		if res.SameIndex || ctx.Err() != nil {
			return res
		}
		t := time.NewTimer(opt.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return res
		case <-t.C:
		}
	}
}

func round(ctx context.Context, nodes []string, ask AskFunc, callTimeout time.Duration) Result {
	res := Result{Answers: make([]Answer, len(nodes))}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			r, err := ask(cctx, n)
			if err == nil && r == nil {
				err = fmt.Errorf("empty answer")
			}
			res.Answers[i] = Answer{Node: n, Resp: r, Err: err}
		}()
	}
	wg.Wait()
	res.Answered = len(nodes) > 0
	for _, a := range res.Answers {
		if a.Err != nil {
			res.Answered = false
		}
	}
	if !res.Answered {
		return res
	}
	first := res.Answers[0].Resp
	res.SameIndex, res.Agree, res.Index = true, true, first.AppliedIndex
	for _, a := range res.Answers[1:] {
		if a.Resp.AppliedIndex != first.AppliedIndex {
			res.SameIndex, res.Agree, res.Index = false, false, 0
			return res
		}
		if !bytes.Equal(a.Resp.Digest, first.Digest) {
			res.Agree = false
		}
	}
	return res
}

// Hex returns a digest in hex.
func Hex(d []byte) string { return hex.EncodeToString(d) }

// Summary says in one line what the round found.
func (r Result) Summary() string {
	switch {
	case r.Agree:
		return fmt.Sprintf("%d replicas agree at applied index %d: digest %s", len(r.Answers), r.Index, Hex(r.Answers[0].Resp.Digest))
	case r.SameIndex:
		groups := map[string][]string{}
		var order []string
		for _, a := range r.Answers {
			h := Hex(a.Resp.Digest)
			if _, ok := groups[h]; !ok {
				order = append(order, h)
			}
			groups[h] = append(groups[h], a.Node)
		}
		parts := make([]string, len(order))
		for i, h := range order {
			parts[i] = strings.Join(groups[h], ",") + " " + short(h)
		}
		return fmt.Sprintf("replicas DIFFER at applied index %d: %s", r.Index, strings.Join(parts, "; "))
	case r.Answered:
		parts := make([]string, len(r.Answers))
		for i, a := range r.Answers {
			parts[i] = fmt.Sprintf("%s at %d", a.Node, a.Resp.AppliedIndex)
		}
		return fmt.Sprintf("replicas never reached one applied index in %d rounds: %s; digests are comparable only at one index: pause writes and run it again (or raise --timeout)", r.Rounds, strings.Join(parts, ", "))
	}
	var parts []string
	for _, a := range r.Answers {
		if a.Err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", a.Node, a.Err))
		}
	}
	if len(parts) == 0 {
		return "no nodes to compare"
	}
	return "not every node answered: " + strings.Join(parts, "; ") + "; start the missing node, or remove it from the cluster (dedupnode remove NODE_ID)"
}

func short(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}
