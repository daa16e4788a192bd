package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Kinds of failure. Every error a call returns is an *Error whose Kind is
// one of these (or nil for an error the client cannot classify); match them
// with errors.Is. They are decoded from the gRPC status details the node
// sends (dedupv1.ErrorDomain) and from what the client's own transport saw
// (the dial and TLS handshake errors), never from an error's text.
var (
	// ErrNotLeader: the node asked is not the leader and knows of none
	// (Error.LeaderAddr names one when it does). Nothing was written.
	ErrNotLeader = errors.New("no leader reachable")
	// ErrUnavailable: the cluster could not serve the call (no quorum, node
	// shutting down, busy or lagging, connection lost on a read). For a
	// write, nothing was written; see ErrOutcomeUnknown for the other case.
	ErrUnavailable = errors.New("cluster unavailable")
	// ErrOutcomeUnknown: a write may or may not have been applied (the
	// leader was lost, or the connection broke, while it was in flight). A
	// retry with the same request token returns the original answer.
	ErrOutcomeUnknown = errors.New("outcome unknown; retry with the same request token")
	// ErrRefused: nothing accepts connections at the address (or its name
	// does not resolve). Nothing was sent.
	ErrRefused = errors.New("connection refused")
	// ErrTLSMismatch: TLS settings of the client and the node disagree
	// (plaintext against TLS, an unknown CA, a missing or refused client
	// certificate). Waiting does not heal it.
	ErrTLSMismatch = errors.New("TLS mismatch")
	// ErrNotGRPC: the address answers but is not a dedupnode gRPC port (a
	// node's Raft port, an HTTP port).
	ErrNotGRPC = errors.New("not a dedupnode gRPC port")
	// ErrNamespaceNotFound: the namespace (Error.Namespace) does not exist.
	ErrNamespaceNotFound = errors.New("namespace not found")
	// ErrNamespaceExists: the namespace (Error.Namespace) already exists.
	ErrNamespaceExists = errors.New("namespace already exists")
	// ErrNodeNotFound: no member has the node ID.
	ErrNodeNotFound = errors.New("node not found")
	// ErrNotCaughtUp: Promote refused a node the leader cannot reach or
	// that has not caught up (Error.Message says which and why); nothing
	// changed. ForcePromote skips the check.
	ErrNotCaughtUp = errors.New("node unreachable or not caught up")
	// ErrNodeRemoved: the node asked was removed from the cluster and its
	// ID is retired (it runs from a removed member's data dir); nothing was
	// done and waiting does not heal it (FAILED_PRECONDITION, reason
	// NODE_REMOVED; Error.Message names the node and what the operator
	// does: wipe its data dir and join it with a new --node-id). Never
	// retried on that node: a client that knows other nodes (not pinned)
	// moves on to them, and returns it only when it has no other.
	ErrNodeRemoved = errors.New("node removed from the cluster")
	// ErrInvalidArgument: the request was rejected before anything was
	// applied; Error.Field names the field.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrTooLarge: the request exceeds a limit (ResourceExhausted: the
	// batch size, the message size or one Raft entry, --max-entry-bytes);
	// nothing was applied. Split it.
	ErrTooLarge = errors.New("request too large")
	// ErrDiskFull: the leader's data directory has less free space than its
	// --min-free-disk, so it refuses writes (gRPC ResourceExhausted with
	// ErrorInfo reason DISK_FULL; Error.Message names the path and the
	// free bytes). Nothing was written; reads still work, and
	// writes are accepted again once space is freed.
	ErrDiskFull = errors.New("leader's disk is low on space; writes refused")
	// ErrUnauthenticated: the cluster requires a token and got none, or an
	// unknown one.
	ErrUnauthenticated = errors.New("not authenticated")
	// ErrPermissionDenied: the token lacks the right for the call.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnsupported: the node does not implement the call (Unimplemented).
	ErrUnsupported = errors.New("call not supported by the node")
)

// Error is what a failed call returns. Kind classifies it (errors.Is(err,
// client.ErrOutcomeUnknown) and so on); the other fields say where and what.
// It wraps the last attempt's gRPC status error, so status.Code(err) works,
// and the caller's context error when the context ended the call.
type Error struct {
	Op       string // "mark", "create namespace", ...
	Addr     string // node of the last attempt
	Attempts int
	Kind     error // one of the Err* kinds, nil when unclassified
	Code     codes.Code
	Reason   string // the node's ErrorInfo reason, "" if none
	// Message is what happened in the node's words, without the advice its
	// status message appends (or the transport's cause).
	Message string
	// Field is the offending field of an invalid request ("items[2].id"),
	// and Violation what is wrong with it, in the node's words ("empty
	// message ID").
	Field     string
	Violation string
	// Item is the position, counting from 1, of the request item an
	// invalid request is about (items[Item-1], the IDs' order in the call):
	// Field "items[2].id" has Item 3. 0 when it is about no single item.
	Item int
	// Namespace is the namespace the error is about, when it names one.
	Namespace string
	// MaxMs is the limit a TTL or lease out of range broke, 0 if none.
	MaxMs int64
	// LeaderAddr is the leader a NOT_LEADER node named, "" if none.
	LeaderAddr string
	// LastLeader is the gRPC address of the node that last served this
	// client as leader, "" if none did.
	LastLeader string
	// Cause is the typed transport error behind a TLS, refused or not-gRPC
	// error (a *net.OpError, an x509 or tls error), nil otherwise.
	Cause error

	err    error // the last attempt's error (a gRPC status error)
	ctxErr error // the caller's context error, if it ended the call
}

