package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/server"
)

func dialPlain(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func waitHealthy(t *testing.T, srvs ...*server.Server) {
	t.Helper()
	waitFor(t, 60*time.Second, "nodes healthy", func() bool {
		for _, s := range srvs {
			if !s.Node().Healthy() {
				return false
			}
		}
		return true
	})
}

func idList(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s-%04d", prefix, i))
	}
	return out
}

func markAll(t *testing.T, ctx context.Context, c dedupv1.DedupClient, ns string, ids [][]byte, tok string) []dedupv1.MarkResult_Code {
	t.Helper()
	req := &dedupv1.MarkRequest{Namespace: ns, RequestToken: []byte(tok)}
	for _, id := range ids {
		req.Items = append(req.Items, &dedupv1.MarkItem{Id: id})
	}
	resp, err := c.Mark(ctx, req)
	if err != nil {
		t.Fatalf("mark %s: %v", ns, err)
	}
	var out []dedupv1.MarkResult_Code
	for _, r := range resp.Results {
		out = append(out, r.Code)
	}
	return out
}

// answers returns Check's code per ID.
func answers(t *testing.T, ctx context.Context, c dedupv1.DedupClient, ns string, ids [][]byte) []dedupv1.CheckResult_Code {
	t.Helper()
	resp, err := c.Check(ctx, &dedupv1.CheckRequest{Namespace: ns, Ids: ids})
	if err != nil {
		t.Fatalf("check %s: %v", ns, err)
	}
	var out []dedupv1.CheckResult_Code
	for _, r := range resp.Results {
		out = append(out, r.Code)
	}
	return out
}

func backup(t *testing.T, ctx context.Context, cc *grpc.ClientConn) ([]byte, uint64) {
	t.Helper()
	st, err := dedupv1.NewOpsClient(cc).Backup(ctx, &dedupv1.BackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var index uint64
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("backup stream: %v", err)
		}
		if buf.Len() == 0 {
			index = ch.Index
		}
		buf.Write(ch.Data)
	}
	return buf.Bytes(), index
}

// TestBackupRestoreSeedsNewCluster: a backup taken from a running node
// seeds a new node that answers exactly as the old cluster did, applies
// new writes (its log continues after the backup's index), survives a
// restart, and brings a joining node up to date.
func TestBackupRestoreSeedsNewCluster(t *testing.T) {
	ctx := callCtx(t)
	a := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"a1"}}).nodes[0].srv
	waitHealthy(t, a)
	ccA := dialPlain(t, a.GRPCAddr())
	dA := dedupv1.NewDedupClient(ccA)
	if _, err := dedupv1.NewAdminClient(ccA).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{Name: "orders", ExpiryMode: dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING}}); err != nil {
		t.Fatal(err)
	}
	ids := idList("m", 300)
	markAll(t, ctx, dA, "", ids[:200], "t1")
	markAll(t, ctx, dA, "orders", ids[100:], "t2")
	if _, err := dA.Forget(ctx, &dedupv1.ForgetRequest{Namespace: "orders", Ids: ids[100:110]}); err != nil {
		t.Fatal(err)
	}
	wantDefault, wantOrders := answers(t, ctx, dA, "", ids), answers(t, ctx, dA, "orders", ids)

	data, index := backup(t, ctx, ccA)
	if index == 0 || len(data) < 100 {
		t.Fatalf("backup: %d bytes, index %d", len(data), index)
	}

	// A damaged backup is refused whole.
	bad := append([]byte(nil), data...)
	bad[len(bad)/2] ^= 0xff
	raftLn := listenTCP(t)
	if _, err := cluster.SeedFromBackup(filepath.Join(t.TempDir(), "bad"), "b1", raftLn.Addr().String(), bytes.NewReader(bad), nil); err == nil {
		t.Fatal("a corrupted backup was accepted")
	}

	// A new cluster seeded from the backup (devcluster.Config.Backup:
	// cluster.SeedFromBackup into b1's empty data dir, then b1 starts alone).
	tb := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"b1"}, backup: data})
	b := tb.nodes[0].srv
	if seeded := tb.c.Seeded(); seeded.Index != index {
		t.Fatalf("seeded at index %d, backup at %d", seeded.Index, index)
	}
	if _, err := cluster.SeedFromBackup(tb.c.DataDir(0), "b1", b.RaftAddr(), bytes.NewReader(data), nil); err == nil {
		t.Fatal("seeding a data dir that has state succeeded")
	}
	waitHealthy(t, b)
	ccB := dialPlain(t, b.GRPCAddr())
	dB := dedupv1.NewDedupClient(ccB)
	compare := func(what string, d dedupv1.DedupClient) {
		t.Helper()
		for _, c := range []struct {
			ns   string
			want []dedupv1.CheckResult_Code
		}{{"", wantDefault}, {"orders", wantOrders}} {
			got := answers(t, ctx, d, c.ns, ids)
			for i := range ids {
				if got[i] != c.want[i] {
					t.Fatalf("%s: %s/%s answers %v, the original cluster %v", what, c.ns, ids[i], got[i], c.want[i])
				}
			}
		}
	}
	compare("restored node", dB)
	ns, err := dedupv1.NewAdminClient(ccB).DescribeNamespace(ctx, &dedupv1.DescribeNamespaceRequest{Name: "orders"})
	if err != nil || ns.Namespace.ExpiryMode != dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING {
		t.Fatalf("restored namespace settings: %v %v", ns, err)
	}
	// New writes apply: the log continues past the backup's index.
	fresh := idList("after-restore", 5)
	for _, code := range markAll(t, ctx, dB, "", fresh, "t3") {
		if code != dedupv1.MarkResult_NEW {
			t.Fatalf("mark after restore: %v", code)
		}
	}
	for _, code := range markAll(t, ctx, dB, "", ids[:3], "t4") {
		if code != dedupv1.MarkResult_DUPLICATE {
			t.Fatalf("re-mark of a restored ID: %v", code)
		}
	}
	for _, code := range answers(t, ctx, dB, "", fresh) {
		if code != dedupv1.CheckResult_SEEN {
			t.Fatalf("write after restore not seen: %v", code)
		}
	}
	if b.Node().FSM().AppliedIndex() <= index {
		t.Fatalf("applied index %d not past the backup's %d", b.Node().FSM().AppliedIndex(), index)
	}

	// The restored node restarts from its own state (same addresses and
	// data dir).
	tb.close(tb.nodes[0])
	if t.Failed() {
		return
	}
	tb.start(tb.nodes[0])
	b = tb.nodes[0].srv
	waitHealthy(t, b)
	compare("restored node after a restart", dedupv1.NewDedupClient(dialPlain(t, b.GRPCAddr())))

	// A node joining the restored cluster catches up (by snapshot).
	c := tb.add(devcluster.AddConfig{ID: "c1", Join: []string{b.GRPCAddr()}}).srv
	waitHealthy(t, c)
	compare("node joined to the restored one", dedupv1.NewDedupClient(dialPlain(t, c.GRPCAddr())))
}

