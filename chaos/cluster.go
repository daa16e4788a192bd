package chaos

import (
	"context"
	"time"
)

// Cluster is a running dedupnode cluster the nemesis can hurt. Node IDs are
// "n1".."nN" in process mode and "node1".."nodeN" in docker mode.
type Cluster interface {
	// Nodes lists the node IDs in order.
	Nodes() []string
	// Addr is the gRPC address of a node, reachable from this process.
	Addr(id string) string
	// Kill stops a node at once (SIGKILL): no shutdown, no flush.
	Kill(ctx context.Context, id string) error
	// Stop shuts a node down gracefully (SIGTERM) and waits for it.
	Stop(ctx context.Context, id string) error
	// Start starts a node that was killed or stopped, on its data.
	Start(ctx context.Context, id string) error
	// Running reports whether the node's process is up (paused counts).
	Running(id string) bool
	// Pause freezes a node (SIGSTOP, docker pause); Resume thaws it.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Cut drops every packet (or byte) from → to between nodes. Client
	// traffic is not affected.
	Cut(ctx context.Context, from, to string) error
	// Slow degrades every link between nodes: delay, jitter, and the
	// probability of losing a packet or resetting a connection. Only where
	// Caps().Slow.
	Slow(ctx context.Context, delay, jitter time.Duration, loss float64) error
	// Disconnect takes a node off the network entirely (clients too) until
	// HealNet. Only where Caps().Disconnect.
	Disconnect(ctx context.Context, id string) error
	// HealNet removes every network fault.
	HealNet(ctx context.Context) error
	// Caps says which faults this cluster can inject.
	Caps() Caps
	// Describe names the cluster and where its logs are, for the report.
	Describe() string
	// Close stops every node and releases everything the cluster made.
	Close(ctx context.Context) error
}

// Caps lists optional fault abilities.
type Caps struct {
	Cut        bool
	Slow       bool
	Disconnect bool
	// Regions: nodes are grouped in regions (region faults apply).
	Regions bool
	// Notes explain faults that are not available and why.
	Notes []string
}
