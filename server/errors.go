package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// The error vocabulary (domain, reasons, metadata keys) lives in dedupv1,
// shared with the client and the tools; these are the server's names for it.
const (
	ErrorDomain          = dedupv1.ErrorDomain
	ReasonNotLeader      = dedupv1.ReasonNotLeader
	ReasonOutcomeUnknown = dedupv1.ReasonOutcomeUnknown
	ReasonShuttingDown   = dedupv1.ReasonShuttingDown
	ReasonLagging        = dedupv1.ReasonLagging
	ReasonBusy           = dedupv1.ReasonBusy
	ReasonDiskFull       = dedupv1.ReasonDiskFull
	ReasonEntryTooLarge  = dedupv1.ReasonEntryTooLarge
)

// errLagging: a linearizable read waited too long for the local apply.
var errLagging = errors.New("this node is behind the leader")

// errorRule maps one internal sentinel to a gRPC code. The first rule whose
// target matches (errors.Is) wins, so more specific errors come first.
type errorRule struct {
	target error
	code   codes.Code
	reason string // ErrorInfo reason, "" for none
	advice string // appended to the message of a write's error
	// readAdvice replaces advice for reads (Check), which have no request
	// token and write nothing; "" keeps advice.
	readAdvice string
}

// errorTable is THE mapping of internal errors to gRPC codes.
var errorTable = []errorRule{
	{fsm.ErrInvalidArgument, codes.InvalidArgument, dedupv1.ReasonInvalidArgument, "nothing was applied", "fix the request"},
	{fsm.ErrNamespaceNotFound, codes.NotFound, dedupv1.ReasonNamespaceNotFound, "create it first (dedupnode namespace create)", ""},
	{fsm.ErrNamespaceExists, codes.AlreadyExists, dedupv1.ReasonNamespaceExists, "", ""},
	{fsm.ErrNodeNotFound, codes.NotFound, dedupv1.ReasonNodeNotFound, "", ""},
	{cluster.ErrClusterMismatch, codes.FailedPrecondition, dedupv1.ReasonClusterMismatch, "nothing changed; a node keeps its cluster for life: to move it, remove it from its cluster, wipe its data dir and join it again", ""},
	// RemovedError's own text says what to do.
	{cluster.ErrRemoved, codes.FailedPrecondition, dedupv1.ReasonNodeRemoved, "nothing was done; ask another node", ""},
	{cluster.ErrNotCaughtUp, codes.FailedPrecondition, dedupv1.ReasonNotCaughtUp, "nothing changed; start the node or wait until it catches up ('dedupnode status --addr NODE' shows its applied index), or promote it with force (PromoteRequest.force, 'dedupnode promote --force')", ""},
	{cluster.ErrTransferFailed, codes.FailedPrecondition, "", "nothing changed; check that the node is up and caught up ('dedupnode members'), then retry, or transfer to another voter (without a node ID the leader picks the most up-to-date one)", ""},
	{cluster.ErrLowDiskSpace, codes.ResourceExhausted, ReasonDiskFull, "nothing was written; retry once space is freed (the request token makes it safe)", ""},
	{cluster.ErrEntryTooLarge, codes.ResourceExhausted, ReasonEntryTooLarge, "nothing was written", ""},
	// ErrOutcomeUnknown's own text says "retry with the same request token".
	{cluster.ErrOutcomeUnknown, codes.Unavailable, ReasonOutcomeUnknown, "", ""},
	{cluster.ErrNotLeader, codes.Unavailable, ReasonNotLeader, "no leader reachable right now; nothing was written, retry is safe with the same request token", "no leader reachable right now; retry the read"},
	{cluster.ErrNotReady, codes.Unavailable, ReasonNotLeader, "leader is starting its term; nothing was written, retry is safe with the same request token", "leader is starting its term; retry the read"},
	{cluster.ErrBusy, codes.Unavailable, ReasonBusy, "nothing was written; retry after a pause (the request token makes it safe)", "retry the read after a pause"},
	{cluster.ErrShutdown, codes.Unavailable, ReasonShuttingDown, "node is shutting down; nothing was written, retry is safe with the same request token on another node", "node is shutting down; ask another node"},
	{fsm.ErrClosed, codes.Unavailable, ReasonShuttingDown, "node is shutting down; ask another node", ""},
	{fsm.ErrRestoring, codes.Unavailable, ReasonLagging, "node is installing a snapshot from the leader; retry in a moment or ask another node", ""},
	{errLagging, codes.Unavailable, ReasonLagging, "retry the read on another node", ""},
	{context.DeadlineExceeded, codes.DeadlineExceeded, dedupv1.ReasonWriteTimeout, "outcome unknown; retry with the same request token", "retry the read"},
	{context.Canceled, codes.Canceled, "", "", ""},
}

