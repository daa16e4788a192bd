package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/server"
)

// TestInvariant9_BadInput_InvalidArgumentNothingWritten sends invalid
// requests through every node: each fails with InvalidArgument (NotFound
// for an unknown namespace) naming the field, and no node's log, applied
// index or Bloom filters change. A valid retry then succeeds.
func TestInvariant9_BadInput_InvalidArgumentNothingWritten(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, maxBatch: 100})
	ctx := rpcCtx(t)
	// An election (on loaded cores) appends the new leader's term-start
	// entries: the log and applied indexes must stay put only while every
	// node stays in its term; the stored IDs and Bloom filters always.
	type logSnap struct{ term, last, applied uint64 }
	type dataSnap struct{ ids, bloomIDs uint64 }
	snapshot := func() (map[string]logSnap, map[string]dataSnap) {
		logs, data := map[string]logSnap{}, map[string]dataSnap{}
		for _, nd := range tc.nodes {
			st, err := nd.srv.Node().Status()
			if err != nil {
				t.Fatal(err)
			}
			logs[nd.id] = logSnap{st.Term, st.LastLogIndex, st.AppliedIndex}
			data[nd.id] = dataSnap{st.FSM.IDsStored, st.FSM.Bloom.IDs}
		}
		return logs, data
	}
	last := tc.leader().srv.Node().Raft().LastIndex()
	waitFor(t, 20*time.Second, "every node to apply the whole log", func() bool {
		for _, nd := range tc.nodes {
			if nd.srv.Node().FSM().AppliedIndex() != last {
				return false
			}
		}
		return true
	})
	beforeLog, beforeData := snapshot()

	long := bytes.Repeat([]byte("x"), 513)
	tooMany := markItems(ids("many", 101))
	cases := []struct {
		name  string
		call  func(dedupv1.DedupClient) error
		code  codes.Code
		field string
	}{
		{"empty id", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("ok"), {}}), RequestToken: []byte("t")})
			return err
		}, codes.InvalidArgument, "items[1].id"},
		{"id too long", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("ok"), long})})
			return err
		}, codes.InvalidArgument, "items[1].id"},
		{"batch too large", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: tooMany})
			return err
		}, codes.InvalidArgument, "items"},
		{"ttl above max", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("a", 1)), TtlMs: 400 * 24 * 3600 * 1000})
			return err
		}, codes.InvalidArgument, "ttl_ms"},
		{"negative ttl", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("a", 1)), TtlMs: -5})
			return err
		}, codes.InvalidArgument, "ttl_ms"},
		{"token too long", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("a", 1)), RequestToken: bytes.Repeat([]byte("t"), 65)})
			return err
		}, codes.InvalidArgument, "request_token"},
		{"digest too long", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Items: []*dedupv1.MarkItem{{Id: []byte("a"), Digest: bytes.Repeat([]byte("d"), 65)}}})
			return err
		}, codes.InvalidArgument, "items[0].digest"},
		{"bad namespace name", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Namespace: "no spaces", Items: markItems(ids("a", 1))})
			return err
		}, codes.InvalidArgument, "namespace"},
		{"unknown namespace", func(c dedupv1.DedupClient) error {
			_, err := c.Mark(ctx, &dedupv1.MarkRequest{Namespace: "nope", Items: markItems(ids("a", 1))})
			return err
		}, codes.NotFound, "nope"},
		{"claim lease above max", func(c dedupv1.DedupClient) error {
			_, err := c.Claim(ctx, &dedupv1.ClaimRequest{Items: []*dedupv1.ClaimItem{{Id: []byte("a")}}, LeaseMs: 400 * 24 * 3600 * 1000})
			return err
		}, codes.InvalidArgument, "lease_ms"},
		{"commit without fencing token", func(c dedupv1.DedupClient) error {
			_, err := c.Commit(ctx, &dedupv1.CommitRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("a")}}})
			return err
		}, codes.InvalidArgument, "items[0].fencing_token"},
		{"commit without request token", func(c dedupv1.DedupClient) error {
			_, err := c.Commit(ctx, &dedupv1.CommitRequest{Items: []*dedupv1.LeaseItem{{Id: []byte("a"), FencingToken: 5, RequestToken: []byte("t")}, {Id: []byte("b"), FencingToken: 5}}})
			return err
		}, codes.InvalidArgument, "items[1].request_token"},
		{"no items", func(c dedupv1.DedupClient) error {
			_, err := c.Release(ctx, &dedupv1.ReleaseRequest{})
			return err
		}, codes.InvalidArgument, "items"},
		{"forget empty id", func(c dedupv1.DedupClient) error {
			_, err := c.Forget(ctx, &dedupv1.ForgetRequest{Ids: [][]byte{[]byte("a"), {}}})
			return err
		}, codes.InvalidArgument, "ids[1]"},
		{"check empty id", func(c dedupv1.DedupClient) error {
			_, err := c.Check(ctx, &dedupv1.CheckRequest{Ids: [][]byte{{}}})
			return err
		}, codes.InvalidArgument, "ids[0]"},
		{"check id too long", func(c dedupv1.DedupClient) error {
			_, err := c.Check(ctx, &dedupv1.CheckRequest{Ids: [][]byte{[]byte("a"), long}})
			return err
		}, codes.InvalidArgument, "ids[1]"},
		{"check bad consistency", func(c dedupv1.DedupClient) error {
			_, err := c.Check(ctx, &dedupv1.CheckRequest{Ids: ids("a", 1), Consistency: 7})
			return err
		}, codes.InvalidArgument, "consistency"},
	}
	for _, nd := range tc.nodes {
		for _, c := range cases {
			err := c.call(nd.dedup)
			st, _ := status.FromError(err)
			if st.Code() != c.code || !strings.Contains(st.Message(), c.field) {
				t.Errorf("%s via %s: got %v %q, want %v naming %q", c.name, nd.id, st.Code(), st.Message(), c.code, c.field)
			}
		}
	}
	afterLog, afterData := snapshot()
	if fmt.Sprint(afterData) != fmt.Sprint(beforeData) {
		t.Fatalf("rejected requests changed the stored IDs or Bloom filters (ids, bloom ids):\nbefore %v\nafter  %v", beforeData, afterData)
	}
	termsKept := true
	for id, b := range beforeLog {
		termsKept = termsKept && afterLog[id].term == b.term
	}
	switch {
	case termsKept && fmt.Sprint(afterLog) != fmt.Sprint(beforeLog):
		t.Fatalf("rejected requests changed the log (term, last index, applied index):\nbefore %v\nafter  %v", beforeLog, afterLog)
	case !termsKept:
		t.Logf("an election meanwhile (term, last, applied: before %v, after %v): the log indexes not compared", beforeLog, afterLog)
	}
	// The corrected request succeeds.
	resp, err := tc.nodes[1].dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems([][]byte{[]byte("ok"), []byte("fixed")}), RequestToken: []byte("t")})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, 2, dedupv1.MarkResult_NEW)
}

