// Package history records what the clients of a chaos run asked and what
// they were told: every invocation and completion of a dedup operation,
// every fault the nemesis injected, and the final per-node reads taken after
// the cluster healed. The checker (package chaos/check) judges a History
// against the guarantees of the top-level README (section Guarantees); a
// History round-trips through JSON so that a failed run can be re-checked
// offline.
//
// Times are wall-clock Unix nanoseconds taken from one process's monotonic
// clock (see Clock), so they order correctly within a run and compare with
// the millisecond timestamps the Raft leader puts in records (same host).
package history

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Kind names an operation.
type Kind string

// Operation kinds. Commit and Release name the lease by Op.Fence.
const (
	Mark    Kind = "mark"
	Claim   Kind = "claim"
	Commit  Kind = "commit"
	Release Kind = "release"
	Check   Kind = "check"
)

// Outcome says what a client learned about an operation.
type Outcome string

const (
	// OK: the server answered; Op.Result holds the answer.
	OK Outcome = "ok"
	// Fail: the operation definitely had no effect (rejected before it
	// could be proposed, e.g. InvalidArgument), or a read that failed.
	Fail Outcome = "fail"
	// Info: unknown. A write that timed out or failed with Unavailable may
	// or may not have been applied (DESIGN: "outcome unknown").
	Info Outcome = "info"
)

// Result codes as the CLI prints them (the API's names, which
// client.Code.String returns).
const (
	New        = dedupv1.ResultNew
	Duplicate  = dedupv1.ResultDuplicate
	Conflict   = dedupv1.ResultConflict
	Seen       = dedupv1.ResultSeen
	NotSeen    = dedupv1.ResultNotSeen
	Acquired   = dedupv1.ResultAcquired
	InProgress = dedupv1.ResultInProgress
	ResultOK   = dedupv1.ResultOK
	LeaseLost  = dedupv1.ResultLeaseLost
)

// Consistency of a Check.
const (
	Linearizable = "linearizable"
	Stale        = "stale"
	// Bounded checks carry MaxStalenessMs: they must see every write
	// acknowledged more than that long before they started.
	Bounded = "bounded"
)

// Record is the stored state of an ID as a server returned it.
type Record struct {
	State       string `json:"state"` // committed, leased
	FirstSeenMs int64  `json:"first_seen_ms"`
	ExpiresMs   int64  `json:"expires_ms"`
	Token       string `json:"token,omitempty"` // hex request token that recorded it
	Fence       uint64 `json:"fence,omitempty"`
}

