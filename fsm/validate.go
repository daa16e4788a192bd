package fsm

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Limits for Validate.
type Limits struct {
	// MaxBatch is the most items one op may carry (default 10 000).
	MaxBatch int
}

// DefaultMaxBatch is the default Limits.MaxBatch.
const DefaultMaxBatch = 10_000

// InvalidError names the offending field of a rejected request. It wraps
// ErrInvalidArgument.
type InvalidError struct {
	Field  string // e.g. "items[3].id"
	Reason string
	// MaxMs is the upper limit a TTL or lease (ttl_ms, lease_ms) broke,
	// and Namespace the namespace whose max TTL it is ("" for the largest
	// any namespace can have); zero for other fields.
	MaxMs     int64
	Namespace string
	// Item is the offending item's position in the request counting from 1
	// (Field "items[2].id" has Item 3), 0 when the error is not about one
	// item.
	Item int
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }
func (e *InvalidError) Unwrap() error { return ErrInvalidArgument }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// invalidItem is invalid for the field (e.g. "id") of item i (from 0).
func invalidItem(i int, field, format string, args ...any) error {
	return &InvalidError{Field: fmt.Sprintf("items[%d].%s", i, field), Reason: fmt.Sprintf(format, args...), Item: i + 1}
}

// ValidateNodeID checks a node (Raft server) ID, at every edge where one
// enters: serve, join, restore and the cluster's Join. A valid ID is 1 to
// MaxNodeIDBytes bytes of UTF-8 without control characters and without
// spaces at either end. Longer IDs are what the FSM cannot record (the
// decoder refuses the command: a node added to Raft under one could never
// be given an address or be retired); gRPC cannot carry invalid UTF-8 in a
// string; and the data dir's node-id file is read back trimmed, so an ID
// with spaces at an end would not restart. The error is an *InvalidError
// for field "node_id".
func ValidateNodeID(id string) error {
	switch {
	case id == "":
		return invalid("node_id", "required")
	case len(id) > MaxNodeIDBytes:
		return invalid("node_id", "%.24q... is %d bytes, longer than the %d bytes a node ID may have", id, len(id), MaxNodeIDBytes)
	case !utf8.ValidString(id):
		return invalid("node_id", "%q is not valid UTF-8", id)
	}
	for _, c := range id {
		if unicode.IsControl(c) {
			return invalid("node_id", "%q contains a control character", id)
		}
	}
	if r, _ := utf8.DecodeRuneInString(id); unicode.IsSpace(r) {
		return invalid("node_id", "%q starts with a space", id)
	}
	if r, _ := utf8.DecodeLastRuneInString(id); unicode.IsSpace(r) {
		return invalid("node_id", "%q ends with a space", id)
	}
	return nil
}

// ValidateNamespaceName checks a namespace name: 1..128 characters of
// [A-Za-z0-9._-], starting with a letter or digit. Every write and check
// validates its namespace, so this is a loop over bytes: the regexp it
// replaces took 0.6 % of a node's CPU at 50 callers × 1 ID.
func ValidateNamespaceName(name string) error {
	if !validNamespaceName(name) {
		return invalid("namespace", "%q is not a valid namespace name (1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit)", name)
	}
	return nil
}

