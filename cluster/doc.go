// Package cluster runs one dedupnode Raft group member: hashicorp/raft with
// a raft-boltdb log and stable store, a file snapshot store and a TCP
// transport, driving the fsm package's state machine.
//
// On top of Raft it provides what the gRPC edge (package server) needs:
//
//   - Propose: the group commit. Concurrent requests are coalesced into one
//     log entry (one fsync on a majority for many requests), stamped with
//     the leader's timestamp, with at most two entries in flight.
//   - ReadIndex: a linearizable read index (commit index confirmed by a
//     quorum heartbeat after this leader's term barrier), shared by
//     concurrent readers.
//   - The leadership loop: term barrier, term-start command, expiry ticks,
//     promotion of caught-up non-voters.
//   - Membership (Join, Remove, TransferLeadership), Status and an orderly
//     Shutdown.
//
// Errors callers branch on are sentinels (ErrNotLeader, ErrNotReady,
// ErrOutcomeUnknown, ErrShutdown) tested with errors.Is. See DESIGN.md.
package cluster