func (e *Error) Error() string {
	s := "dedupnode " + e.Op
	if e.Addr != "" {
		s += " via " + e.Addr
	}
	switch {
	case e.Attempts > 1 && e.ctxErr != nil:
		s += fmt.Sprintf(" (attempt %d, then %v)", e.Attempts, e.ctxErr)
	case e.Attempts > 1:
		s += fmt.Sprintf(" (attempt %d)", e.Attempts)
	case e.ctxErr != nil:
		s += fmt.Sprintf(" (%v)", e.ctxErr)
	}
	s += ": "
	if e.Kind == ErrOutcomeUnknown {
		s += ErrOutcomeUnknown.Error() + ": "
	}
	if e.err != nil {
		return s + e.err.Error()
	}
	return s + e.Message
}

// Unwrap returns the kind, the caller's context error and the last
// attempt's error.
func (e *Error) Unwrap() []error {
	var out []error
	for _, x := range []error{e.Kind, e.ctxErr, e.err, e.Cause} {
		if x != nil {
			out = append(out, x)
		}
	}
	return out
}

// GRPCStatus is the last attempt's status (for status.Code and FromError).
func (e *Error) GRPCStatus() *status.Status {
	if e.err != nil {
		if st, ok := status.FromError(e.err); ok {
			return st
		}
	}
	if e.ctxErr != nil {
		return status.FromContextError(e.ctxErr)
	}
	if e.Code != codes.OK {
		// Refused by the client itself (invalidArgument): the code a node
		// would have answered, so that status.Code(err) works as well.
		return status.New(e.Code, e.Message)
	}
	return status.New(codes.Unknown, e.Message)
}

// invalidArgument is the error of a request the client refuses before
// sending anything, shaped as a node's answer to the same input: Field
// and Violation as the node's BadRequest detail would give them, Item
// (from 1, 0 for none) as its ErrorInfo would, and Message "field:
// violation" as the node's words.
func invalidArgument(op, field string, item int, violation string) *Error {
	return &Error{Op: op, Kind: ErrInvalidArgument, Code: codes.InvalidArgument,
		Field: field, Violation: violation, Item: item, Message: field + ": " + violation}
}

// Heals reports whether waiting may help: false for errors that stay the
// same however often the call is retried (bad credentials, TLS mismatch,
// invalid input, a missing namespace, a wrong port).
func Heals(err error) bool {
	for _, k := range []error{ErrUnauthenticated, ErrPermissionDenied, ErrTLSMismatch, ErrNotGRPC, ErrClusterMismatch,
		ErrInvalidArgument, ErrTooLarge, ErrNamespaceNotFound, ErrNamespaceExists, ErrNodeNotFound, ErrNodeRemoved, ErrUnsupported} {
		if errors.Is(err, k) {
			return false
		}
	}
	return true
}

// AsError returns err's *Error, decoding a bare gRPC status error (from a
// generated client) into one when err is not from this package. It returns
// nil for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	e = &Error{err: err}
	decodeStatus(e, err)
	return e
}