func TestNamespaceAdmin(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	f := tc.followers()
	created, err := f[0].admin.CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{
		Name: "orders", DefaultTtlMs: 60_000, MaxTtlMs: 3_600_000, ExpiryMode: dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if ns := created.Namespace; ns.DefaultTtlMs != 60_000 || ns.MaxIdBytes != 512 || ns.ExpiryMode != dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING || ns.BucketWidthMs == 0 {
		t.Fatalf("created %v", ns)
	}
	_, err = f[1].admin.CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders"}})
	wantStatus(t, err, codes.AlreadyExists, "orders")
	_, err = f[1].admin.CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "bad", DefaultTtlMs: 10, MaxTtlMs: 5}})
	wantStatus(t, err, codes.InvalidArgument, "default_ttl_ms")

	// Every node describes it at once (linearizable).
	for _, nd := range tc.nodes {
		d, err := nd.admin.DescribeNamespace(ctx, &dedupv1.DescribeNamespaceRequest{Name: "orders"})
		if err != nil || d.Namespace.MaxTtlMs != 3_600_000 {
			t.Fatalf("describe via %s: %v %v", nd.id, d, err)
		}
	}
	upd, err := f[1].admin.UpdateNamespace(ctx, &dedupv1.UpdateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders", DefaultTtlMs: 120_000}})
	if err != nil || upd.Namespace.DefaultTtlMs != 120_000 || upd.Namespace.MaxTtlMs != 3_600_000 {
		t.Fatalf("update: %v %v", upd, err)
	}
	_, err = f[1].admin.UpdateNamespace(ctx, &dedupv1.UpdateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders", BucketWidthMs: 7}})
	wantStatus(t, err, codes.InvalidArgument, "bucket_width_ms")
	list, err := f[0].admin.ListNamespaces(ctx, &dedupv1.ListNamespacesRequest{})
	if err != nil || len(list.Namespaces) != 2 || list.Namespaces[0].Name != "default" || list.Namespaces[1].Name != "orders" {
		t.Fatalf("list: %v %v", list, err)
	}
	resp, err := f[0].dedup.Mark(ctx, &dedupv1.MarkRequest{Namespace: "orders", Items: markItems(ids("o", 3))})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, 3, dedupv1.MarkResult_NEW)
	if r := resp.Results[0].Record; r.ExpiresUnixMs-r.FirstSeenUnixMs != 120_000 {
		t.Fatalf("TTL %d, want the updated default 120000", r.ExpiresUnixMs-r.FirstSeenUnixMs)
	}
	if _, err := f[1].admin.DeleteNamespace(ctx, &dedupv1.DeleteNamespaceRequest{Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	_, err = f[0].dedup.Check(ctx, &dedupv1.CheckRequest{Namespace: "orders", Ids: ids("o", 1)})
	wantStatus(t, err, codes.NotFound, "orders")
	_, err = f[0].admin.DeleteNamespace(ctx, &dedupv1.DeleteNamespaceRequest{Name: "default"})
	wantStatus(t, err, codes.InvalidArgument, "default")
}

func TestAutoCreateNamespaces(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1, autoCreate: true})
	ctx := rpcCtx(t)
	c := tc.nodes[0].dedup
	// A check creates nothing, and answers NotFound as without
	// auto-create (it answered not_seen: a mistyped namespace looked
	// like one where nothing was seen yet).
	_, err := c.Check(ctx, &dedupv1.CheckRequest{Namespace: "fresh", Ids: ids("f", 2)})
	wantStatus(t, err, codes.NotFound, "fresh")
	if _, err := tc.nodes[0].admin.DescribeNamespace(ctx, &dedupv1.DescribeNamespaceRequest{Name: "fresh"}); status.Code(err) != codes.NotFound {
		t.Fatalf("describe after a check: %v, want NotFound", err)
	}
	// Concurrent first writes to one new namespace: one creates it, the
	// others' CreateNamespace is ignored; every ID is NEW exactly once.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Mark(ctx, &dedupv1.MarkRequest{Namespace: "fresh", Items: markItems(ids(fmt.Sprint("w", w), 5))})
			if err != nil {
				t.Error(err)
				return
			}
			for _, r := range resp.Results {
				if r.Code != dedupv1.MarkResult_NEW {
					t.Errorf("auto-created namespace: %v", r.Code)
				}
			}
		}()
	}
	wg.Wait()
	d, err := tc.nodes[0].admin.DescribeNamespace(ctx, &dedupv1.DescribeNamespaceRequest{Name: "fresh"})
	if err != nil || d.Namespace.DefaultTtlMs != 24*3600*1000 {
		t.Fatalf("describe: %v %v", d, err)
	}
	chk, err := c.Check(ctx, &dedupv1.CheckRequest{Namespace: "fresh", Ids: [][]byte{ids("w0", 1)[0], ids("f", 1)[0]}})
	if err != nil {
		t.Fatal(err)
	}
	if chk.Results[0].Code != dedupv1.CheckResult_SEEN || chk.Results[1].Code != dedupv1.CheckResult_NOT_SEEN {
		t.Fatalf("check after the first writes: %v", chk.Results)
	}
}