// Op is one logical client operation on one ID: its invocation and, once
// known, its completion. Retries inside one logical operation (same request
// token) are not separate Ops; a client that gives up and later re-issues
// the same token records a new Op with that token.
type Op struct {
	Seq    int64  `json:"seq"`
	Client int    `json:"client"`
	Kind   Kind   `json:"op"`
	Key    string `json:"key"`
	// Token is the hex request token (Mark, Claim).
	Token string `json:"token,omitempty"`
	// Fence is the fencing token given (Commit, Release).
	Fence uint64 `json:"fence,omitempty"`
	// Consistency of a Check: linearizable, stale or bounded.
	Consistency string `json:"consistency,omitempty"`
	// MaxStalenessMs of a bounded Check.
	MaxStalenessMs int64 `json:"max_staleness_ms,omitempty"`
	// Node is the node the operation was first sent to.
	Node     string `json:"node,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	// Start and End are wall-clock Unix nanoseconds (see Clock). End is 0
	// while the operation is pending.
	Start   int64   `json:"start"`
	End     int64   `json:"end"`
	Outcome Outcome `json:"outcome"`
	// Uncertain marks an OK operation an earlier attempt of which failed
	// in a way that may have applied it: the answer is that of the last
	// attempt. It matters for Release, whose retry answers lease_lost when
	// the first attempt released the lease and someone claimed it since.
	Uncertain bool    `json:"uncertain,omitempty"`
	Result    string  `json:"result,omitempty"`
	Error     string  `json:"error,omitempty"`
	Record    *Record `json:"record,omitempty"`
}

// Acked reports whether the server answered the operation.
func (o *Op) Acked() bool { return o.Outcome == OK }

// Fault is one injected fault (or heal) and the nodes it hit.
type Fault struct {
	Seq     int64    `json:"seq"`
	Kind    string   `json:"kind"`
	Targets []string `json:"targets,omitempty"`
	Start   int64    `json:"start"`
	End     int64    `json:"end"` // when it was healed; 0 if never
	Detail  string   `json:"detail,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// FinalRead is one stale read of one ID from one node after the cluster
// healed and caught up.
type FinalRead struct {
	Node   string  `json:"node"`
	Key    string  `json:"key"`
	At     int64   `json:"at"` // wall-clock Unix nanoseconds
	Result string  `json:"result,omitempty"`
	Record *Record `json:"record,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// NodeDigest is one node's state digest (dedup.v1 Ops.Digest), taken after
// the final reads in a round that found every node at the same applied
// index (or the last round tried).
type NodeDigest struct {
	Node         string `json:"node"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	Records      uint64 `json:"records,omitempty"`
	Digest       string `json:"digest,omitempty"` // SHA-256, hex
	At           int64  `json:"at"`               // wall-clock Unix nanoseconds
	Error        string `json:"error,omitempty"`
}

// Meta describes the run that produced a history.
type Meta struct {
	Mode     string   `json:"mode,omitempty"`
	Nodes    []string `json:"nodes,omitempty"`
	Clients  int      `json:"clients,omitempty"`
	Start    int64    `json:"start,omitempty"`
	End      int64    `json:"end,omitempty"`
	TTLMs    int64    `json:"ttl_ms,omitempty"`
	LeaseMs  int64    `json:"lease_ms,omitempty"`
	Seed     int64    `json:"seed,omitempty"`
	Note     string   `json:"note,omitempty"`
	Unsafe   []string `json:"unsafe,omitempty"` // server knobs that break guarantees on purpose
	Finished bool     `json:"finished"`         // final reads were taken
	// Replicas are the read replicas among Nodes; Regions maps a node to
	// its region (runs with --replicas / --regions).
	Replicas []string          `json:"replicas,omitempty"`
	Regions  map[string]string `json:"regions,omitempty"`
}

// History is everything a chaos run recorded.
type History struct {
	Meta   Meta        `json:"meta"`
	Ops    []Op        `json:"ops"`
	Faults []Fault     `json:"faults"`
	Final  []FinalRead `json:"final"`
	// Digests are the nodes' state digests at the end (nil in histories
	// written before digests were taken: the checker then skips them).
	Digests []NodeDigest `json:"digests,omitempty"`
}

// Write encodes h as JSON, one op, fault or read per line for diffing.
func (h *History) Write(w io.Writer) error {
	var err error
	put := func(s string) {
		if err == nil {
			_, err = io.WriteString(w, s)
		}
	}
	enc := func(v any) string {
		b, e := json.Marshal(v)
		if e != nil && err == nil {
			err = e
		}
		return string(b)
	}
	put(`{"meta":` + enc(h.Meta) + ",\n")
	list := func(name string, n int, item func(int) any, last bool) {
		put(`"` + name + `":[`)
		for i := 0; i < n; i++ {
			if i > 0 {
				put(",")
			}
			put("\n" + enc(item(i)))
		}
		put("]")
		if !last {
			put(",\n")
		}
	}
	list("ops", len(h.Ops), func(i int) any { return &h.Ops[i] }, false)
	list("faults", len(h.Faults), func(i int) any { return &h.Faults[i] }, false)
	if h.Digests != nil {
		list("digests", len(h.Digests), func(i int) any { return &h.Digests[i] }, false)
	}
	list("final", len(h.Final), func(i int) any { return &h.Final[i] }, true)
	put("}\n")
	return err
}

// WriteFile writes h to path (created or truncated).
func (h *History) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	if err := h.Write(f); err != nil {
		f.Close()
		return fmt.Errorf("write history %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write history %s: %w", path, err)
	}
	return nil
}

