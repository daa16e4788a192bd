// Package settle decides what a broker integration does with a message
// once client.Process has answered: the one rule every integration shares,
// so that NATS, Kafka and RabbitMQ treat the same outcome alike and differ
// only in how they tell their broker.
package settle

import (
	"fmt"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// Action is what becomes of the message.
type Action uint8

const (
	// Done: the effect happened (now or on an earlier delivery); the
	// broker may forget the message (ack, commit its offset).
	Done Action = iota + 1
	// Retry: deliver it again after Decision.Delay (nak, requeue, retry
	// in place).
	Retry
	// Drop: never deliver it again (terminate, reject to a dead-letter
	// queue): retrying cannot help.
	Drop
)

// Decision is Decide's answer.
type Decision struct {
	Action Action
	// Delay before the redelivery (Retry only).
	Delay time.Duration
	// Err explains a Drop the integration reports (a digest conflict).
	Err error
}

// minInProgressDelay keeps a lease that is about to expire from being
// polled in a busy loop.
const minInProgressDelay = 50 * time.Millisecond

// Decide maps a Process outcome for id to a Decision:
//   - processed or duplicate: Done;
//   - in progress elsewhere: Retry once the holder's lease could have
//     expired (at least 50 ms), at most inProgressDelay;
//   - a conflict (the ID was recorded with another payload digest): Drop,
//     with an error naming the ID;
//   - anything else (the handler failed, the lease was lost, the cluster
//     could not answer): Retry after retryDelay.
func Decide(res client.ProcessResult, id []byte, inProgressDelay, retryDelay time.Duration) Decision {
	switch res.Outcome {
	case client.OutcomeProcessed, client.OutcomeDuplicate:
		return Decision{Action: Done}
	case client.OutcomeInProgress:
		d := inProgressDelay
		if res.Record != nil {
			d = min(max(time.Until(res.Record.Expires), minInProgressDelay), inProgressDelay)
		}
		return Decision{Action: Retry, Delay: d}
	case client.OutcomeConflict:
		return Decision{Action: Drop, Err: fmt.Errorf("ID %q was recorded with another payload digest", id)}
	default:
		return Decision{Action: Retry, Delay: retryDelay}
	}
}