// TestExportStreamsLiveRecords: Export sends every live record of a
// namespace once, and nothing forgotten or of another namespace.
func TestExportStreamsLiveRecords(t *testing.T) {
	ctx := callCtx(t)
	srv := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"e1"}}).nodes[0].srv
	waitHealthy(t, srv)
	cc := dialPlain(t, srv.GRPCAddr())
	d := dedupv1.NewDedupClient(cc)
	if _, err := dedupv1.NewAdminClient(cc).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{Namespace: &dedupv1.Namespace{
		Name: "slide", ExpiryMode: dedupv1.ExpiryMode_EXPIRY_MODE_SLIDING, DefaultTtlMs: 3_600_000, MaxTtlMs: 7 * 24 * 3_600_000}}); err != nil {
		t.Fatal(err)
	}
	ids := idList("x", 2500) // more than one export chunk
	markAll(t, ctx, d, "slide", ids, "t1")
	markAll(t, ctx, d, "", idList("other", 10), "t2")
	if _, err := d.Forget(ctx, &dedupv1.ForgetRequest{Namespace: "slide", Ids: ids[:500]}); err != nil {
		t.Fatal(err)
	}
	// Sliding: re-marking with a longer TTL moves these to a later bucket.
	req := &dedupv1.MarkRequest{Namespace: "slide", RequestToken: []byte("t3"), TtlMs: 5 * 24 * 3_600_000}
	for _, id := range ids[2000:] {
		req.Items = append(req.Items, &dedupv1.MarkItem{Id: id})
	}
	if _, err := d.Mark(ctx, req); err != nil {
		t.Fatal(err)
	}

	st, err := dedupv1.NewOpsClient(cc).Export(ctx, &dedupv1.ExportRequest{Namespace: "slide"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ch.Records {
			seen[string(r.Id)]++
			if r.State != dedupv1.RecordState_RECORD_STATE_COMMITTED || r.FirstSeenUnixMs == 0 || r.ExpiresUnixMs <= r.FirstSeenUnixMs {
				t.Fatalf("exported record %+v", r)
			}
		}
	}
	if len(seen) != 2000 {
		t.Errorf("exported %d IDs, want 2000", len(seen))
	}
	for _, id := range ids[500:] {
		if seen[string(id)] != 1 {
			t.Fatalf("%s exported %d times", id, seen[string(id)])
		}
	}
	_, err = recvAll(dedupv1.NewOpsClient(cc).Export(ctx, &dedupv1.ExportRequest{Namespace: "nope"}))
	if status.Code(err) != codes.NotFound {
		t.Errorf("export of an unknown namespace: %v", err)
	}
}

