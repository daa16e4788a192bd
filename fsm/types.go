package fsm

import (
	"errors"
	"fmt"
	"time"
)

// DefaultNamespace is used when a request names no namespace. It exists from
// the start in every FSM with DefaultNamespaceConfig.
const DefaultNamespace = "default"

// ExpiryMode says whether a duplicate sighting extends a record's expiry.
type ExpiryMode uint8

const (
	// ExpiryFixed keeps the first expiry; duplicates never extend it.
	ExpiryFixed ExpiryMode = 1
	// ExpirySliding lets a duplicate Mark extend expiry to now+TTL.
	ExpirySliding ExpiryMode = 2
)

func (m ExpiryMode) String() string {
	switch m {
	case ExpiryFixed:
		return "fixed"
	case ExpirySliding:
		return "sliding"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// NamespaceConfig is an independent dedup space. All durations are
// milliseconds.
type NamespaceConfig struct {
	Name string
	// ID is assigned by the FSM at creation and used in storage keys.
	ID             uint32
	DefaultTTLMs   int64
	MaxTTLMs       int64
	MaxIDBytes     int
	Mode           ExpiryMode
	DefaultLeaseMs int64
	// BucketWidthMs is the width of the expiry buckets; records are stored
	// under the bucket of their expiry and a whole bucket is dropped with one
	// range deletion once it has fully expired. Fixed at creation.
	BucketWidthMs int64
}

// Namespace limits.
const (
	MinTTLMs           = int64(time.Second / time.Millisecond)
	MaxTTLLimitMs      = int64(366 * 24 * time.Hour / time.Millisecond)
	DefaultMaxIDBytes  = 512
	DefaultLeaseMs     = int64(30 * time.Second / time.Millisecond)
	targetBucketsPerNS = 32
	minBucketWidthMs   = int64(time.Second / time.Millisecond)
	maxBucketWidthMs   = int64(time.Hour / time.Millisecond)
)

// DefaultNamespaceConfig returns the settings of the "default" namespace and
// of namespaces auto-created in dev mode: TTL 24h, max TTL 7 days, IDs up to
// 512 bytes, fixed expiry, 30 s leases.
func DefaultNamespaceConfig(name string) NamespaceConfig {
	ns := NamespaceConfig{
		Name:           name,
		DefaultTTLMs:   int64(24 * time.Hour / time.Millisecond),
		MaxTTLMs:       int64(7 * 24 * time.Hour / time.Millisecond),
		MaxIDBytes:     DefaultMaxIDBytes,
		Mode:           ExpiryFixed,
		DefaultLeaseMs: DefaultLeaseMs,
	}
	ns.BucketWidthMs = BucketWidthFor(ns.MaxTTLMs)
	return ns
}

// BucketWidthFor derives the expiry bucket width from a namespace's max TTL:
// about 32 buckets span the max TTL, clamped to [1 s, 1 h].
func BucketWidthFor(maxTTLMs int64) int64 {
	w := (maxTTLMs + targetBucketsPerNS - 1) / targetBucketsPerNS
	w = max(w, minBucketWidthMs)
	w = min(w, maxBucketWidthMs)
	return w
}

// Result codes carried in ItemResult.Code.
type Code uint8

const (
	CodeNew        Code = 1 // Mark: recorded now
	CodeDuplicate  Code = 2 // Mark/Claim: already recorded (committed)
	CodeConflict   Code = 3 // Mark/Claim: recorded with a different digest
	CodeAcquired   Code = 4 // Claim: lease taken
	CodeInProgress Code = 5 // Claim: another live lease holds the ID
	CodeOK         Code = 6 // Commit/Renew/Release/Forget succeeded
	CodeLeaseLost  Code = 7 // Commit/Renew/Release: the lease is gone or fenced
	CodeSeen       Code = 8 // Check: recorded and not expired
	CodeNotSeen    Code = 9 // Check: absent or expired
)

func (c Code) String() string {
	switch c {
	case CodeNew:
		return "new"
	case CodeDuplicate:
		return "duplicate"
	case CodeConflict:
		return "conflict"
	case CodeAcquired:
		return "acquired"
	case CodeInProgress:
		return "in_progress"
	case CodeOK:
		return "ok"
	case CodeLeaseLost:
		return "lease_lost"
	case CodeSeen:
		return "seen"
	case CodeNotSeen:
		return "not_seen"
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// LostReason says why a Commit, Renew or Release answered CodeLeaseLost.
// Apply derives it from the stored record, the command's fencing token and
// the command's time alone, so every replica gives the same reason. Results
// are not stored: a retry is answered from the record as it is then (the
// same reason while nothing else changed the ID).
type LostReason uint8

const (
	LostNone LostReason = 0
	// LostNotClaimed: no record of the ID (never claimed, forgotten, or
	// expired long enough ago that its expiry bucket was dropped), or the
	// lease named was released.
	LostNotClaimed LostReason = 1
	// LostExpired: the lease named (or the record its commit made) has
	// expired and nothing replaced it.
	LostExpired LostReason = 2
	// LostTokenMismatch: the lease named is not the ID's: its record
	// carries another fencing token (a newer claim took it, or the token
	// was never granted for this ID) or another claim's request token.
	LostTokenMismatch LostReason = 3
	// LostAlreadyCommitted: the ID holds a live committed record (this
	// lease's own commit for Renew and Release, another holder's commit, or
	// a mark), which a lease can no longer change.
	LostAlreadyCommitted LostReason = 4
)

func (r LostReason) String() string {
	switch r {
	case LostNone:
		return ""
	case LostNotClaimed:
		return "not_claimed"
	case LostExpired:
		return "expired"
	case LostTokenMismatch:
		return "token_mismatch"
	case LostAlreadyCommitted:
		return "already_committed"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// RecordState is the state of a stored ID.
type RecordState uint8

const (
	StateCommitted RecordState = 1 // marked or committed
	StateLeased    RecordState = 2 // claimed, lease until ExpiresMs
	// StateReleased remembers a released lease until its lease expiry so a
	// retried Release answers OK; it does not count as seen.
	StateReleased RecordState = 3
)

// Record is what the store keeps per ID. Times are Unix milliseconds.
type Record struct {
	State       RecordState
	FirstSeenMs int64
	ExpiresMs   int64
	// Token is the request token of the call that recorded or claimed it.
	Token []byte
	// Digest is the payload digest given when recorded.
	Digest []byte
	// Fence is the fencing token of the latest claim: the cluster's fencing
	// epoch in the high FenceEpochBits bits and the Raft index of the entry
	// that granted it in the low FenceIndexBits (MakeFence), so it only
	// grows per ID and cluster-wide, across restores and imports too.
	Fence uint64
}

// ItemResult is the outcome for one Item.
type ItemResult struct {
	Code Code
	// Reason says why, for CodeLeaseLost (LostNone otherwise).
	Reason LostReason
	// Record is the state after the operation; zero if the ID is absent.
	Record Record
}

// OpResult is the outcome of one Op. Err is non-nil when the whole op was
// rejected at apply time (nothing of it was applied); it wraps one of the
// sentinel errors below.
type OpResult struct {
	Err       error
	Items     []ItemResult
	Namespace NamespaceConfig
	// FenceEpoch is the state's fencing epoch after an OpRaiseFenceEpoch.
	FenceEpoch uint64
}

// ApplyResult is what FSM.Apply returns (through raft's ApplyFuture.Response)
// for a Command: one OpResult per Op, in order. For entries at or below the
// persisted applied index (replays) it is nil.
type ApplyResult struct {
	Index uint64
	Ops   []OpResult
}

// Sentinel errors shared by every layer (server maps them to gRPC codes).
var (
	ErrNamespaceNotFound = errors.New("namespace not found")
	ErrNamespaceExists   = errors.New("namespace already exists")
	ErrInvalidArgument   = errors.New("invalid argument")
	ErrNodeNotFound      = errors.New("node not found")
	// ErrFenceRange: a claim's Raft index no longer fits the fencing
	// token's index bits (2^48 entries), or an epoch past MaxFenceEpoch
	// was asked for. Nothing of the op applied.
	ErrFenceRange = errors.New("fencing token out of range")
)

// Fencing tokens: epoch<<FenceIndexBits | Raft index. The epoch starts at
// 0 (so tokens of a cluster never restored are plain Raft indexes) and
// grows by one at each restore from a backup, and past the source's at
// an import; tokens granted in a later epoch exceed every token of an
// earlier one whatever the indexes.
const (
	FenceIndexBits = 48
	FenceEpochBits = 64 - FenceIndexBits
	MaxFenceEpoch  = 1<<FenceEpochBits - 1
	maxFenceIndex  = 1<<FenceIndexBits - 1
)

// MakeFence returns the fencing token of a claim applied at Raft index
// index in epoch epoch. REQUIRES: index <= 2^48-1, epoch <= MaxFenceEpoch.
func MakeFence(epoch, index uint64) uint64 { return epoch<<FenceIndexBits | index }

// FenceEpochOf returns the epoch a fencing token was granted in.
func FenceEpochOf(fence uint64) uint64 { return fence >> FenceIndexBits }

// NamespaceError is an error about one named namespace (not found, already
// exists); it wraps the sentinel, so errors.Is(err, ErrNamespaceNotFound)
// holds, and carries the name so that no layer parses it out of the text.
type NamespaceError struct {
	Name string
	Err  error // ErrNamespaceNotFound or ErrNamespaceExists
}

func (e *NamespaceError) Error() string {
	switch e.Err {
	case ErrNamespaceNotFound:
		return fmt.Sprintf("namespace %q not found", e.Name)
	case ErrNamespaceExists:
		return fmt.Sprintf("namespace %q already exists", e.Name)
	}
	return fmt.Sprintf("namespace %q: %v", e.Name, e.Err)
}

func (e *NamespaceError) Unwrap() error { return e.Err }

// ApplyErr is returned by FSM.Apply when a log entry cannot be decoded; the
// entry is skipped on every replica alike.
type ApplyErr struct{ Err error }

func (e *ApplyErr) Error() string { return "apply: " + e.Err.Error() }
func (e *ApplyErr) Unwrap() error { return e.Err }
