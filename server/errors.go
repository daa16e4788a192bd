package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
)

// ErrorDomain is the ErrorInfo domain of dedupnode's gRPC errors.
const ErrorDomain = "dedupnode"

// ErrorInfo reasons attached to UNAVAILABLE errors. Clients use them to tell
// "nothing was written, try the leader" from "outcome unknown".
const (
	// ReasonNotLeader: the node is not the leader (or the leader is still
	// starting its term) and nothing was written. Metadata may name the
	// leader (leader_id, leader_grpc_addr). Retry is safe.
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
)

// errLagging: a linearizable read waited too long for the local apply.
var errLagging = errors.New("this node is behind the leader")

// errorRule maps one internal sentinel to a gRPC code. The first rule whose
// target matches (errors.Is) wins, so more specific errors come first.
type errorRule struct {
	target error
	code   codes.Code
	reason string // ErrorInfo reason, "" for none
	advice string // appended to the message
}

// errorTable is THE mapping of internal errors to gRPC codes.
var errorTable = []errorRule{
	{fsm.ErrInvalidArgument, codes.InvalidArgument, "", "nothing was applied"},
	{fsm.ErrNamespaceNotFound, codes.NotFound, "", "create it first (dedupnode namespace create)"},
	{fsm.ErrNamespaceExists, codes.AlreadyExists, "", ""},
	{fsm.ErrNodeNotFound, codes.NotFound, "", ""},
	{cluster.ErrOutcomeUnknown, codes.Unavailable, ReasonOutcomeUnknown, "retry is safe with the same request token"},
	{cluster.ErrNotLeader, codes.Unavailable, ReasonNotLeader, "no leader reachable right now; nothing was written, retry is safe with the same request token"},
	{cluster.ErrNotReady, codes.Unavailable, ReasonNotLeader, "leader is starting its term; nothing was written, retry is safe with the same request token"},
	{cluster.ErrBusy, codes.Unavailable, ReasonBusy, "nothing was written; retry after a pause (the request token makes it safe)"},
	{cluster.ErrShutdown, codes.Unavailable, ReasonShuttingDown, "node is shutting down; nothing was written, retry is safe with the same request token on another node"},
	{fsm.ErrClosed, codes.Unavailable, ReasonShuttingDown, "node is shutting down; ask another node"},
	{fsm.ErrRestoring, codes.Unavailable, ReasonLagging, "node is installing a snapshot from the leader; retry in a moment or ask another node"},
	{errLagging, codes.Unavailable, ReasonLagging, "retry the read on another node"},
	{context.DeadlineExceeded, codes.DeadlineExceeded, "", "the write may still commit; retry with the same request token"},
	{context.Canceled, codes.Canceled, "", ""},
}

// toStatus turns err into a gRPC status error. Status errors (e.g. from a
// forwarded call) pass through unchanged; unknown errors become Internal.
func toStatus(err error) error {
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
		if r.advice != "" {
			msg += "; " + r.advice
		}
		st := status.New(r.code, msg)
		var details []protoadapt.MessageV1
		if r.reason != "" {
			info := &errdetails.ErrorInfo{Reason: r.reason, Domain: ErrorDomain}
			var nl *cluster.NotLeaderError
			if errors.As(err, &nl) && nl.LeaderID != "" {
				info.Metadata = map[string]string{"leader_id": nl.LeaderID, "leader_grpc_addr": nl.LeaderGRPCAddr}
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
