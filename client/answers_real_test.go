package client_test

// The compact answers of Mark and Check (a code byte per item, records
// only where the client cannot rebuild them) must give callers exactly
// the Results the full answers give, from servers that send them and from
// servers that predate them.

import (
	"bytes"
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/server"
)

// withoutCompact makes a node answer as one that predates the compact
// answers: it never sees the request's flag.
func withoutCompact(cfg *server.Config) {
	cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			switch r := req.(type) {
			case *dedupv1.MarkRequest:
				r.Compact = false
			case *dedupv1.CheckRequest:
				r.Compact = false
			}
			return h(ctx, req)
		}))
}

// fullRecords asks the node for the full answer of a Check of ids (the
// request without the compact flag) and returns its records by ID.
func fullRecords(t *testing.T, ctx context.Context, addr, ns string, ids ...string) map[string]*dedupv1.Record {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req := &dedupv1.CheckRequest{Namespace: ns, Consistency: dedupv1.Consistency_CONSISTENCY_LINEARIZABLE}
	for _, id := range ids {
		req.Ids = append(req.Ids, []byte(id))
	}
	resp, err := dedupv1.NewDedupClient(cc).Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Codes) != 0 || len(resp.Results) != len(ids) {
		t.Fatalf("a check without the compact flag got %d codes and %d results for %d IDs", len(resp.Codes), len(resp.Results), len(ids))
	}
	out := map[string]*dedupv1.Record{}
	for i, r := range resp.Results {
		out[ids[i]] = r.Record
	}
	return out
}

// sameRecord fails unless the client's record is the stored one.
func sameRecord(t *testing.T, what string, got *client.Record, want *dedupv1.Record) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("%s: record %+v, want none", what, got)
		}
		return
	}
	if got == nil {
		t.Fatalf("%s: no record, want %v", what, want)
	}
	if got.State != client.StateCommitted || got.FirstSeen.UnixMilli() != want.FirstSeenUnixMs || got.Expires.UnixMilli() != want.ExpiresUnixMs ||
		!bytes.Equal(got.RequestToken, want.RequestToken) || !bytes.Equal(got.Digest, want.Digest) || got.FencingToken != want.FencingToken {
		t.Fatalf("%s: record %+v, stored %v", what, got, want)
	}
}

