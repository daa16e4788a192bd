package server

import (
	"bytes"
	"fmt"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/fsm"
)

// markAnswer builds the answer to a Mark whose items were applied with
// results items, in the form the request asked for.
//
// The compact form exists because a client decodes a MarkResult and its
// Record per item (three allocations with the token) although every item
// a call records shares the same state, times and fencing token: only its
// request token and digest differ, and the client sent those. So codes
// says what happened to each item, new_record gives the shared fields
// once, and results holds the items that were not recorded as
// new_record says (duplicates, conflicts, and a retried call's items
// recorded by its first attempt, whose times differ).
func markAnswer(req *dedupv1.MarkRequest, items []fsm.ItemResult) (*dedupv1.MarkResponse, error) {
	codes := make([]dedupv1.MarkResult_Code, len(items))
	for i, r := range items {
		switch r.Code {
		case fsm.CodeNew:
			codes[i] = dedupv1.MarkResult_NEW
		case fsm.CodeDuplicate:
			codes[i] = dedupv1.MarkResult_DUPLICATE
		case fsm.CodeConflict:
			codes[i] = dedupv1.MarkResult_CONFLICT
		default:
			return nil, fmt.Errorf("mark: unexpected result %s for item %d", r.Code, i)
		}
	}
	if !req.Compact {
		resp := &dedupv1.MarkResponse{Results: make([]*dedupv1.MarkResult, len(items))}
		rs := make([]dedupv1.MarkResult, len(items)) // one allocation for the batch
		for i, r := range items {
			rs[i].Code, rs[i].Record = codes[i], recordPB(r.Record, itemToken(req, i))
			resp.Results[i] = &rs[i]
		}
		return resp, nil
	}
	resp := &dedupv1.MarkResponse{Codes: make([]byte, len(items))}
	var shared *fsm.Record
	for i, r := range items {
		resp.Codes[i] = byte(codes[i])
		if r.Code == fsm.CodeNew && recordedAsSent(req, i, &r.Record) {
			if shared == nil {
				shared = &items[i].Record
			}
			if sameSharedFields(shared, &r.Record) {
				continue
			}
		}
		resp.Codes[i] |= dedupv1.CompactInResults
		resp.Results = append(resp.Results, &dedupv1.MarkResult{Code: codes[i], Record: recordPB(r.Record, itemToken(req, i))})
	}
	if shared != nil {
		resp.NewRecord = recordPB(fsm.Record{State: shared.State, FirstSeenMs: shared.FirstSeenMs, ExpiresMs: shared.ExpiresMs, Fence: shared.Fence}, nil)
	}
	return resp, nil
}

// recordedAsSent reports whether rec carries item i's own request token and
// digest, so a client can rebuild it from what it sent, and has a state a
// Record shows.
func recordedAsSent(req *dedupv1.MarkRequest, i int, rec *fsm.Record) bool {
	return recordPB(*rec, nil) != nil && bytes.Equal(rec.Token, itemToken(req, i)) && bytes.Equal(rec.Digest, req.Items[i].Digest)
}

// itemToken is the request token of a Mark's item i.
func itemToken(req *dedupv1.MarkRequest, i int) []byte {
	return tokenOr(req.Items[i].RequestToken, req.RequestToken)
}

// sameSharedFields reports whether a and b agree on what new_record holds.
func sameSharedFields(a, b *fsm.Record) bool {
	return a.State == b.State && a.FirstSeenMs == b.FirstSeenMs && a.ExpiresMs == b.ExpiresMs && a.Fence == b.Fence
}

// checkAnswer builds the answer to a Check from results res, one per ID,
// in the form the request asked for. The compact form sends a byte per
// ID, and a result only for the IDs seen: an absent ID costs a client no
// allocation.
func checkAnswer(req *dedupv1.CheckRequest, res []fsm.ItemResult, applied uint64, path dedupv1.ReadPath) (*dedupv1.CheckResponse, error) {
	n := len(req.Ids)
	resp := &dedupv1.CheckResponse{AppliedIndex: applied, ReadPath: path}
	if req.Compact {
		resp.Codes = make([]byte, n)
	} else {
		resp.Results = make([]*dedupv1.CheckResult, n)
	}
	var notSeen []dedupv1.CheckResult // one allocation for the batch's absent IDs
	for i := range n {
		switch code := res[i].Code; code {
		case fsm.CodeSeen:
			r := &dedupv1.CheckResult{Code: dedupv1.CheckResult_SEEN, Record: recordPB(res[i].Record, nil)}
			if req.Compact {
				resp.Codes[i] = byte(dedupv1.CheckResult_SEEN)
				resp.Results = append(resp.Results, r)
			} else {
				resp.Results[i] = r
			}
		case fsm.CodeNotSeen:
			if req.Compact {
				resp.Codes[i] = byte(dedupv1.CheckResult_NOT_SEEN)
				continue
			}
			if notSeen == nil {
				notSeen = make([]dedupv1.CheckResult, n)
			}
			notSeen[i].Code = dedupv1.CheckResult_NOT_SEEN
			resp.Results[i] = &notSeen[i]
		default:
			return nil, fmt.Errorf("check: unexpected result %s for item %d", code, i)
		}
	}
	return resp, nil
}
