package metrics

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// ForwardedHeader is the metadata key a node sets on a call it forwards to
// the leader (server package). Such calls count with origin "forwarded"
// and their items are not counted again.
const ForwardedHeader = "x-dedupnode-forwarded-by"

func isForwarded(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, ForwardedHeader)) > 0 // no copy of the metadata map
}

// UnaryServerInterceptor measures every unary call: requests by op, code
// and origin, latency and batch size; and, for the dedup.v1 Dedup service
// answered successfully to a client, item results per namespace and the age
// of every duplicate. Health and reflection calls are not counted.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, "/dedup.") {
			return handler(ctx, req)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		op := OpName(info.FullMethod)
		origin := OriginClient
		if isForwarded(ctx) {
			origin = OriginForwarded
		}
		m.ObserveRequest(op, status.Code(err).String(), origin, time.Since(start), batchSize(req))
		if err == nil && origin == OriginClient {
			m.observeResponse(op, req, resp)
		}
		return resp, err
	}
}

// StreamServerInterceptor counts every streaming call of dedup.v1 (Ops
// Backup and Export) like UnaryServerInterceptor, with the same labels: by
// op, code and origin, timed from the start to the end of the stream (so a
// long backup lands in the top latency buckets). Streams carry no items:
// no batch size, no item results. Health and reflection streams are not
// counted.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, "/dedup.") {
			return handler(srv, ss)
		}
		start := time.Now()
		err := handler(srv, ss)
		origin := OriginClient
		if isForwarded(ss.Context()) {
			origin = OriginForwarded
		}
		m.ObserveRequest(OpName(info.FullMethod), status.Code(err).String(), origin, time.Since(start), -1)
		return err
	}
}

// batchSize is the number of items in a dedup request, -1 for others.
func batchSize(req any) int {
	switch r := req.(type) {
	case interface{ GetIds() [][]byte }:
		return len(r.GetIds())
	case *dedupv1.MarkRequest:
		return len(r.Items)
	case *dedupv1.ClaimRequest:
		return len(r.Items)
	case *dedupv1.CommitRequest:
		return len(r.Items)
	case *dedupv1.RenewRequest:
		return len(r.Items)
	case *dedupv1.ReleaseRequest:
		return len(r.Items)
	}
	return -1
}

// observeResponse counts item results of a successful dedup call.
func (m *Metrics) observeResponse(op string, req, resp any) {
	nsr, ok := req.(interface{ GetNamespace() string })
	if !ok {
		return
	}
	ns := nsr.GetNamespace()
	// A call's items have few distinct codes: count them in a small
	// stack slice, naming each code once (no map, no string per item).
	var buf [8]codeCount
	counts := buf[:0]
	switch r := resp.(type) {
	case *dedupv1.MarkResponse:
		// A compact answer has a code per item and results for some
		// items only: count the codes.
		for _, c := range r.Codes {
			counts = countCode(counts, dedupv1.MarkResult_Code(c&^dedupv1.CompactInResults))
		}
		for _, it := range r.Results {
			if len(r.Codes) == 0 {
				counts = countCode(counts, it.Code)
			}
			if it.Code == dedupv1.MarkResult_DUPLICATE && it.Record != nil {
				m.ObserveDuplicate(ns, time.UnixMilli(it.Record.FirstSeenUnixMs))
			}
		}
	case *dedupv1.ClaimResponse:
		for _, it := range r.Results {
			counts = countCode(counts, it.Code)
			if it.Code == dedupv1.ClaimResult_DUPLICATE && it.Record != nil {
				m.ObserveDuplicate(ns, time.UnixMilli(it.Record.FirstSeenUnixMs))
			}
		}
	case *dedupv1.CheckResponse:
		for _, c := range r.Codes {
			counts = countCode(counts, dedupv1.CheckResult_Code(c))
		}
		if len(r.Codes) > 0 {
			break
		}
		for _, it := range r.Results {
			counts = countCode(counts, it.Code)
		}
	case *dedupv1.LeaseResponse:
		for _, it := range r.Results {
			counts = countCode(counts, it.Code)
		}
	case *dedupv1.ForgetResponse:
		for _, it := range r.Results {
			counts = countCode(counts, it.Code)
		}
	}
	for _, c := range counts {
		m.ObserveItems(ns, op, c.result, c.n)
	}
}

// codeCount is the number of items of one call with one result code.
type codeCount struct {
	code   int32
	result string // the code's name in lower case, the metric's result label
	n      int
}

// countCode adds one item with code to counts.
func countCode[E interface {
	~int32
	String() string
}](counts []codeCount, code E) []codeCount {
	for i := range counts {
		if counts[i].code == int32(code) {
			counts[i].n++
			return counts
		}
	}
	return append(counts, codeCount{code: int32(code), result: strings.ToLower(code.String()), n: 1})
}
