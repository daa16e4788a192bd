package client

import (
	"fmt"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// The client asks for the compact answers of Check and Mark
// (dedupv1.CheckRequest.compact, MarkRequest.compact): a byte per item
// instead of a result message, which cost a load generator an allocation
// or three per item to decode. A server that predates them answers with
// one result per item, which these read too.

// checkAnswer turns a Check answer into one Result per ID in ids.
func checkAnswer(resp *dedupv1.CheckResponse, ids [][]byte) ([]Result, error) {
	codes := resp.GetCodes()
	if len(codes) == 0 {
		return results("check", resp.GetResults(), func(i int) []byte { return ids[i] }, len(ids),
			func(r *dedupv1.CheckResult) Code { return checkCode(r.GetCode()) })
	}
	if err := sameLen("check", len(ids), len(codes)); err != nil {
		return nil, err
	}
	out, recs := make([]Result, len(ids)), records(len(ids))
	rs := resp.GetResults()
	next := 0
	for i, c := range codes {
		code := dedupv1.CheckResult_Code(c)
		out[i] = Result{ID: ids[i], Code: checkCode(code)}
		if code != dedupv1.CheckResult_SEEN {
			continue
		}
		if next == len(rs) {
			return nil, fmt.Errorf("dedupnode check: server returned %d results for more SEEN codes", len(rs))
		}
		out[i].Record = recs.of(i, rs[next].GetRecord())
		next++
	}
	if next != len(rs) {
		return nil, fmt.Errorf("dedupnode check: server returned %d results for %d SEEN codes", len(rs), next)
	}
	return out, nil
}

// markAnswer turns a Mark answer into one Result per item of req.
func markAnswer(resp *dedupv1.MarkResponse, req *dedupv1.MarkRequest, items []Item) ([]Result, error) {
	codes := resp.GetCodes()
	if len(codes) == 0 {
		return results("mark", resp.GetResults(), func(i int) []byte { return items[i].ID }, len(items),
			func(r *dedupv1.MarkResult) Code { return markCode(r.GetCode()) })
	}
	if err := sameLen("mark", len(items), len(codes)); err != nil {
		return nil, err
	}
	out, recs := make([]Result, len(items)), records(len(items))
	rs := resp.GetResults()
	shared, haveShared := recordValue(resp.GetNewRecord())
	// The rebuilt records' tokens and digests are copies, as decoded ones
	// are, in one arena for the batch: the caller may reuse its buffers.
	var arena []byte
	own := func(b []byte) []byte {
		if len(b) == 0 {
			return nil
		}
		if cap(arena)-len(arena) < len(b) {
			arena = make([]byte, 0, max(len(b), 64*len(codes)))
		}
		arena = append(arena, b...)
		return arena[len(arena)-len(b) : len(arena) : len(arena)]
	}
	next := 0
	for i, c := range codes {
		code := dedupv1.MarkResult_Code(c &^ dedupv1.CompactInResults)
		out[i] = Result{ID: items[i].ID, Code: markCode(code)}
		switch {
		case c&dedupv1.CompactInResults != 0:
			if next == len(rs) {
				return nil, fmt.Errorf("dedupnode mark: server returned %d results for more flagged codes", len(rs))
			}
			out[i].Record = recs.of(i, rs[next].GetRecord())
			next++
		case code == dedupv1.MarkResult_NEW:
			if !haveShared {
				return nil, fmt.Errorf("dedupnode mark: item %d recorded as the answer's new_record says, but it has none", i)
			}
			rec := shared
			rec.RequestToken, rec.Digest = own(tokenOr(req.Items[i].GetRequestToken(), req.GetRequestToken())), own(items[i].Digest)
			out[i].Record = recs.set(i, rec)
		}
	}
	if next != len(rs) {
		return nil, fmt.Errorf("dedupnode mark: server returned %d results for %d flagged codes", len(rs), next)
	}
	return out, nil
}

func tokenOr(tok, def []byte) []byte {
	if len(tok) > 0 {
		return tok
	}
	return def
}
