package settle

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// Every outcome of Process settles one way; an in-progress ID is retried
// once its holder's lease could have run out, never sooner than 50 ms nor
// later than the configured delay.
func TestDecide(t *testing.T) {
	const inProgress, retry = 5 * time.Second, 2 * time.Second
	leased := func(left time.Duration) *client.Record { return &client.Record{Expires: time.Now().Add(left)} }
	for _, tc := range []struct {
		name       string
		res        client.ProcessResult
		want       Action
		minD, maxD time.Duration
	}{
		{"processed", client.ProcessResult{Outcome: client.OutcomeProcessed, Ran: true}, Done, 0, 0},
		{"duplicate", client.ProcessResult{Outcome: client.OutcomeDuplicate}, Done, 0, 0},
		{"in progress, lease ends soon", client.ProcessResult{Outcome: client.OutcomeInProgress, Record: leased(time.Second)}, Retry, 500 * time.Millisecond, time.Second},
		{"in progress, lease long", client.ProcessResult{Outcome: client.OutcomeInProgress, Record: leased(time.Hour)}, Retry, inProgress, inProgress},
		{"in progress, lease just expired", client.ProcessResult{Outcome: client.OutcomeInProgress, Record: leased(-time.Second)}, Retry, minInProgressDelay, minInProgressDelay},
		{"in progress, no record", client.ProcessResult{Outcome: client.OutcomeInProgress}, Retry, inProgress, inProgress},
		{"handler failed", client.ProcessResult{Outcome: client.OutcomeFailed, Ran: true}, Retry, retry, retry},
		{"conflict", client.ProcessResult{Outcome: client.OutcomeConflict}, Drop, 0, 0},
	} {
		d := Decide(tc.res, []byte("order-1"), inProgress, retry)
		if d.Action != tc.want {
			t.Errorf("%s: action %d, want %d", tc.name, d.Action, tc.want)
		}
		if d.Delay < tc.minD || d.Delay > tc.maxD {
			t.Errorf("%s: delay %v, want within [%v, %v]", tc.name, d.Delay, tc.minD, tc.maxD)
		}
		if (tc.want == Drop) != (d.Err != nil) || (d.Err != nil && !strings.Contains(d.Err.Error(), `"order-1"`)) {
			t.Errorf("%s: err %v", tc.name, d.Err)
		}
	}
}
