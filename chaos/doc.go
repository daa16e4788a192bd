// Package chaos runs a dedupnode cluster under faults and checks that it
// kept its promises: the engine behind `dedupnode chaos`.
//
// A run (Run) starts a cluster — local `dedupnode serve` processes with a
// fault-injecting proxy on every Raft link (package chaos/netproxy), or the
// docker-compose cluster driven through the Docker engine — and then, for
// Config.Duration:
//
//   - a workload of consumers receives messages from an at-least-once
//     stream in which a message may arrive up to four times at once (planned
//     duplicates, concurrent claimants). A message is handled either with
//     Mark (test-and-set) or with Claim → work → Commit/Release, with short
//     leases that sometimes run out; linearizable Checks (and a few stale
//     ones) read recent IDs from the node that served the client or from any
//     node. A request whose answer is lost is retried with its request
//     token, inside the operation and sometimes as a new operation;
//   - a nemesis injects one fault at a time (kill -9 of the leader or any
//     node, graceful restart, SIGSTOP/SIGCONT, leader isolation,
//     minority/majority split, one-way and asymmetric links, slow and
//     resetting links, network disconnect, kill -9 of every node; with
//     regions: a region cut off both ways or one way, delay spikes between
//     regions, kill -9 of the leader's region), holds it, heals it and
//     waits for a leader. With read replicas (ProcessConfig.Replicas) the
//     workload adds bounded checks, and each region cut is probed on the
//     cut region's replicas (ProbeStats).
//
// Then everything is healed, the run waits until every node has applied the
// leader's commit index and every lease has run out, reads every ID from
// every node with stale consistency, and hands the recorded history
// (package chaos/history) to the checker (package chaos/check).
//
// The process mode is fast enough for CI (scripts/chaos-ci.sh); the docker
// mode exercises the shipped image and compose file. Faults a mode cannot
// inject are listed in the result's notes rather than faked.
package chaos