func recvAll(st grpc.ServerStreamingClient[dedupv1.ExportChunk], err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += len(ch.Records)
	}
}

// TestPromoteNonVoter: Ops.Promote makes a non-voter a voter at once,
// through any node.
func TestPromoteNonVoter(t *testing.T) {
	ctx := callCtx(t)
	tc := startCluster(t, clusterOpts{n: 1, nodeIDs: []string{"p1"}, dcTune: func(i int, c *server.Config) {
		if i == 0 {
			c.Cluster.PromoteAfter = time.Hour // no automatic promotion
		}
	}})
	a := tc.nodes[0].srv
	waitHealthy(t, a)
	b := tc.add(devcluster.AddConfig{ID: "p2", Join: []string{a.GRPCAddr()}}).srv
	waitHealthy(t, b)
	suffrage := func() string {
		st, err := a.Node().Status()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.ID == "p2" {
				return m.Suffrage
			}
		}
		return ""
	}
	if s := suffrage(); s != "nonvoter" {
		t.Fatalf("p2 is %q before promotion", s)
	}
	// Through the follower: forwarded to the leader.
	ops := dedupv1.NewOpsClient(dialPlain(t, b.GRPCAddr()))
	if _, err := ops.Promote(ctx, &dedupv1.PromoteRequest{NodeId: "p2"}); err != nil {
		t.Fatal(err)
	}
	if s := suffrage(); s != "voter" {
		t.Fatalf("p2 is %q after promotion", s)
	}
	if _, err := ops.Promote(ctx, &dedupv1.PromoteRequest{NodeId: "p2"}); err != nil {
		t.Errorf("promoting a voter again: %v", err)
	}
	if _, err := ops.Promote(ctx, &dedupv1.PromoteRequest{NodeId: "nobody"}); status.Code(err) != codes.NotFound {
		t.Errorf("promote unknown node: %v", err)
	}
	if _, err := ops.Promote(ctx, &dedupv1.PromoteRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("promote without id: %v", err)
	}
}

// TestRemoveLeaderUnderLoad: removing the leader while clients write
// fails no client call and loses no acknowledged mark.
func TestRemoveLeaderUnderLoad(t *testing.T) {
	tc := startCluster(t, clusterOpts{n: 3, nodeIDs: []string{"r1", "r2", "r3"}})
	srvs, addrs := tc.c.Servers(), tc.c.Addrs()
	waitHealthy(t, srvs...)
	var leader *server.Server
	for _, s := range srvs {
		if s.Node().IsLeader() {
			leader = s
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}

	ctx := callCtx(t)
	cl, err := client.New(ctx, addrs, client.WithTimeout(5*time.Second), client.WithRetry(100, 50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	var (
		stop     atomic.Bool
		failures atomic.Int64
		mu       sync.Mutex
		acked    [][]byte
		wg       sync.WaitGroup
		progress atomic.Int64
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := []byte(fmt.Sprintf("w%d-%05d", w, i))
				res, err := cl.Mark(ctx, "", []client.Item{{ID: id}}, 0)
				if err != nil || res[0].Code != client.CodeNew {
					failures.Add(1)
					t.Errorf("mark %s: %v %v", id, res, err)
					continue
				}
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
				progress.Add(1)
			}
		}()
	}
	// A Fatal below must not end the test while the writers still report
	// to it ("Fail in goroutine after TestRemoveLeaderUnderLoad has
	// completed" crashes the whole test binary).
	defer func() { stop.Store(true); wg.Wait() }()
	waitFor(t, 30*time.Second, "writes flowing", func() bool { return progress.Load() > 50 })
	if err := cl.Remove(ctx, leader.Node().ID()); err != nil {
		t.Fatalf("remove leader %s: %v", leader.Node().ID(), err)
	}
	before := progress.Load()
	waitFor(t, 60*time.Second, "writes continuing after the leader's removal", func() bool { return progress.Load() > before+100 })
	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d client calls failed", n)
	}
	var rest []*server.Server
	for _, s := range srvs {
		if s != leader {
			rest = append(rest, s)
		}
	}
	st, err := rest[0].Node().Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.ID == leader.Node().ID() {
			t.Fatalf("removed leader still a member: %+v", st.Members)
		}
	}
	d := dedupv1.NewDedupClient(dialPlain(t, rest[0].GRPCAddr()))
	for lo := 0; lo < len(acked); lo += 1000 {
		batch := acked[lo:min(lo+1000, len(acked))]
		for i, code := range answers(t, ctx, d, "", batch) {
			if code != dedupv1.CheckResult_SEEN {
				t.Fatalf("acknowledged mark %s lost: %v", batch[i], code)
			}
		}
	}
	t.Logf("%d marks acknowledged across the removal of leader %s", len(acked), leader.Node().ID())
}
