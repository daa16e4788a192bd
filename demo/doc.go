// Package demo runs dedupnode's end-to-end demonstration: a local
// in-process cluster (Cluster), an embedded NATS JetStream server, a
// producer that publishes events with realistic duplicates (producer
// retries seconds apart, a replay of an older range), and several
// consumers that crash and stall mid-message so that JetStream really
// redelivers. Each consumer applies its effect to a Pebble ledger through
// client.Process; the summary checks that every unique event took effect
// exactly once. `dedupnode demo` is its command line.
package demo
