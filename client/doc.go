// Package client is the Go client of dedupnode, a replicated
// message-deduplication store. The dedupnode CLI is built on it.
//
// A consumer of an at-least-once broker asks dedupnode, per message ID,
// "did I already handle this?":
//
//	c, err := client.New(ctx, []string{"127.0.0.1:7070", "127.0.0.1:7071"})
//	...
//	res, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("order-456-created")}}, 0)
//	if res[0].Code == client.CodeDuplicate { /* skip: already handled */ }
//
// # Batches and results
//
// Every operation takes a batch (at most the server's --max-batch items,
// 10 000 by default) and returns one [Result] per item, in request order.
// Invalid input (an empty or too long ID, an unknown namespace, a TTL out
// of range, an oversized batch) fails the whole call with gRPC code
// InvalidArgument, NotFound or ResourceExhausted; nothing of it is applied.
// What every node refuses alike, an empty ID or a TTL or lease that is not
// whole milliseconds, the client refuses itself before dialling or sending
// anything, with the same *[Error] a node's answer gives (ErrInvalidArgument,
// Field, Violation, Item); limits a node or namespace sets are its to check.
//
// # Routing, retries and request tokens
//
// The client finds the Raft leader through the Status RPC and sends writes
// (and linearizable reads) to it directly; while no leader is known it sends
// them to any reachable node, which forwards them. Calls that fail with
// gRPC Unavailable (election, no quorum, node down, outcome unknown after a
// leader change), Aborted, or an attempt timeout are retried with
// exponential backoff and jitter until they succeed, the attempts run out
// ([WithRetry]) or the caller's context ends.
//
// An attempt that a node leaves unanswered (a frozen or stalled leader, a
// black-holed link: the connection stays up, no answer comes) is abandoned
// after the attempt timeout, by default a third of the time left before
// the caller's deadline, 2 to 5 s ([WithAttemptTimeout]), and the call is
// retried on the leader the cluster reports by then. So a call whose
// leader froze succeeds on the new leader within its deadline; only when
// the caller's deadline itself ends is a write's outcome unknown. Give
// calls deadlines of several seconds (10 s is a good default): an attempt
// made with less than twice MinAttemptTimeout (4 s) left gets all of it.
//
// Each logical Mark or Claim call generates ONE random 16-byte request
// token and sends it on every retry. The server answers a write whose token
// matches the recorded one with the recorded outcome, so a Mark that reached
// the leader but whose reply was lost returns NEW again on retry, never
// DUPLICATE: retrying never makes the winner skip its own message.
//
// Errors returned by the client wrap the last gRPC status error, so
// status.Code(err) gives its code (see google.golang.org/grpc/status).
//
// # Leases
//
// A Claim that answers [CodeAcquired] takes a lease, which [Result.Lease]
// names: the ID, its fencing token and the claim's request token. Commit,
// Renew and Release need all three; the request token, which only the
// claimer knows, proves the lease is yours, and a claim retried with it
// answers acquired with the same lease. No answer to anyone else carries a
// live lease's request token or fencing token (another consumer's claim,
// a Check, a Mark or a lease_lost answer shows its state and expiry only),
// so no other consumer can commit, renew or release it. This keeps
// consumers apart; it is not access control: a client with the write
// right may still Forget an ID.
//
// # Batching and processing
//
// A consumer that handles one message per goroutine can call a [Batcher]
// (c.NewBatcher()) instead: concurrent single-ID calls are sent together in
// batched RPCs, each keeping its own request token. [Client.Process] and
// [Batcher.Process] claim an ID, run the side effect, then commit it (or
// release it when the effect failed), renewing the lease meanwhile; see
// also the integrations for NATS JetStream, Watermill and webhooks.
//
// # Times and durations
//
// TTLs and leases passed to the client must be whole milliseconds (the
// store counts in them); others (500µs, 1.9ms) and negative ones fail with
// ErrInvalidArgument before anything is sent. 0 means "the namespace
// default". Times in results are UTC with millisecond
// precision, as chosen by the Raft leader.
package client
