// Package fsm is dedupnode's replicated state machine: it applies the Raft
// log's commands (Mark, Claim, Commit, Renew, Release, Forget, namespace and
// node changes) to a Pebble database and answers reads from it.
//
// # The apply contract
//
// Every replica applies the same log and MUST end in the same state, byte
// for byte (Invariant 5, checked by TestInvariant5_*). Therefore:
//
//  1. Apply READS NO CLOCK. Each Command carries the leader's timestamp;
//     apply uses now = max(Command.TimestampMs, last applied timestamp, 0),
//     so time never goes backwards, across leader changes too. Every expiry
//     is now + TTL, an absolute time stored in the record.
//  2. Apply USES NO RANDOMNESS and no state that differs between replicas:
//     not the Bloom filters' answers for decisions (they only skip reads,
//     and only when they say "definitely not"), not map iteration order for
//     anything that reaches a result.
//  3. The persisted applied index is written IN THE SAME PEBBLE BATCH as
//     the data. Entries at or below it are skipped (they return nil), so the
//     log replayed after a restart changes nothing.
//  4. An op whose namespace is missing, or which is invalid against the
//     namespace as of its entry, applies NOTHING and returns an error in its
//     OpResult. Other ops of the same entry are unaffected.
//  5. A storage error PANICS: a replica that cannot apply stops rather than
//     diverging.
//  6. Fencing tokens are the Raft index of the entry that granted the claim,
//     so they only grow, per ID and cluster-wide. Being guessable, a fence
//     alone does not prove a lease: Commit, Renew and Release must carry
//     the claim's request token too (items without one, only in entries
//     written before, are checked by their fence alone, as they were).
//  7. Within one op (one client request) the FIRST occurrence of an ID
//     decides: an item repeating an earlier item's ID and request token is
//     answered as another call would be (Mark DUPLICATE or CONFLICT, Claim
//     IN_PROGRESS), not as a retry, and writes nothing. A retried op answers
//     exactly as its first attempt, repeats included.
//
// Snapshot syncs Pebble before returning (so the log may be truncated up to
// the snapshot index) and streams a consistent Pebble view with a SHA-256
// trailer; Restore verifies the whole stream into a scratch database before
// swapping it in (Invariant 8). See DESIGN.md for the request path and the
// trade-offs.
package fsm
