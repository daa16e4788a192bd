package dedupv1

// The error vocabulary of dedupnode's gRPC errors, in one place: the server
// attaches it (google.rpc.ErrorInfo in the status details), the client
// decodes it into typed errors, and tools that speak gRPC directly (chaos)
// read it. Nothing parses an error's text.

// ErrorDomain is the ErrorInfo domain of every dedupnode error.
const ErrorDomain = "dedupnode"

// ErrorInfo reasons.
const (
	// ReasonNotLeader: the node is not the leader (or the leader is still
	// starting its term) and nothing was written. Metadata may name the
	// leader (MetaLeaderID, MetaLeaderGRPCAddr). Retry is safe.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonOutcomeUnknown: the write reached the log but leadership was
	// lost before it was known to commit. Retry with the same request
	// token: the retry returns the original answer.
	ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"
	// ReasonShuttingDown: the node is stopping; nothing was written.
	ReasonShuttingDown = "SHUTTING_DOWN"
	// ReasonLagging: this node could not apply the log up to the read
	// index in time (it is cut off from the leader or far behind). Retry
	// the read on another node.
	ReasonLagging = "NODE_LAGGING"
	// ReasonBusy: the leader could not hand the write to Raft in time
	// (its disk is behind); nothing was written. Retry after a pause.
	ReasonBusy = "LEADER_BUSY"
	// ReasonInvalidArgument: the request was rejected before anything was
	// applied; a BadRequest detail names the field.
	ReasonInvalidArgument = "INVALID_ARGUMENT"
	// ReasonNamespaceNotFound: the namespace (MetaNamespace) does not exist.
	ReasonNamespaceNotFound = "NAMESPACE_NOT_FOUND"
	// ReasonNamespaceExists: the namespace (MetaNamespace) already exists.
	ReasonNamespaceExists = "NAMESPACE_EXISTS"
	// ReasonNodeNotFound: no member has the node ID.
	ReasonNodeNotFound = "NODE_NOT_FOUND"
	// ReasonWriteTimeout: the write did not commit within the call's
	// deadline; it may still commit. Retry with the same request token.
	ReasonWriteTimeout = "WRITE_TIMEOUT"
	// ReasonDiskFull (RESOURCE_EXHAUSTED): the leader's data directory has
	// less free space than its --min-free-disk; nothing was written.
	// Metadata: MetaPath, MetaFreeBytes, MetaMinFreeBytes,
	// MetaResumeFreeBytes. Writes resume by themselves once free space is
	// back above MetaResumeFreeBytes; reads are still served.
	ReasonDiskFull = "DISK_FULL"
	// ReasonEntryTooLarge (RESOURCE_EXHAUSTED): the request is larger than
	// one Raft entry may be (--max-entry-bytes); nothing was written.
	// Metadata: MetaBytes, MetaMaxBytes. Split the request.
	ReasonEntryTooLarge = "ENTRY_TOO_LARGE"
	// ReasonNotCaughtUp (FAILED_PRECONDITION): Promote refused a node the
	// leader cannot reach or that has not caught up; nothing changed. The
	// message names the node and why. Start the node or wait, or promote
	// with force.
	ReasonNotCaughtUp = "NODE_NOT_CAUGHT_UP"
	// ReasonNodeRemoved (FAILED_PRECONDITION): the node asked was removed
	// from the cluster and its ID is retired (it runs from a removed
	// member's data dir); nothing was done. MetaNodeID names it. Waiting
	// does not heal it: ask another node; the operator wipes its data dir
	// and joins it with a new --node-id.
	ReasonNodeRemoved = "NODE_REMOVED"
)

// ErrorInfo metadata keys.
const (
	// MetaLeaderID and MetaLeaderGRPCAddr name the leader a NOT_LEADER
	// node knows of.
	MetaLeaderID       = "leader_id"
	MetaLeaderGRPCAddr = "leader_grpc_addr"
	// MetaMessage is the node's message without the what-to-do advice the
	// status message carries (for tools that print their own advice).
	MetaMessage = "message"
	// MetaNamespace names the namespace an error is about.
	MetaNamespace = "namespace"
	// MetaMaxMs is the upper limit, in milliseconds, of a TTL or lease
	// that was out of range (INVALID_ARGUMENT on ttl_ms or lease_ms).
	MetaMaxMs = "max_ms"
	// MetaItem is the position, counting from 1, of the request item an
	// INVALID_ARGUMENT is about (the BadRequest field "items[2].id" or
	// "ids[2]" has item 3); absent when it is about no single item.
	MetaItem = "item"
	// MetaPath, MetaFreeBytes and MetaMinFreeBytes: the data directory
	// that is short of space, its free bytes and the threshold (DISK_FULL).
	// MetaResumeFreeBytes is the free space at which writes resume: the
	// threshold plus a margin of 1/16 of it, so a node at the edge does not
	// flap. All three are decimal byte counts.
	MetaPath            = "path"
	MetaFreeBytes       = "free_bytes"
	MetaMinFreeBytes    = "min_free_bytes"
	MetaResumeFreeBytes = "resume_free_bytes"
	// MetaBytes and MetaMaxBytes: a request's encoded size and the entry
	// limit (ENTRY_TOO_LARGE).
	MetaBytes    = "bytes"
	MetaMaxBytes = "max_bytes"
	// MetaNodeID: the node an error is about (NODE_REMOVED).
	MetaNodeID = "node_id"
)
