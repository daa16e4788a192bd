package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
)

func TestErrorTable(t *testing.T) {
	cases := []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{&fsm.InvalidError{Field: "items[2].id", Reason: "empty"}, codes.InvalidArgument, dedupv1.ReasonInvalidArgument},
		{fmt.Errorf("ns %q: %w", "x", fsm.ErrNamespaceNotFound), codes.NotFound, dedupv1.ReasonNamespaceNotFound},
		{fsm.ErrNamespaceExists, codes.AlreadyExists, dedupv1.ReasonNamespaceExists},
		{&cluster.NotLeaderError{}, codes.Unavailable, ReasonNotLeader},
		{&cluster.NotLeaderError{LeaderID: "n2", LeaderGRPCAddr: "h:1"}, codes.Unavailable, ReasonNotLeader},
		{fmt.Errorf("%w: %w", cluster.ErrNotReady, context.DeadlineExceeded), codes.Unavailable, ReasonNotLeader},
		{fmt.Errorf("%w: %w", cluster.ErrOutcomeUnknown, cluster.ErrShutdown), codes.Unavailable, ReasonOutcomeUnknown},
		{cluster.ErrShutdown, codes.Unavailable, ReasonShuttingDown},
		{fmt.Errorf("%w: %w", errLagging, context.DeadlineExceeded), codes.Unavailable, ReasonLagging},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, dedupv1.ReasonWriteTimeout},
		{errors.New("disk on fire"), codes.Internal, ""},
	}
	for _, c := range cases {
		err := toStatus(c.err)
		st, _ := status.FromError(err)
		if st.Code() != c.code || reasonOf(err) != c.reason {
			t.Errorf("%v: got %v/%q, want %v/%q", c.err, st.Code(), reasonOf(err), c.code, c.reason)
		}
		if c.code == codes.Unavailable && c.reason != ReasonLagging && !contains(st.Message(), "retry is safe") && !(contains(st.Message(), "outcome unknown") && contains(st.Message(), "retry with the same request token")) {
			t.Errorf("%v: message %q says neither that retry is safe nor that the outcome is unknown", c.err, st.Message())
		}
		// A read's error says nothing of request tokens (issue 14).
		if rst, _ := status.FromError(toReadStatus(c.err)); contains(rst.Message(), "request token") && !errors.Is(c.err, cluster.ErrOutcomeUnknown) {
			t.Errorf("%v: read error %q advises a request token", c.err, rst.Message())
		}
	}
	// Leader identity travels in the ErrorInfo metadata.
	st, _ := status.FromError(toStatus(&cluster.NotLeaderError{LeaderID: "n2", LeaderGRPCAddr: "h:1"}))
	var info *errdetails.ErrorInfo
	var bad *errdetails.BadRequest
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.Metadata["leader_id"] != "n2" || info.Metadata["leader_grpc_addr"] != "h:1" {
		t.Fatalf("not-leader details: %v", st.Details())
	}
	// Invalid input names the field in a BadRequest detail too.
	st, _ = status.FromError(toStatus(&fsm.InvalidError{Field: "items[2].id", Reason: "empty"}))
	for _, d := range st.Details() {
		if b, ok := d.(*errdetails.BadRequest); ok {
			bad = b
		}
	}
	if bad == nil || bad.FieldViolations[0].Field != "items[2].id" {
		t.Fatalf("bad request details: %v", st.Details())
	}
	// Status errors (from a forwarded call) pass through untouched.
	orig := status.Error(codes.ResourceExhausted, "x")
	if toStatus(orig) != orig {
		t.Fatal("status error rewritten")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