func TestHealthAndReflection(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3})
	ctx := rpcCtx(t)
	for _, nd := range tc.nodes {
		h := healthpb.NewHealthClient(nd.cc)
		// Every service has its health entry (dedup.v1.Ops too: issue 14).
		for _, svc := range []string{"dedup.v1.Dedup", "dedup.v1.Admin", "dedup.v1.Ops"} {
			waitFor(t, 20*time.Second, svc+" SERVING via "+nd.id, func() bool {
				r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
			})
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(tc.nodes[0].cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"dedup.v1.Dedup", "dedup.v1.Admin", "dedup.v1.Internal", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Fatalf("reflection lists %v, missing %s", names, want)
		}
	}
	stream.CloseSend()

	// A node that lost its quorum stops reporting SERVING.
	for _, f := range tc.followers() {
		tc.close(f)
	}
	h := healthpb.NewHealthClient(tc.live()[0].cc)
	waitFor(t, 20*time.Second, "NOT_SERVING without quorum", func() bool {
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.Status == healthpb.HealthCheckResponse_NOT_SERVING
	})
}

// TestJoin_BootstrapThenJoin_PromotedToVoter starts one node with
// Bootstrap, joins two more through it and a fourth through a follower
// (the Join is forwarded), and waits until all four are voters.
func TestJoin_BootstrapThenJoin_PromotedToVoter(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 1, dcTune: func(i int, c *server.Config) {
		if i == 0 { // j1 bootstraps alone instead of from the peer list
			c.Cluster.Peers, c.Cluster.Bootstrap = nil, true
		}
	}, nodeIDs: []string{"j1"}})
	s1 := tc.nodes[0].srv
	waitFor(t, 20*time.Second, "j1 leader", func() bool { return s1.Node().Healthy() && s1.Node().IsLeader() })
	tc.add(devcluster.AddConfig{ID: "j2", Join: []string{s1.GRPCAddr()}})
	s3 := tc.add(devcluster.AddConfig{ID: "j3", Join: []string{"127.0.0.1:1", s1.GRPCAddr()}}).srv // a dead address first: the joiner moves on
	voters := func(want int) func() bool {
		return func() bool {
			st, err := s1.Node().Status()
			if err != nil {
				return false
			}
			n := 0
			for _, m := range st.Members {
				if m.Suffrage == "voter" && m.GRPCAddr != "" {
					n++
				}
			}
			return n == want
		}
	}
	waitFor(t, 30*time.Second, "3 voters", voters(3))
	s4 := tc.add(devcluster.AddConfig{ID: "j4", Join: []string{s3.GRPCAddr()}}).srv // through a follower
	waitFor(t, 30*time.Second, "4 voters", voters(4))

	cc, err := grpc.NewClient(s4.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // membership changes, a refused join and a transfer on a loaded machine
	defer cancel()
	resp, err := dedupv1.NewDedupClient(cc).Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("j", 5))})
	if err != nil {
		t.Fatal(err)
	}
	wantMarkCodes(t, resp, 5, dedupv1.MarkResult_NEW)
	chk, err := dedupv1.NewDedupClient(cc).Check(ctx, &dedupv1.CheckRequest{Ids: ids("j", 5)})
	if err != nil {
		t.Fatal(err)
	}
	wantCheckCodes(t, chk, 5, dedupv1.CheckResult_SEEN)
	st, err := dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
	if err != nil || st.LeaderId != "j1" || len(st.Members) != 4 || st.NodeId != "j4" {
		t.Fatalf("status via j4: %v %v", st, err)
	}

	// Remove a voter through a follower, then transfer leadership.
	admin := dedupv1.NewAdminClient(cc)
	if _, err := admin.Remove(ctx, &dedupv1.RemoveRequest{NodeId: "j2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "3 voters after remove", voters(3))
	_, err = admin.Remove(ctx, &dedupv1.RemoveRequest{NodeId: "nobody"})
	wantStatus(t, err, codes.NotFound, "nobody")

	// j2's ID is retired: a node started under it with an empty data dir
	// is refused, and its `serve --join` gives up at once instead of
	// asking until its deadline.
	_, err = admin.Join(ctx, &dedupv1.JoinRequest{NodeId: "j2", RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:1"})
	wantStatus(t, err, codes.InvalidArgument, "was removed from this cluster")
	actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = tc.c.Add(actx, devcluster.AddConfig{ID: "j2-again", Tune: func(c *server.Config) { c.Cluster.NodeID = "j2" }})
	cancel()
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "was removed from this cluster") {
		t.Fatalf("serve --join under the removed ID j2: %v, want an immediate refusal", err)
	}
	waitFor(t, 20*time.Second, "still 3 voters", voters(3))
	// Raft gives the target one election timeout to win; on a loaded
	// machine that can run out ("leadership transfer timeout"), and asking
	// again is what an operator does.
	waitFor(t, 60*time.Second, "j4 leads after a transfer", func() bool {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		tr, err := admin.TransferLeadership(tctx, &dedupv1.TransferLeadershipRequest{NodeId: "j4"})
		if err != nil {
			t.Logf("transfer to j4: %v", err)
		}
		return err == nil && tr.NewLeaderId == "j4"
	})
	resp, err = dedupv1.NewDedupClient(cc).Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("j", 6))})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Results[5].Code != dedupv1.MarkResult_NEW || resp.Results[0].Code != dedupv1.MarkResult_DUPLICATE {
		t.Fatalf("after transfer: %v", resp.Results)
	}
}