// decodeStatus fills e's kind and details from a node's status error.
func decodeStatus(e *Error, err error) {
	st, ok := status.FromError(err)
	if !ok {
		e.Message = err.Error()
		return
	}
	e.Code = st.Code()
	e.Message = st.Message()
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() != dedupv1.ErrorDomain {
				continue
			}
			e.Reason = d.GetReason()
			md := d.GetMetadata()
			if m := md[dedupv1.MetaMessage]; m != "" {
				e.Message = m
			}
			e.LeaderAddr = md[dedupv1.MetaLeaderGRPCAddr]
			e.Namespace = md[dedupv1.MetaNamespace]
			if v, perr := strconv.ParseInt(md[dedupv1.MetaMaxMs], 10, 64); perr == nil {
				e.MaxMs = v
			}
			if v, perr := strconv.Atoi(md[dedupv1.MetaItem]); perr == nil && v > 0 {
				e.Item = v
			}
			if e.Reason == dedupv1.ReasonClusterMismatch {
				e.Cause = &ClusterMismatchError{Addr: md[dedupv1.MetaPeerAddr], Want: md[dedupv1.MetaClusterID], Got: md[dedupv1.MetaPeerClusterID]}
			}
		case *errdetails.BadRequest:
			if v := d.GetFieldViolations(); len(v) > 0 {
				e.Field, e.Violation = v[0].GetField(), v[0].GetDescription()
			}
		}
	}
	switch e.Reason {
	case dedupv1.ReasonNotLeader:
		e.Kind = ErrNotLeader
		return
	case dedupv1.ReasonOutcomeUnknown, dedupv1.ReasonWriteTimeout:
		e.Kind = ErrOutcomeUnknown
		return
	case dedupv1.ReasonShuttingDown, dedupv1.ReasonBusy, dedupv1.ReasonLagging:
		e.Kind = ErrUnavailable
		return
	case dedupv1.ReasonNamespaceNotFound:
		e.Kind = ErrNamespaceNotFound
		return
	case dedupv1.ReasonNamespaceExists:
		e.Kind = ErrNamespaceExists
		return
	case dedupv1.ReasonNodeNotFound:
		e.Kind = ErrNodeNotFound
		return
	case dedupv1.ReasonNotCaughtUp:
		e.Kind = ErrNotCaughtUp
		return
	case dedupv1.ReasonNodeRemoved:
		e.Kind = ErrNodeRemoved
		return
	case dedupv1.ReasonClusterMismatch:
		e.Kind = ErrClusterMismatch
		return
	case dedupv1.ReasonInvalidArgument:
		e.Kind = ErrInvalidArgument
		return
	case dedupv1.ReasonDiskFull:
		e.Kind = ErrDiskFull
		return
	case dedupv1.ReasonEntryTooLarge:
		e.Kind = ErrTooLarge
		return
	}
	switch e.Code {
	case codes.InvalidArgument, codes.OutOfRange:
		e.Kind = ErrInvalidArgument
	case codes.ResourceExhausted:
		e.Kind = ErrTooLarge
	case codes.Unauthenticated:
		e.Kind = ErrUnauthenticated
	case codes.PermissionDenied:
		e.Kind = ErrPermissionDenied
	case codes.Unimplemented:
		e.Kind = ErrUnsupported
	case codes.Unavailable:
		e.Kind = ErrUnavailable
	}
}

// TLSProblem says what is wrong in a TLS mismatch, from the typed handshake
// error: one of the TLSProblem* values, "" if err is no TLS mismatch.
func TLSProblem(err error) string {
	var e *Error
	if !errors.As(err, &e) || e.Kind != ErrTLSMismatch {
		return ""
	}
	return tlsProblemOf(e.Cause)
}

// What a TLS mismatch is about (TLSProblem).
const (
	TLSNodeSpeaksTLS       = "node speaks TLS"             // client plaintext
	TLSNodeSpeaksPlaintext = "node speaks plaintext"       // client TLS
	TLSUnknownAuthority    = "node certificate unverified" // wrong --tls-ca
	TLSClientCertRequired  = "client certificate required" // mutual TLS, none given
	TLSClientCertRefused   = "client certificate refused"  // mutual TLS, wrong CA
	TLSOther               = "TLS handshake failed"
)

// errNodeSpeaksTLS is the Cause of a plaintext client's mismatch.
var errNodeSpeaksTLS = errors.New("the node answers a TLS handshake, not plaintext gRPC")

// TLS alerts (RFC 8446 §6.2) a node sends about the client's certificate.
const (
	alertBadCertificate      = 42
	alertUnknownCA           = 48
	alertCertificateRequired = 116
)

func tlsProblemOf(cause error) string {
	var rh tls.RecordHeaderError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var he x509.HostnameError
	var ve *tls.CertificateVerificationError
	var noCert *noClientCertError
	alert, isAlert := tlsAlert(cause)
	switch {
	case errors.As(cause, &noCert):
		if isAlert && (alert == alertBadCertificate || alert == alertUnknownCA) {
			return TLSClientCertRefused
		}
		return TLSClientCertRequired
	case errors.Is(cause, errNodeSpeaksTLS):
		return TLSNodeSpeaksTLS
	case errors.As(cause, &rh):
		return TLSNodeSpeaksPlaintext
	case errors.As(cause, &ua), errors.As(cause, &ci), errors.As(cause, &he), errors.As(cause, &ve):
		return TLSUnknownAuthority
	case isAlert:
		switch alert {
		case alertCertificateRequired:
			return TLSClientCertRequired
		case alertBadCertificate, alertUnknownCA:
			return TLSClientCertRefused
		}
	}
	return TLSOther
}

// tlsAlert returns the TLS alert in err: a tls.AlertError, or the alert a
// node sent, which crypto/tls reports as a *net.OpError with Op "remote
// error" whose Err is its unexported alert type (a uint8).
func tlsAlert(err error) (tls.AlertError, bool) {
	var a tls.AlertError
	if errors.As(err, &a) {
		return a, true
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return 0, false
	}
	v := reflect.ValueOf(op.Err)
	if t := v.Type(); t.PkgPath() != "crypto/tls" || t.Kind() != reflect.Uint8 {
		return 0, false
	}
	return tls.AlertError(v.Uint()), true
}

// isRefused: a dial failed because nothing listens or the name does not
// resolve.
func isRefused(err error) bool {
	var dns *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dns) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// isEOF: the peer closed the connection.
func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}