// Read decodes a history written by Write (or any JSON of its shape).
func Read(r io.Reader) (*History, error) {
	var h History
	if err := json.NewDecoder(r).Decode(&h); err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	return &h, nil
}

// ReadFile reads a history from path.
func ReadFile(path string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	defer f.Close()
	h, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// Token formats a request token as the history stores it.
func Token(b []byte) string { return hex.EncodeToString(b) }

// Clock gives wall-clock Unix nanoseconds that never go backwards within a
// process: the wall time at creation plus the monotonic time elapsed.
type Clock struct{ base time.Time }

// NewClock starts a clock at the current wall time.
func NewClock() Clock { return Clock{base: time.Now()} }

// Now returns Unix nanoseconds.
func (c Clock) Now() int64 { return c.base.UnixNano() + int64(time.Since(c.base)) }

// Recorder collects a history from many goroutines.
type Recorder struct {
	clock Clock

	mu     sync.Mutex
	seq    int64
	ops    []*Op
	faults []*Fault
	final  []FinalRead
	digest []NodeDigest
	meta   Meta
}

// NewRecorder returns an empty recorder using clock.
func NewRecorder(clock Clock, meta Meta) *Recorder {
	return &Recorder{clock: clock, meta: meta}
}

// Clock returns the recorder's clock.
func (r *Recorder) Clock() Clock { return r.clock }

// Invoke records the start of op (Start and Seq are set here) and returns
// it; the caller fills the completion fields and calls Complete.
func (r *Recorder) Invoke(op Op) *Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	op.Seq = r.seq
	op.Start = r.clock.Now()
	op.End = 0
	p := &op
	r.ops = append(r.ops, p)
	return p
}

// Complete records the end of op: its outcome and, for OK, its result.
func (r *Recorder) Complete(op *Op, outcome Outcome, result string, rec *Record, errText string) {
	end := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	op.End = end
	op.Outcome = outcome
	op.Result = result
	op.Record = rec
	op.Error = errText
}

// FaultStart records the start of a fault and returns it for FaultEnd.
func (r *Recorder) FaultStart(kind string, targets []string, detail string) *Fault {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	f := &Fault{Seq: r.seq, Kind: kind, Targets: append([]string(nil), targets...), Detail: detail, Start: r.clock.Now()}
	r.faults = append(r.faults, f)
	return f
}

// FaultEnd records that f was healed, with err if injecting or healing it
// failed.
func (r *Recorder) FaultEnd(f *Fault, err error) {
	end := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	f.End = end
	if err != nil {
		f.Error = err.Error()
	}
}

// AddFinal records final reads.
func (r *Recorder) AddFinal(reads ...FinalRead) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.final = append(r.final, reads...)
}

// SetDigests records the nodes' final state digests (replacing any
// recorded before).
func (r *Recorder) SetDigests(ds ...NodeDigest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.digest = append([]NodeDigest{}, ds...)
}

// SetMeta updates the run description.
func (r *Recorder) SetMeta(fn func(*Meta)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.meta)
}

// History returns a copy of what was recorded. Operations still pending are
// reported with outcome Info and no end.
func (r *Recorder) History() *History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := &History{Meta: r.meta}
	h.Ops = make([]Op, 0, len(r.ops))
	for _, p := range r.ops {
		op := *p
		if op.End == 0 {
			op.Outcome = Info
			if op.Error == "" {
				op.Error = "pending at end of run"
			}
		}
		h.Ops = append(h.Ops, op)
	}
	for _, f := range r.faults {
		h.Faults = append(h.Faults, *f)
	}
	h.Final = append(h.Final, r.final...)
	if r.digest != nil {
		h.Digests = append([]NodeDigest{}, r.digest...)
	}
	sort.Slice(h.Ops, func(i, j int) bool { return h.Ops[i].Seq < h.Ops[j].Seq })
	return h
}