// toStatus turns a write's (or an admin call's) err into a gRPC status
// error. Status errors (e.g. from a forwarded call) pass through unchanged;
// unknown errors become Internal.
func toStatus(err error) error { return statusOf(err, false) }

// toReadStatus is toStatus for reads: their advice says nothing of request
// tokens or of what was written.
func toReadStatus(err error) error { return statusOf(err, true) }

func statusOf(err error, read bool) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, r := range errorTable {
		if !errors.Is(err, r.target) {
			continue
		}
		msg := err.Error()
		advice := r.advice
		if read && r.readAdvice != "" {
			advice = r.readAdvice
		}
		if advice != "" {
			msg += "; " + advice
		}
		st := status.New(r.code, msg)
		var details []protoadapt.MessageV1
		if r.reason != "" {
			info := &errdetails.ErrorInfo{Reason: r.reason, Domain: ErrorDomain,
				Metadata: map[string]string{dedupv1.MetaMessage: err.Error()}}
			var nl *cluster.NotLeaderError
			if errors.As(err, &nl) && nl.LeaderID != "" {
				info.Metadata[dedupv1.MetaLeaderID] = nl.LeaderID
				info.Metadata[dedupv1.MetaLeaderGRPCAddr] = nl.LeaderGRPCAddr
			}
			var nse *fsm.NamespaceError
			if errors.As(err, &nse) {
				info.Metadata[dedupv1.MetaNamespace] = nse.Name
			}
			var inv *fsm.InvalidError
			if errors.As(err, &inv) {
				if inv.MaxMs > 0 {
					info.Metadata[dedupv1.MetaMaxMs] = strconv.FormatInt(inv.MaxMs, 10)
					if inv.Namespace != "" {
						info.Metadata[dedupv1.MetaNamespace] = inv.Namespace
					}
				}
				if inv.Item > 0 {
					info.Metadata[dedupv1.MetaItem] = strconv.Itoa(inv.Item)
				}
			}
			var low *diskspace.LowSpaceError
			if errors.As(err, &low) {
				info.Metadata[dedupv1.MetaPath] = low.Path
				info.Metadata[dedupv1.MetaFreeBytes] = strconv.FormatUint(low.Free, 10)
				info.Metadata[dedupv1.MetaMinFreeBytes] = strconv.FormatUint(low.MinFree, 10)
				info.Metadata[dedupv1.MetaResumeFreeBytes] = strconv.FormatUint(low.ResumeFree, 10)
			}
			var mm *cluster.ClusterMismatchError
			if errors.As(err, &mm) {
				info.Metadata[dedupv1.MetaClusterID] = mm.Ours
				info.Metadata[dedupv1.MetaPeerClusterID] = mm.Theirs
				info.Metadata[dedupv1.MetaPeerAddr] = mm.Addr
			}
			var rm *cluster.RemovedError
			if errors.As(err, &rm) {
				info.Metadata[dedupv1.MetaNodeID] = rm.ID
			}
			var big *cluster.EntryTooLargeError
			if errors.As(err, &big) {
				info.Metadata[dedupv1.MetaBytes] = strconv.Itoa(big.Bytes)
				info.Metadata[dedupv1.MetaMaxBytes] = strconv.Itoa(big.Max)
			}
			details = append(details, info)
		}
		var inv *fsm.InvalidError
		if errors.As(err, &inv) {
			details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: inv.Field, Description: inv.Reason}}})
		}
		if len(details) > 0 {
			if ds, derr := st.WithDetails(details...); derr == nil {
				st = ds
			}
		}
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// reasonOf returns the ErrorInfo reason of a dedupnode status error.
func reasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
			return info.Reason
		}
	}
	return ""
}

func invalidf(field, format string, args ...any) error {
	return &fsm.InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