func validNamespaceName(name string) bool {
	if len(name) == 0 || len(name) > 128 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Validate checks a client op against its namespace and limits before it is
// proposed. It returns an *InvalidError naming the first offending field, so
// nothing of an invalid request reaches the log. Namespace ops are checked
// with ValidateNamespaceConfig instead.
func Validate(op *Op, ns *NamespaceConfig, lim Limits) error {
	if lim.MaxBatch <= 0 {
		lim.MaxBatch = DefaultMaxBatch
	}
	switch op.Kind {
	case OpMark, OpClaim, OpCommit, OpRenew, OpRelease, OpForget:
	default:
		return invalid("kind", "op %s is not a client data operation", op.Kind)
	}
	if len(op.Items) == 0 {
		return invalid("items", "at least one item is required")
	}
	if len(op.Items) > lim.MaxBatch {
		return invalid("items", "%d items exceed the maximum batch of %d", len(op.Items), lim.MaxBatch)
	}
	switch op.Kind {
	case OpMark, OpCommit:
		if op.DurationMs < 0 || op.DurationMs > ns.MaxTTLMs {
			e := invalid("ttl_ms", "%d ms is outside 0 (namespace default) .. %d ms (%s)", op.DurationMs, ns.MaxTTLMs, maxTTLOf(ns)).(*InvalidError)
			e.MaxMs, e.Namespace = ns.MaxTTLMs, ns.Name
			return e
		}
	case OpClaim, OpRenew:
		if op.DurationMs < 0 || op.DurationMs > ns.MaxTTLMs {
			e := invalid("lease_ms", "%d ms is outside 0 (namespace default) .. %d ms (%s)", op.DurationMs, ns.MaxTTLMs, maxTTLOf(ns)).(*InvalidError)
			e.MaxMs, e.Namespace = ns.MaxTTLMs, ns.Name
			return e
		}
	default:
		if op.DurationMs != 0 {
			return invalid("duration", "must be 0 for %s", op.Kind)
		}
	}
	for i := range op.Items {
		it := &op.Items[i]
		if len(it.ID) == 0 {
			return invalidItem(i, "id", "empty message ID")
		}
		if len(it.ID) > ns.MaxIDBytes {
			if ns.Name == "" {
				return invalidItem(i, "id", "%d bytes exceed %d, the most any namespace allows", len(it.ID), ns.MaxIDBytes)
			}
			return invalidItem(i, "id", "%d bytes exceed the namespace %q limit of %d", len(it.ID), ns.Name, ns.MaxIDBytes)
		}
		if len(it.Digest) > MaxDigestBytes {
			return invalidItem(i, "digest", "%d bytes exceed %d", len(it.Digest), MaxDigestBytes)
		}
		if len(it.Token) > MaxTokenBytes {
			return invalidItem(i, "request_token", "%d bytes exceed %d", len(it.Token), MaxTokenBytes)
		}
		switch op.Kind {
		case OpCommit, OpRenew, OpRelease:
			if it.Fence == 0 {
				return invalidItem(i, "fencing_token", "required (the token Claim returned)")
			}
		}
	}
	return nil
}

// maxTTLOf names the limit a TTL or lease broke. A config without a name
// stands for the widest limits any namespace can have (checks made before
// the namespace is known).
func maxTTLOf(ns *NamespaceConfig) string {
	if ns.Name == "" {
		return "the largest max TTL a namespace can have"
	}
	return fmt.Sprintf("max TTL of namespace %q", ns.Name)
}

// ValidateNamespaceConfig checks a full namespace config (after defaults are
// filled in).
func ValidateNamespaceConfig(ns *NamespaceConfig) error {
	if err := ValidateNamespaceName(ns.Name); err != nil {
		return err
	}
	if ns.MaxTTLMs < 1 || ns.MaxTTLMs > MaxTTLLimitMs {
		return invalid("max_ttl_ms", "%d ms is outside 1 .. %d ms (366 days)", ns.MaxTTLMs, MaxTTLLimitMs)
	}
	if ns.DefaultTTLMs < 1 || ns.DefaultTTLMs > ns.MaxTTLMs {
		return invalid("default_ttl_ms", "%d ms is outside 1 .. max_ttl_ms (%d ms)", ns.DefaultTTLMs, ns.MaxTTLMs)
	}
	if ns.DefaultLeaseMs < 1 || ns.DefaultLeaseMs > ns.MaxTTLMs {
		return invalid("default_lease_ms", "%d ms is outside 1 .. max_ttl_ms (%d ms)", ns.DefaultLeaseMs, ns.MaxTTLMs)
	}
	if ns.MaxIDBytes < 1 || ns.MaxIDBytes > MaxIDBytesLimit {
		return invalid("max_id_bytes", "%d is outside 1 .. %d", ns.MaxIDBytes, MaxIDBytesLimit)
	}
	if ns.Mode != ExpiryFixed && ns.Mode != ExpirySliding {
		return invalid("expiry_mode", "%d is neither fixed (1) nor sliding (2)", ns.Mode)
	}
	if ns.BucketWidthMs < 1 || ns.BucketWidthMs > maxBucketWidthMs {
		return invalid("bucket_width_ms", "%d ms is outside 1 .. %d ms", ns.BucketWidthMs, maxBucketWidthMs)
	}
	return nil
}

// FillNamespaceDefaults returns ns with zero fields taken from the default
// namespace settings and a bucket width derived from the max TTL.
func FillNamespaceDefaults(ns NamespaceConfig) NamespaceConfig {
	d := DefaultNamespaceConfig(ns.Name)
	if ns.MaxTTLMs == 0 {
		ns.MaxTTLMs = max(d.MaxTTLMs, ns.DefaultTTLMs)
	}
	if ns.DefaultTTLMs == 0 {
		ns.DefaultTTLMs = min(d.DefaultTTLMs, ns.MaxTTLMs)
	}
	if ns.MaxIDBytes == 0 {
		ns.MaxIDBytes = d.MaxIDBytes
	}
	if ns.Mode == 0 {
		ns.Mode = d.Mode
	}
	if ns.DefaultLeaseMs == 0 {
		ns.DefaultLeaseMs = min(d.DefaultLeaseMs, ns.MaxTTLMs)
	}
	if ns.BucketWidthMs == 0 {
		ns.BucketWidthMs = BucketWidthFor(ns.MaxTTLMs)
	}
	return ns
}

// MergeNamespaceUpdate applies the non-zero fields of upd to cur. The
// namespace ID and bucket width never change.
func MergeNamespaceUpdate(cur, upd NamespaceConfig) NamespaceConfig {
	if upd.DefaultTTLMs != 0 {
		cur.DefaultTTLMs = upd.DefaultTTLMs
	}
	if upd.MaxTTLMs != 0 {
		cur.MaxTTLMs = upd.MaxTTLMs
	}
	if upd.MaxIDBytes != 0 {
		cur.MaxIDBytes = upd.MaxIDBytes
	}
	if upd.Mode != 0 {
		cur.Mode = upd.Mode
	}
	if upd.DefaultLeaseMs != 0 {
		cur.DefaultLeaseMs = upd.DefaultLeaseMs
	}
	return cur
}

func equalDigest(a, b []byte) bool { return len(a) == 0 || len(b) == 0 || bytes.Equal(a, b) }
