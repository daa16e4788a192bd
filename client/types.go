package client

import (
	"fmt"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Code is the outcome for one item of a batch. Its text form (String,
// MarshalText) is the lower-case name the CLI prints: "new", "duplicate",
// "conflict", "seen", "not_seen", "acquired", "in_progress", "ok",
// "lease_lost".
type Code uint8

const (
	// CodeUnknown is the zero value; the client never returns it for a
	// successful call.
	CodeUnknown Code = iota
	// CodeNew (Mark): the ID was absent and is recorded now; process it.
	CodeNew
	// CodeDuplicate (Mark, Claim): the ID is already recorded (committed);
	// skip it.
	CodeDuplicate
	// CodeConflict (Mark, Claim): the ID is recorded with a different
	// payload digest: a producer reused an ID, someone must look.
	CodeConflict
	// CodeSeen (Check): recorded and not expired (committed or leased).
	CodeSeen
	// CodeNotSeen (Check): absent or expired.
	CodeNotSeen
	// CodeAcquired (Claim): the lease is yours; Result.Lease names it.
	CodeAcquired
	// CodeInProgress (Claim): another caller holds a live lease (Record
	// says until when, without the tokens that prove it).
	CodeInProgress
	// CodeOK (Commit, Renew, Release, Forget): done.
	CodeOK
	// CodeLeaseLost (Commit, Renew, Release): the lease expired or a newer
	// claim fenced it; the work may have been done by someone else.
	CodeLeaseLost
)

// codeNames are the API's result names (api/dedup/v1/results.go).
var codeNames = [...]string{
	CodeUnknown:    "unknown",
	CodeNew:        dedupv1.ResultNew,
	CodeDuplicate:  dedupv1.ResultDuplicate,
	CodeConflict:   dedupv1.ResultConflict,
	CodeSeen:       dedupv1.ResultSeen,
	CodeNotSeen:    dedupv1.ResultNotSeen,
	CodeAcquired:   dedupv1.ResultAcquired,
	CodeInProgress: dedupv1.ResultInProgress,
	CodeOK:         dedupv1.ResultOK,
	CodeLeaseLost:  dedupv1.ResultLeaseLost,
}

// String returns the lower-case name, e.g. "not_seen".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// MarshalText encodes the lower-case name.
func (c Code) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses a lower-case name.
func (c *Code) UnmarshalText(b []byte) error {
	p, err := ParseCode(string(b))
	if err != nil {
		return err
	}
	*c = p
	return nil
}

// ParseCode parses a lower-case result name such as "duplicate".
func ParseCode(s string) (Code, error) {
	for i, n := range codeNames {
		if n == s && i != 0 {
			return Code(i), nil
		}
	}
	return CodeUnknown, fmt.Errorf("unknown result code %q", s)
}

// RecordState is the state of a recorded ID.
type RecordState uint8

const (
	StateUnknown RecordState = iota
	// StateCommitted: marked or committed; answers duplicate until expiry.
	StateCommitted
	// StateLeased: claimed; the lease runs until Record.Expires.
	StateLeased
)

// String returns "committed", "leased" or "unknown".
func (s RecordState) String() string {
	switch s {
	case StateCommitted:
		return "committed"
	case StateLeased:
		return "leased"
	}
	return "unknown"
}

// MarshalText encodes String().
func (s RecordState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Record describes a recorded ID as the store holds it.
type Record struct {
	State RecordState
	// FirstSeen is when the ID was first recorded (leader clock, UTC, ms).
	FirstSeen time.Time
	// Expires is when the record (or, for a lease, the lease) expires.
	Expires time.Time
	// RequestToken is the token of the request that recorded or claimed
	// it. Empty for a lease (StateLeased) in every answer but to its
	// holder (the claim that acquired it, a renewal): with FencingToken,
	// it proves the lease (Lease).
	RequestToken []byte
	// Digest is the payload digest given when recorded; nil if none.
	Digest []byte
	// FencingToken is the token of the latest claim of this ID; it only
	// grows. 0 if the ID was never claimed, and 0 for a lease in every
	// answer but to its holder, as RequestToken.
	FencingToken uint64
}

// Result is the outcome for one item, in request order.
type Result struct {
	// ID is the item's ID, as sent.
	ID   []byte
	Code Code
	// Record is the state after the operation; nil when the ID is absent
	// (NOT_SEEN, Forget) or the server sent none.
	Record *Record
	// LostReason says why, with CodeLeaseLost ("" otherwise, and
	// LostUnknown from a server that predates it).
	LostReason LostReason
}

// LostReason says why Commit, Renew or Release answered CodeLeaseLost. The
// cluster decides it when the request applies, from the ID's record.
type LostReason string

const (
	// LostNotClaimed: no record of the ID (never claimed, forgotten, or
	// expired long enough ago that it was dropped), or the lease was
	// released.
	LostNotClaimed LostReason = "not_claimed"
	// LostExpired: the lease (or the record its commit made) expired and
	// nothing replaced it: claim again.
	LostExpired LostReason = "expired"
	// LostTokenMismatch: the lease named is not the ID's: its record
	// carries another fencing token (a newer claim took it after yours
	// expired, or the token is not one granted for this ID) or another
	// claim's request token (the lease is someone else's).
	LostTokenMismatch LostReason = "token_mismatch"
	// LostAlreadyCommitted: the ID is committed — by this lease's own
	// commit (a Renew or Release after it), another holder's, or a Mark.
	LostAlreadyCommitted LostReason = "already_committed"
	// LostUnknown: the server did not say (it predates reasons).
	LostUnknown LostReason = "unknown"
)

func lostReasonOf(r dedupv1.LeaseResult_Reason) LostReason {
	switch r {
	case dedupv1.LeaseResult_NOT_CLAIMED:
		return LostNotClaimed
	case dedupv1.LeaseResult_EXPIRED:
		return LostExpired
	case dedupv1.LeaseResult_TOKEN_MISMATCH:
		return LostTokenMismatch
	case dedupv1.LeaseResult_ALREADY_COMMITTED:
		return LostAlreadyCommitted
	}
	return LostUnknown
}

// Item is one ID for Mark or Claim.
type Item struct {
	// ID is the message ID: opaque bytes, 1..max_id_bytes of the namespace
	// (512 by default).
	ID []byte
	// Digest is an optional payload digest (at most 64 bytes, e.g.
	// [Digest] of the body). An ID recorded with one digest and written
	// again with another answers CodeConflict.
	Digest []byte
	// RequestToken optionally replaces, for this item, the random token the
	// client makes per call (1..64 bytes). Set it to a token you keep
	// across process restarts (for example stored with the message) so a
	// Mark repeated after a crash still returns its first answer.
	RequestToken []byte
}

// Lease names a claim for Commit, Renew and Release: the ID, and the
// fencing token and request token of the record its Claim answered
// CodeAcquired with (Result.Lease gives it). Both tokens are required.
// The request token, which only the claimer knows (the client picks 16
// random bytes per Claim call unless Item.RequestToken sets one), proves
// the lease is yours: no answer to anyone else carries a live lease's, nor
// its fencing token, so nobody else can commit, renew or release it. The
// fencing token, which only grows, is the one to hand a downstream store
// that refuses writes carrying an older one.
type Lease struct {
	ID           []byte
	FencingToken uint64
	RequestToken []byte
}

// Lease returns the lease an acquired claim took (r.Code CodeAcquired,
// with its record), to pass to Commit, Renew or Release; false for any
// other result.
func (r Result) Lease() (Lease, bool) {
	if r.Code != CodeAcquired || r.Record == nil || r.Record.FencingToken == 0 || len(r.Record.RequestToken) == 0 {
		return Lease{}, false
	}
	return Lease{ID: r.ID, FencingToken: r.Record.FencingToken, RequestToken: r.Record.RequestToken}, true
}

// Consistency selects how Check reads.
type Consistency uint8

const (
	// Linearizable (the default): a Check that starts after a Mark was
	// acknowledged never answers not_seen for it.
	Linearizable Consistency = iota
	// Stale answers from the contacted node alone: fastest, but may miss the
	// last moments of replication.
	Stale
	// Bounded answers from the contacted node alone (a read replica in
	// your region, say) when it can show it misses no write acknowledged
	// more than the max staleness ago (WithMaxStaleness, or
	// CheckBounded's argument), else through a read index from the leader
	// like Linearizable. The node proves it from the leader timestamps in
	// the log and the cluster's assumed clock offset (--max-clock-offset),
	// never from its own clock alone.
	Bounded
)

// String returns "linearizable", "stale" or "bounded".
func (c Consistency) String() string {
	switch c {
	case Stale:
		return "stale"
	case Bounded:
		return "bounded"
	}
	return "linearizable"
}

// ParseConsistency parses "linearizable", "stale" or "bounded".
func ParseConsistency(s string) (Consistency, error) {
	switch s {
	case "linearizable", "":
		return Linearizable, nil
	case "stale":
		return Stale, nil
	case "bounded":
		return Bounded, nil
	}
	return Linearizable, fmt.Errorf("unknown consistency %q (want linearizable, stale or bounded)", s)
}

func (c Consistency) proto() dedupv1.Consistency {
	switch c {
	case Stale:
		return dedupv1.Consistency_CONSISTENCY_STALE
	case Bounded:
		return dedupv1.Consistency_CONSISTENCY_BOUNDED
	}
	return dedupv1.Consistency_CONSISTENCY_LINEARIZABLE
}

// ReadPath says how a node answered a Check.
type ReadPath uint8

const (
	// ReadPathUnknown: the node did not say (an older server).
	ReadPathUnknown ReadPath = iota
	// ReadLocal: from the contacted node's own state (Stale, or Bounded
	// with freshness proven).
	ReadLocal
	// ReadIndex: after a read index from the leader (Linearizable, or
	// Bounded falling back).
	ReadIndex
)

// String returns "local", "read_index" or "unknown".
func (p ReadPath) String() string {
	switch p {
	case ReadLocal:
		return "local"
	case ReadIndex:
		return "read_index"
	}
	return "unknown"
}

func readPathOf(p dedupv1.ReadPath) ReadPath {
	switch p {
	case dedupv1.ReadPath_READ_PATH_LOCAL:
		return ReadLocal
	case dedupv1.ReadPath_READ_PATH_READ_INDEX:
		return ReadIndex
	}
	return ReadPathUnknown
}

// ExpiryMode says whether a duplicate sighting extends a record's expiry.
type ExpiryMode uint8

const (
	// ExpiryDefault leaves the mode to the server (fixed on create, unchanged
	// on update).
	ExpiryDefault ExpiryMode = iota
	// ExpiryFixed keeps the first expiry; duplicates never extend it.
	ExpiryFixed
	// ExpirySliding lets a duplicate Mark extend expiry by the TTL.
	ExpirySliding
)

// String returns "fixed", "sliding" or "" for ExpiryDefault.
func (m ExpiryMode) String() string {
	switch m {
	case ExpiryFixed:
		return "fixed"
	case ExpirySliding:
		return "sliding"
	}
	return ""
}

// ParseExpiryMode parses "fixed" or "sliding".
func ParseExpiryMode(s string) (ExpiryMode, error) {
	switch s {
	case "fixed":
		return ExpiryFixed, nil
	case "sliding":
		return ExpirySliding, nil
	case "":
		return ExpiryDefault, nil
	}
	return ExpiryDefault, fmt.Errorf("unknown expiry mode %q (want fixed or sliding)", s)
}

// Namespace is an independent dedup space with its own limits. Zero
// durations and sizes mean "server default" on create and "unchanged" on
// update.
type Namespace struct {
	Name string
	// DefaultTTL applies to Mark and Commit calls that give no TTL.
	DefaultTTL time.Duration
	// MaxTTL bounds every TTL given in a call.
	MaxTTL time.Duration
	// MaxIDBytes bounds the length of every ID.
	MaxIDBytes int
	Mode       ExpiryMode
	// DefaultLease applies to Claim and Renew calls that give no lease.
	DefaultLease time.Duration
	// BucketWidth is the width of the expiry buckets (read-only; derived
	// from MaxTTL at creation).
	BucketWidth time.Duration
}

// Member is one node of the Raft configuration.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	GRPCAddr string `json:"grpc_addr"`
	// Suffrage is "voter", "nonvoter" (promoted once caught up) or "replica"
	// (a read replica: promoted only on request).
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
	// Region is the member's region as the cluster records it ("" if
	// none is known).
	Region string `json:"region,omitempty"`
	// Reachability is the member's liveness as the leader sees it from its
	// heartbeats. A follower asks the leader for it; ReachabilityUnknown
	// when no leader answered (or the server is older).
	Reachability Reachability `json:"reachability"`
	// UnreachableSince (Unreachable only): when the leader last heard from
	// the member, or began leading if it never did since.
	UnreachableSince time.Time `json:"unreachable_since,omitzero"`
	// LogLag is how many entries the member's Raft log was behind the
	// leader's as of its last answer (0: caught up, the leader, unknown).
	LogLag uint64 `json:"log_lag,omitempty"`
	// LastError (Unreachable only) is the leader's latest failed call to
	// it; "" when the calls hang instead (a frozen process, a cut link).
	LastError string `json:"last_error,omitempty"`
}

// Reachability is a member's liveness as the leader sees it.
type Reachability string

const (
	ReachabilityUnknown Reachability = "unknown"
	Reachable           Reachability = "reachable"
	// Unreachable: a call from the leader failed since the member last
	// answered, or it answered none for a whole heartbeat timeout.
	Unreachable Reachability = "unreachable"
)

func reachabilityOf(r dedupv1.Reachability) Reachability {
	switch r {
	case dedupv1.Reachability_REACHABILITY_REACHABLE:
		return Reachable
	case dedupv1.Reachability_REACHABILITY_UNREACHABLE:
		return Unreachable
	}
	return ReachabilityUnknown
}

// BloomStatus reports a node's Bloom filters.
type BloomStatus struct {
	Filters          uint64  `json:"filters"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	IDs              uint64  `json:"ids"`
	BitsPerID        float64 `json:"bits_per_id"`
	ConfiguredFPRate float64 `json:"configured_fp_rate"`
	// ObservedFPRate is measured from "maybe" lookups that found nothing.
	ObservedFPRate float64 `json:"observed_fp_rate"`
	MaybeLookups   uint64  `json:"maybe_lookups"`
	FalsePositives uint64  `json:"false_positives"`
	// Ready is false while the filters rebuild; reads then go to storage.
	Ready bool `json:"ready"`
}

// Status is one node's view of the cluster.
type Status struct {
	NodeID string `json:"node_id"`
	// ClusterID is the cluster's ID as the node applied it, "" if it has
	// not (or runs a version without cluster IDs).
	ClusterID string `json:"cluster_id"`
	// State is "leader", "follower", "candidate" or "shutdown".
	State             string      `json:"state"`
	LeaderID          string      `json:"leader_id"`
	LeaderGRPCAddr    string      `json:"leader_grpc_addr"`
	Term              uint64      `json:"term"`
	CommitIndex       uint64      `json:"commit_index"`
	AppliedIndex      uint64      `json:"applied_index"`
	LastSnapshotIndex uint64      `json:"last_snapshot_index"`
	Members           []Member    `json:"members"`
	IDsStored         uint64      `json:"ids_stored"`
	Bloom             BloomStatus `json:"bloom"`
	// LeaderTime is the leader's clock as last seen in the log (UTC, ms).
	LeaderTime time.Time `json:"leader_time"`
	Buckets    uint64    `json:"buckets"`
	// Healthy is what the node's health check answers; HealthReason says
	// why not (disk low, log store stalled, catching up, ...).
	Healthy      bool   `json:"healthy"`
	HealthReason string `json:"health_reason,omitempty"`
	// Disk is the node's data directory filesystem.
	Disk DiskStatus `json:"disk"`
	// LogStoreStalled: a Raft log write has run past the node's stall
	// limit; LogStoreMaxWrite is the longest write since it started.
	LogStoreStalled  bool          `json:"log_store_stalled"`
	LogStoreMaxWrite time.Duration `json:"log_store_max_write_ns"`
	// ReadReplica: the node is a read replica (a non-voter the leader
	// never promotes; its Member.Suffrage is "replica").
	ReadReplica bool `json:"read_replica"`
	// Region is the node's region (serve --region); PreferredLeaderRegions
	// the cluster setting as the node applied it.
	Region                 string   `json:"region,omitempty"`
	PreferredLeaderRegions []string `json:"preferred_leader_regions,omitempty"`
}

// DiskStatus is a node's data directory filesystem as it last measured it.
type DiskStatus struct {
	DataDir    string `json:"data_dir"`
	FreeBytes  uint64 `json:"free_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// Below MinFreeBytes the node refuses writes (WritesRefused); below
	// ReserveBytes it pauses applying the log (ApplyPaused).
	MinFreeBytes  uint64 `json:"min_free_bytes"`
	ReserveBytes  uint64 `json:"reserve_bytes"`
	WritesRefused bool   `json:"writes_refused"`
	ApplyPaused   bool   `json:"apply_paused"`
	// UsedBytes is what the data directory's files occupy on disk.
	UsedBytes uint64 `json:"used_bytes"`
}

// msOf converts a duration to whole milliseconds (0 stays 0: the default).
func msOf(d time.Duration) int64 { return d.Milliseconds() }

// durationMs converts a TTL or lease to the whole milliseconds the store
// counts in. A negative value, or one that is not a whole number of
// milliseconds (500µs, 1.9ms), is refused rather than rounded: rounding
// 500µs down would give 0, "the namespace default", a 24 h record.
func durationMs(op, field string, d time.Duration) (int64, error) {
	if v := durationViolation(d, "0 (the namespace default) or a positive whole number of milliseconds"); v != "" {
		return 0, invalidArgument(op, field, 0, v)
	}
	return d.Milliseconds(), nil
}

// durationViolation says, in a node's style of words, what is wrong with d
// as a duration the store keeps in whole milliseconds: "" when it is 0 or
// a positive whole number of them. want describes what is accepted.
func durationViolation(d time.Duration, want string) string {
	switch {
	case d < 0:
		return fmt.Sprintf("%v is negative; want %s", d, want)
	case d%time.Millisecond != 0:
		return fmt.Sprintf("%v is not a whole number of milliseconds; want %s", d, want)
	}
	return ""
}

// validDurations checks a namespace's durations as durationMs does; zero
// says what 0 means in the call ("the default", "unchanged").
func (n Namespace) validDurations(op, zero string) error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"default_ttl", n.DefaultTTL}, {"max_ttl", n.MaxTTL}, {"default_lease", n.DefaultLease}} {
		if v := durationViolation(f.d, "0 ("+zero+") or a positive whole number of milliseconds"); v != "" {
			return invalidArgument(op, f.name, 0, v)
		}
	}
	return nil
}

