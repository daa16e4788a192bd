// Package demo runs dedupnode's end-to-end demonstration: a local
// in-process cluster (internal/devcluster), an embedded broker (Broker: NATS
// JetStream by default, Kafka through an in-process kfake cluster,
// RabbitMQ through a rabbitmq-server started for the run), a
// producer that publishes events with realistic duplicates (producer
// retries seconds apart, a replay of an older range), and several
// consumers that crash and stall mid-message so that the broker really
// redelivers. Each consumer applies its effect to a Pebble ledger through
// client.Process; the summary checks that every unique event took effect
// exactly once. `dedupnode demo` is its command line.
package demo
