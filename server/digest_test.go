package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/replicacheck"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// TestDigestReplicasAgree: after writes of every kind through a 3-node
// cluster, every node reports the same state digest at the same applied
// index, with the record count the writes left; further writes change it
// on every node alike.
func TestDigestReplicasAgree(t *testing.T) {
	srvs, leader := testcluster.Start(t, 3, nil)
	ctx := callCtx(t)
	nodes := make([]string, len(srvs))
	ops := map[string]dedupv1.OpsClient{}
	for i, s := range srvs {
		nodes[i] = s.Node().ID()
		ops[nodes[i]] = dedupv1.NewOpsClient(dialPlain(t, s.GRPCAddr()))
	}
	ask := func(ctx context.Context, node string) (*dedupv1.DigestResponse, error) {
		return ops[node].Digest(ctx, &dedupv1.DigestRequest{})
	}
	compare := func(what string) replicacheck.Result {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		r := replicacheck.Compare(cctx, nodes, ask, replicacheck.Options{Interval: 50 * time.Millisecond})
		if !r.Agree {
			t.Fatalf("%s: %s", what, r.Summary())
		}
		for i, a := range r.Answers {
			if a.Resp.NodeId != nodes[i] || len(a.Resp.Digest) != 32 || a.Resp.AppliedTerm == 0 || a.Resp.Keys <= a.Resp.Records {
				t.Fatalf("%s: odd answer from %s: %+v", what, nodes[i], a.Resp)
			}
		}
		return r
	}

	cc := dialPlain(t, srvs[leader].GRPCAddr())
	d := dedupv1.NewDedupClient(cc)
	if _, err := dedupv1.NewAdminClient(cc).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders"}}); err != nil {
		t.Fatal(err)
	}
	ids := idList("d", 200)
	markAll(t, ctx, d, "", ids, "t1")
	markAll(t, ctx, d, "orders", ids[:50], "t2")
	if _, err := d.Forget(ctx, &dedupv1.ForgetRequest{Ids: ids[:20]}); err != nil {
		t.Fatal(err)
	}
	claim, err := d.Claim(ctx, &dedupv1.ClaimRequest{Namespace: "orders", RequestToken: []byte("t3"), Items: []*dedupv1.ClaimItem{{Id: []byte("job-1")}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Commit(ctx, &dedupv1.CommitRequest{Namespace: "orders", Items: []*dedupv1.LeaseItem{{Id: []byte("job-1"), FencingToken: claim.Results[0].Record.GetFencingToken(), RequestToken: []byte("t3")}}}); err != nil {
		t.Fatal(err)
	}
	first := compare("after writes")
	if got, want := first.Answers[0].Resp.Records, uint64(200-20+50+1); got != want {
		t.Fatalf("records = %d, want %d", got, want)
	}

	markAll(t, ctx, d, "orders", idList("e", 10), "t4")
	second := compare("after more writes")
	if second.Index <= first.Index || bytes.Equal(second.Answers[0].Resp.Digest, first.Answers[0].Resp.Digest) {
		t.Fatalf("more writes left index %d -> %d and the digest unchanged", first.Index, second.Index)
	}
}
