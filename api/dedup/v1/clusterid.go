package dedupv1

// HeaderClusterID is the gRPC response header metadata key under which
// every node sends its cluster ID (on every unary and streaming call,
// errors included), once the entry that set the ID has applied on it.
// Clients and peers compare it with the ID they expect and refuse a node
// of another cluster (reason ReasonClusterMismatch on the server side).
// Absent or empty: the node does not know its ID yet (an older version, a
// node still catching up).
const HeaderClusterID = "dedupnode-cluster-id"

// ReasonClusterMismatch (FAILED_PRECONDITION): a node refused a peer (a
// node to join, a leader to forward to) that belongs to another cluster;
// nothing changed. Metadata: MetaClusterID (this cluster's),
// MetaPeerClusterID (the peer's), MetaPeerAddr.
const ReasonClusterMismatch = "CLUSTER_MISMATCH"

// ErrorInfo metadata keys of ReasonClusterMismatch.
const (
	MetaClusterID     = "cluster_id"
	MetaPeerClusterID = "peer_cluster_id"
	MetaPeerAddr      = "peer_addr"
)
