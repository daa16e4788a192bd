package replicacheck

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// fake answers from a table per node; a node's index advances one step per
// call until it reaches its last entry.
type fake struct {
	mu    sync.Mutex
	steps map[string][]*dedupv1.DigestResponse
	err   map[string]error
}

func (f *fake) ask(_ context.Context, node string) (*dedupv1.DigestResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.err[node]; err != nil {
		return nil, err
	}
	s := f.steps[node]
	r := s[0]
	if len(s) > 1 {
		f.steps[node] = s[1:]
	}
	return r, nil
}

func d(index uint64, digest string) *dedupv1.DigestResponse {
	return &dedupv1.DigestResponse{AppliedIndex: index, Digest: []byte(digest)}
}

func run(t *testing.T, f *fake, within time.Duration) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return Compare(ctx, []string{"n1", "n2", "n3"}, f.ask, Options{Interval: time.Millisecond})
}

func TestCompare(t *testing.T) {
	t.Run("agree after catching up", func(t *testing.T) {
		f := &fake{steps: map[string][]*dedupv1.DigestResponse{
			"n1": {d(9, "a")}, "n2": {d(7, "x"), d(8, "y"), d(9, "a")}, "n3": {d(9, "a")}}}
		r := run(t, f, 10*time.Second)
		if !r.Agree || r.Index != 9 || r.Rounds != 3 {
			t.Fatalf("%+v: %s", r, r.Summary())
		}
	})
	t.Run("differ at the same index", func(t *testing.T) {
		f := &fake{steps: map[string][]*dedupv1.DigestResponse{
			"n1": {d(9, "a")}, "n2": {d(9, "b")}, "n3": {d(9, "a")}}}
		r := run(t, f, 10*time.Second)
		if r.Agree || !r.SameIndex || r.Rounds != 1 || !strings.Contains(r.Summary(), "DIFFER") {
			t.Fatalf("%+v: %s", r, r.Summary())
		}
	})
	t.Run("never one index", func(t *testing.T) {
		f := &fake{steps: map[string][]*dedupv1.DigestResponse{
			"n1": {d(9, "a")}, "n2": {d(8, "b")}, "n3": {d(9, "a")}}}
		r := run(t, f, 100*time.Millisecond)
		if r.Agree || r.SameIndex || !r.Answered || !strings.Contains(r.Summary(), "never reached") {
			t.Fatalf("%+v: %s", r, r.Summary())
		}
	})
	t.Run("a node fails", func(t *testing.T) {
		f := &fake{steps: map[string][]*dedupv1.DigestResponse{
			"n1": {d(9, "a")}, "n2": {d(9, "a")}, "n3": {d(9, "a")}}, err: map[string]error{"n3": errors.New("down")}}
		r := run(t, f, 100*time.Millisecond)
		if r.Answered || r.Agree || !strings.Contains(r.Summary(), "n3: down") {
			t.Fatalf("%+v: %s", r, r.Summary())
		}
	})
}
