package demo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// Broker is the message broker a demo runs on: an embedded server (NATS
// JetStream, Kafka) holding one stream, topic or queue of events, read by
// one group of consumers. Each broker's consumers hand every delivery to
// dedupnode through that broker's integration package (natsdedup,
// kafkadedup, ...), so the demo exercises the code users run.
//
// The demo itself (events, faults, ledger, checks) does not depend on the
// broker: it publishes through Publish, runs consumer lives through
// NewConsumer and Consumer.Run, crashes them with Consumer.Kill, and waits
// for Drained.
type Broker interface {
	// Publish sends one event body. It may return before the broker
	// confirmed it; Flush waits for every confirmation.
	Publish(ctx context.Context, body []byte) error
	// Flush waits until every Publish so far is confirmed by the broker.
	Flush(ctx context.Context) error
	// NewConsumer connects one consumer process (one life of it: after a
	// crash the demo makes a new one).
	NewConsumer(ctx context.Context, spec ConsumerSpec) (Consumer, error)
	// Acked returns how many distinct published messages consumers have
	// acknowledged (committed) so far: the progress bar. It need not be
	// exact while consumers crash; Drained decides the end.
	Acked() int64
	// Drained reports whether the broker holds every one of the published
	// messages as acknowledged (committed): nothing left to deliver.
	Drained(ctx context.Context, published int) (bool, error)
	// Close stops the broker and waits until it stopped.
	Close() error
}

// Consumer is one life of a consumer process.
type Consumer interface {
	// Run handles deliveries, spec.Workers at once, until ctx ends (it
	// returns nil) or the consumer cannot go on (an error). It closes the
	// consumer's broker connection before it returns.
	Run(ctx context.Context) error
	// Kill drops the consumer's broker connection at once, as a crashed
	// process would: nothing more is acknowledged or committed. Safe to
	// call from a handler and concurrently with Run; Run still returns.
	Kill()
}

// ConsumerSpec is what a consumer process needs from the demo.
type ConsumerSpec struct {
	// Name names the process ("consumer-2.5": consumer 2, fifth life).
	Name string
	// Processor is the process's own dedupnode Batcher.
	Processor client.Processor
	// Namespace is the dedupnode namespace of the run.
	Namespace string
	// IDField is the JSON field of the body holding the event ID.
	IDField string
	// Workers is the number of deliveries handled at once.
	Workers int
	// ProcessOptions go to every Process call (the lease).
	ProcessOptions []client.ProcessOption
	// RetryDelay is the wait before a delivery whose run failed (or whose
	// claim could not be made) is tried again.
	RetryDelay time.Duration
	// InProgressDelay caps the wait before a delivery whose ID another
	// consumer holds is tried again.
	InProgressDelay time.Duration
	// Handler applies one event (its body) under Process; ctx is Process's.
	Handler func(ctx context.Context, body []byte) error
	// Observe is called once per delivery (attempt) with what happened.
	Observe func(Delivery)
}

// Delivery is what happened to one delivery of a message.
type Delivery struct {
	// ID is the message's dedup ID (nil when none was found).
	ID []byte
	// Outcome is Process's outcome.
	Outcome client.Outcome
	// Ran says whether the handler ran.
	Ran bool
	// Redelivered says whether the broker delivered this very message
	// (not a copy published again) to a consumer before.
	Redelivered bool
	// Err is the handler's or dedupnode's error, if any.
	Err error
}

// BrokerConfig is what a broker needs to start.
type BrokerConfig struct {
	// Dir holds the broker's data.
	Dir string
	// Consumers and Workers size the consumer group (in-flight limits).
	Consumers, Workers int
	// AckWait is how long a delivery may stay unacknowledged before the
	// broker redelivers it, for brokers that have such a timer.
	AckWait time.Duration
	// Published is the number of messages the run will publish.
	Published int
	// Logger receives the broker's logs.
	Logger *slog.Logger
}

// Brokers lists the brokers the demo knows, in the order shown in help.
var Brokers = []string{"nats", "kafka", "rabbitmq"}

// BrokerTitle is the broker's name for people ("NATS JetStream").
func BrokerTitle(name string) string {
	switch name {
	case "", "nats":
		return "NATS JetStream"
	case "kafka":
		return "Kafka (in-process kfake cluster)"
	case "rabbitmq":
		return "RabbitMQ"
	}
	return name
}

// ErrUnknownBroker means the broker name is not one of Brokers.
var ErrUnknownBroker = fmt.Errorf("unknown broker: want one of %s", strings.Join(Brokers, ", "))

// OpenBroker starts the named embedded broker.
func OpenBroker(ctx context.Context, name string, cfg BrokerConfig) (Broker, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch name {
	case "", "nats":
		return openNATSBroker(ctx, cfg)
	case "kafka":
		return openKafkaBroker(ctx, cfg)
	case "rabbitmq":
		return openRabbitBroker(ctx, cfg)
	}
	return nil, fmt.Errorf("%w (got %q)", ErrUnknownBroker, name)
}