func TestCompactAnswersGiveTheResultsOfFullOnes(t *testing.T) {
	for _, tc := range []struct {
		name string
		tune func(*server.Config)
	}{{"compact server", nil}, {"server without compact answers", withoutCompact}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			n := startSingle(t, tc.tune)
			c := newClient(t, []string{n.addr})
			d1, d2, d3 := client.Digest([]byte("body 1")), client.Digest([]byte("body 2")), client.Digest([]byte("body 3"))
			itemTok := []byte("item-token-b")

			// New items: the item's own token, else the call's; its digest.
			callTok := []byte("call-token-1")
			first := []client.Item{{ID: []byte("a"), Digest: d1}, {ID: []byte("b"), RequestToken: itemTok}, {ID: []byte("c"), Digest: d2}}
			res, err := c.MarkAt(ctx, n.addr, "ns", first, time.Hour, callTok)
			if err != nil {
				t.Fatal(err)
			}
			stored := fullRecords(t, ctx, n.addr, "ns", "a", "b", "c")
			for i, r := range res {
				if r.Code != client.CodeNew || string(r.ID) != string(first[i].ID) {
					t.Fatalf("first mark, item %d: %s %v, want %s new", i, r.ID, r.Code, first[i].ID)
				}
				sameRecord(t, "new "+string(r.ID), r.Record, stored[string(r.ID)])
			}
			// The records are the caller's to keep: its buffers are not.
			callTok[0], itemTok[0], d1[0] = 'X', 'X', d1[0]+1
			sameRecord(t, "a after the caller reused its buffers", res[0].Record, stored["a"])
			sameRecord(t, "b after the caller reused its buffers", res[1].Record, stored["b"])

			// Duplicates and conflicts carry the stored record; a new ID
			// in the same call is recorded now.
			second := []client.Item{{ID: []byte("a"), Digest: stored["a"].Digest}, {ID: []byte("c"), Digest: d3}, {ID: []byte("e")}}
			res, err = c.Mark(ctx, "ns", second, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			want := []client.Code{client.CodeDuplicate, client.CodeConflict, client.CodeNew}
			stored = fullRecords(t, ctx, n.addr, "ns", "a", "c", "e")
			for i, r := range res {
				if r.Code != want[i] {
					t.Fatalf("second mark, item %d (%s): %v, want %v", i, r.ID, r.Code, want[i])
				}
				sameRecord(t, string(r.ID), r.Record, stored[string(r.ID)])
			}

			// A retry recorded some items in its first attempt: those keep
			// their first times, the others are recorded now.
			retryTok := []byte("retry-token")
			if _, err := c.MarkAt(ctx, n.addr, "ns", items("x", "y"), time.Hour, retryTok); err != nil {
				t.Fatal(err)
			}
			firstSeen := fullRecords(t, ctx, n.addr, "ns", "x")["x"].FirstSeenUnixMs
			for deadline := time.Now().Add(10 * time.Second); time.Now().UnixMilli() <= firstSeen+1; {
				if time.Now().After(deadline) {
					t.Fatal("the clock did not move")
				}
				time.Sleep(time.Millisecond)
			}
			res, err = c.MarkAt(ctx, n.addr, "ns", items("z", "x", "y"), time.Hour, retryTok)
			if err != nil {
				t.Fatal(err)
			}
			stored = fullRecords(t, ctx, n.addr, "ns", "z", "x", "y")
			if stored["z"].FirstSeenUnixMs == stored["x"].FirstSeenUnixMs {
				t.Fatal("the retry's new item shares the first attempt's time: the case is not covered")
			}
			for _, r := range res {
				if r.Code != client.CodeNew {
					t.Fatalf("retry, %s: %v, want new", r.ID, r.Code)
				}
				sameRecord(t, "retry "+string(r.ID), r.Record, stored[string(r.ID)])
			}

			// Checks: records for the IDs seen, none for the others.
			got, err := c.Check(ctx, "ns", [][]byte{[]byte("q"), []byte("a"), []byte("r"), []byte("z")}, client.Linearizable)
			if err != nil {
				t.Fatal(err)
			}
			stored = fullRecords(t, ctx, n.addr, "ns", "q", "a", "r", "z")
			wantCheck := []client.Code{client.CodeNotSeen, client.CodeSeen, client.CodeNotSeen, client.CodeSeen}
			for i, r := range got {
				if r.Code != wantCheck[i] {
					t.Fatalf("check %s: %v, want %v", r.ID, r.Code, wantCheck[i])
				}
				sameRecord(t, "check "+string(r.ID), r.Record, stored[string(r.ID)])
			}
		})
	}
}

// A server asked for the compact form sends it: codes for every item,
// new_record once, and results only where a record cannot be rebuilt.
func TestCompactAnswersAreCompact(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	d := dedupv1.NewDedupClient(cc)
	mark := func(tok string, ids ...string) *dedupv1.MarkResponse {
		req := &dedupv1.MarkRequest{Namespace: "ns", RequestToken: []byte(tok), Compact: true}
		for _, id := range ids {
			req.Items = append(req.Items, &dedupv1.MarkItem{Id: []byte(id)})
		}
		resp, err := d.Mark(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := mark("t1", "a", "b", "c")
	if !bytes.Equal(resp.Codes, []byte{1, 1, 1}) || len(resp.Results) != 0 || resp.NewRecord == nil || resp.NewRecord.FirstSeenUnixMs == 0 {
		t.Fatalf("three new IDs: codes %v, %d results, new_record %v", resp.Codes, len(resp.Results), resp.NewRecord)
	}
	resp = mark("t2", "a", "d")
	if !bytes.Equal(resp.Codes, []byte{2 | dedupv1.CompactInResults, 1}) || len(resp.Results) != 1 || resp.Results[0].Record == nil {
		t.Fatalf("a duplicate and a new ID: codes %v, results %v", resp.Codes, resp.Results)
	}
	cr, err := d.Check(ctx, &dedupv1.CheckRequest{Namespace: "ns", Ids: [][]byte{[]byte("x"), []byte("a"), []byte("y")}, Compact: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cr.Codes, []byte{2, 1, 2}) || len(cr.Results) != 1 || cr.Results[0].Record == nil {
		t.Fatalf("check of one seen ID among absent ones: codes %v, results %v", cr.Codes, cr.Results)
	}
}