func timeOf(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// recordValue is the Record r describes; false when r carries none.
func recordValue(r *dedupv1.Record) (Record, bool) {
	if r == nil {
		return Record{}, false
	}
	var st RecordState
	switch r.GetState() {
	case dedupv1.RecordState_RECORD_STATE_COMMITTED:
		st = StateCommitted
	case dedupv1.RecordState_RECORD_STATE_LEASED:
		st = StateLeased
	}
	if st == StateUnknown && r.GetFirstSeenUnixMs() == 0 && r.GetExpiresUnixMs() == 0 && r.GetFencingToken() == 0 {
		return Record{}, false
	}
	return Record{
		State:        st,
		FirstSeen:    timeOf(r.GetFirstSeenUnixMs()),
		Expires:      timeOf(r.GetExpiresUnixMs()),
		RequestToken: r.GetRequestToken(),
		Digest:       r.GetDigest(),
		FencingToken: r.GetFencingToken(),
	}, true
}

func checkCode(c dedupv1.CheckResult_Code) Code {
	switch c {
	case dedupv1.CheckResult_SEEN:
		return CodeSeen
	case dedupv1.CheckResult_NOT_SEEN:
		return CodeNotSeen
	}
	return CodeUnknown
}

func markCode(c dedupv1.MarkResult_Code) Code {
	switch c {
	case dedupv1.MarkResult_NEW:
		return CodeNew
	case dedupv1.MarkResult_DUPLICATE:
		return CodeDuplicate
	case dedupv1.MarkResult_CONFLICT:
		return CodeConflict
	}
	return CodeUnknown
}

func claimCode(c dedupv1.ClaimResult_Code) Code {
	switch c {
	case dedupv1.ClaimResult_ACQUIRED:
		return CodeAcquired
	case dedupv1.ClaimResult_DUPLICATE:
		return CodeDuplicate
	case dedupv1.ClaimResult_IN_PROGRESS:
		return CodeInProgress
	case dedupv1.ClaimResult_CONFLICT:
		return CodeConflict
	}
	return CodeUnknown
}

func leaseCode(c dedupv1.LeaseResult_Code) Code {
	switch c {
	case dedupv1.LeaseResult_OK:
		return CodeOK
	case dedupv1.LeaseResult_LEASE_LOST:
		return CodeLeaseLost
	}
	return CodeUnknown
}

func namespaceOf(n *dedupv1.Namespace) Namespace {
	var mode ExpiryMode
	switch n.GetExpiryMode() {
	case dedupv1.ExpiryMode_EXPIRY_MODE_FIXED:
		mode = ExpiryFixed
	case dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING:
		mode = ExpirySliding
	}
	return Namespace{
		Name:         n.GetName(),
		DefaultTTL:   time.Duration(n.GetDefaultTtlMs()) * time.Millisecond,
		MaxTTL:       time.Duration(n.GetMaxTtlMs()) * time.Millisecond,
		MaxIDBytes:   int(n.GetMaxIdBytes()),
		Mode:         mode,
		DefaultLease: time.Duration(n.GetDefaultLeaseMs()) * time.Millisecond,
		BucketWidth:  time.Duration(n.GetBucketWidthMs()) * time.Millisecond,
	}
}

func (n Namespace) proto() *dedupv1.Namespace {
	var mode dedupv1.ExpiryMode
	switch n.Mode {
	case ExpiryFixed:
		mode = dedupv1.ExpiryMode_EXPIRY_MODE_FIXED
	case ExpirySliding:
		mode = dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING
	}
	return &dedupv1.Namespace{
		Name:           n.Name,
		DefaultTtlMs:   msOf(n.DefaultTTL),
		MaxTtlMs:       msOf(n.MaxTTL),
		MaxIdBytes:     uint32(max(n.MaxIDBytes, 0)),
		ExpiryMode:     mode,
		DefaultLeaseMs: msOf(n.DefaultLease),
	}
}

func statusOf(s *dedupv1.StatusResponse) Status {
	out := Status{
		NodeID:                 s.GetNodeId(),
		ClusterID:              s.GetClusterId(),
		ReadReplica:            s.GetReadReplica(),
		State:                  s.GetState(),
		LeaderID:               s.GetLeaderId(),
		LeaderGRPCAddr:         s.GetLeaderGrpcAddr(),
		Term:                   s.GetTerm(),
		CommitIndex:            s.GetCommitIndex(),
		AppliedIndex:           s.GetAppliedIndex(),
		LastSnapshotIndex:      s.GetLastSnapshotIndex(),
		Members:                make([]Member, 0, len(s.GetMembers())),
		IDsStored:              s.GetIdsStored(),
		LeaderTime:             timeOf(s.GetLeaderTimeUnixMs()),
		Buckets:                s.GetBuckets(),
		Healthy:                s.GetHealthy(),
		HealthReason:           s.GetHealthReason(),
		LogStoreStalled:        s.GetLogStoreStalled(),
		LogStoreMaxWrite:       time.Duration(s.GetLogStoreMaxWriteMs()) * time.Millisecond,
		Region:                 s.GetRegion(),
		PreferredLeaderRegions: s.GetPreferredLeaderRegions(),
	}
	if d := s.GetDisk(); d != nil {
		out.Disk = DiskStatus{DataDir: d.GetDataDir(), FreeBytes: d.GetFreeBytes(), TotalBytes: d.GetTotalBytes(),
			MinFreeBytes: d.GetMinFreeBytes(), ReserveBytes: d.GetReserveBytes(), WritesRefused: d.GetWritesRefused(),
			ApplyPaused: d.GetApplyPaused(), UsedBytes: d.GetUsedBytes()}
	}
	for _, m := range s.GetMembers() {
		mm := Member{
			ID: m.GetId(), RaftAddr: m.GetRaftAddr(), GRPCAddr: m.GetGrpcAddr(),
			Suffrage: m.GetSuffrage(), Leader: m.GetLeader(), Region: m.GetRegion(),
			Reachability: reachabilityOf(m.GetReachability()), LogLag: m.GetLogLag(), LastError: m.GetLastError(),
		}
		if ms := m.GetUnreachableSinceUnixMs(); ms != 0 && mm.Reachability == Unreachable {
			mm.UnreachableSince = time.UnixMilli(ms).UTC()
		}
		out.Members = append(out.Members, mm)
	}
	if b := s.GetBloom(); b != nil {
		out.Bloom = BloomStatus{
			Filters: b.GetFilters(), MemoryBytes: b.GetMemoryBytes(), IDs: b.GetIds(),
			BitsPerID: b.GetBitsPerId(), ConfiguredFPRate: b.GetConfiguredFpRate(),
			ObservedFPRate: b.GetObservedFpRate(), MaybeLookups: b.GetMaybeLookups(),
			FalsePositives: b.GetFalsePositives(), Ready: b.GetReady(),
		}
	}
	return out
}