// TestServerAndDialOptionsApplied: Config.ServerOptions wrap every served
// call and Config.DialOptions every call to another node (forwarding).
func TestServerAndDialOptionsApplied(t *testing.T) {
	var served, dialed sync.Map // node's grpc addr -> *atomic count
	count := func(m *sync.Map, key string) *atomic.Int64 {
		v, _ := m.LoadOrStore(key, new(atomic.Int64))
		return v.(*atomic.Int64)
	}
	tc := startCluster(t, clusterOpts{n: 3, serverTune: func(c *server.Config) {
		addr := c.Cluster.GRPCAddr
		c.ServerOptions = []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod == "/dedup.v1.Dedup/Mark" {
				count(&served, addr).Add(1)
			}
			return h(ctx, req)
		})}
		c.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/dedup.v1.Dedup/Mark" {
				count(&dialed, addr).Add(1)
			}
			return inv(ctx, method, req, reply, cc, opts...)
		})}
	}})
	ctx := rpcCtx(t)
	f := tc.followers()[0]
	if _, err := f.dedup.Mark(ctx, &dedupv1.MarkRequest{Items: markItems(ids("opt", 1))}); err != nil {
		t.Fatal(err)
	}
	leaderAddr := tc.leader().srv.GRPCAddr()
	if count(&served, f.srv.GRPCAddr()).Load() != 1 || count(&dialed, f.srv.GRPCAddr()).Load() != 1 || count(&served, leaderAddr).Load() != 1 {
		t.Fatalf("interceptors: served by follower %d, forwarded by follower %d, served by leader %d; want 1 each",
			count(&served, f.srv.GRPCAddr()).Load(), count(&dialed, f.srv.GRPCAddr()).Load(), count(&served, leaderAddr).Load())
	}
}
