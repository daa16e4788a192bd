package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

func TestFreshIDsUniqueAndSized(t *testing.T) {
	seed := uint64(42)
	seen := map[string]bool{}
	for w := 0; w < 8; w++ {
		g := NewIDGen(seed, w, 16)
		for i := 0; i < 5000; i++ {
			id := g.Fresh(nil)
			if len(id) != 16 {
				t.Fatalf("id size %d, want 16", len(id))
			}
			if seen[string(id)] {
				t.Fatalf("worker %d: fresh id %x repeated", w, id)
			}
			seen[string(id)] = true
		}
	}
	// Uniqueness holds for 8-byte IDs too: the head is a bijection.
	seen8 := map[string]bool{}
	for w := 0; w < 4; w++ {
		g := NewIDGen(seed, w, 8)
		for i := 0; i < 5000; i++ {
			id := string(g.Fresh(nil))
			if seen8[id] {
				t.Fatalf("8-byte fresh id repeated")
			}
			seen8[id] = true
		}
	}
	// Odd sizes are filled completely.
	g := NewIDGen(seed, 0, 37)
	if id := g.Fresh(make([]byte, 0, 64)); len(id) != 37 {
		t.Fatalf("size %d, want 37", len(id))
	}
}

func TestIDsDifferAcrossSeeds(t *testing.T) {
	a := NewIDGen(1, 0, 16).Fresh(nil)
	b := NewIDGen(2, 0, 16).Fresh(nil)
	if bytes.Equal(a, b) {
		t.Fatal("different seeds gave the same first id")
	}
	c := NewIDGen(1, 0, 16).Fresh(nil)
	if !bytes.Equal(a, c) {
		t.Fatal("same seed and worker should give the same sequence")
	}
}

func TestMixedRepeatsOnlyEarlierBatches(t *testing.T) {
	g := NewIDGen(7, 3, 16)
	batch := make([][]byte, 16)
	isDup := make([]bool, 16)
	// First batch: nothing earlier, so no repeats.
	if d := g.Mixed(batch, isDup, 0.9); d != 0 {
		t.Fatalf("first batch had %d repeats", d)
	}
	earlier := map[string]bool{}
	for _, id := range batch {
		earlier[string(id)] = true
	}
	total, dups := 0, 0
	for round := 0; round < 200; round++ {
		d := g.Mixed(batch, isDup, 0.3)
		inBatch := map[string]bool{}
		n := 0
		for i, id := range batch {
			if isDup[i] {
				n++
				if !earlier[string(id)] {
					t.Fatalf("repeat %x was not handed out earlier", id)
				}
			} else if earlier[string(id)] || inBatch[string(id)] {
				t.Fatalf("fresh id %x is not fresh", id)
			}
			inBatch[string(id)] = true
		}
		if n != d {
			t.Fatalf("Mixed said %d repeats, flags say %d", d, n)
		}
		for id := range inBatch {
			earlier[id] = true
		}
		total += len(batch)
		dups += d
	}
	ratio := float64(dups) / float64(total)
	if ratio < 0.2 || ratio > 0.4 {
		t.Fatalf("repeat ratio %.3f, want about 0.3", ratio)
	}
}

func TestRecorderQuantilesAndMerge(t *testing.T) {
	a, b := NewRecorder(), NewRecorder()
	for i := 1; i <= 100; i++ {
		a.Observe(time.Duration(i)*time.Millisecond, 16)
	}
	b.Observe(10*time.Second, 16)
	b.Fail("Unavailable")
	b.Outcome("NEW", 16)
	a.Merge(b)
	if a.Calls != 101 || a.IDs != 101*16 || a.Errors != 1 || a.Outcomes["NEW"] != 16 || a.ErrKinds["Unavailable"] != 1 {
		t.Fatalf("merge: %+v", a)
	}
	p50 := a.Quantile(50)
	if p50 < 49 || p50 > 52 {
		t.Fatalf("p50 %.3f ms, want about 51", p50)
	}
	if p999 := a.Quantile(99.9); p999 < 9990 || p999 > 10010 {
		t.Fatalf("p99.9 %.3f ms, want about 10000", p999)
	}
	var res Result
	Summarize(&res, a, 2*time.Second)
	if res.IDsPerSec != float64(101*16)/2 || res.CallsPerSec != 50.5 || res.Errors != 1 {
		t.Fatalf("summary: %+v", res)
	}
	// Sub-microsecond and huge values are clamped, not dropped.
	c := NewRecorder()
	c.Observe(0, 1)
	c.Observe(time.Hour, 1)
	if c.Calls != 2 || c.Quantile(100) < 299_000 {
		t.Fatalf("clamping: calls %d, max %.1f ms", c.Calls, c.Quantile(100))
	}
}

func TestResultJSONFields(t *testing.T) {
	var res Result
	r := NewRecorder()
	r.Observe(time.Millisecond, 4)
	Summarize(&res, r, time.Second)
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ids_per_sec", "calls_per_sec", "p50_ms", "p99_ms", "errors"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, buf.String())
		}
	}
	buf.Reset()
	if err := res.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "IDs/s") {
		t.Fatalf("table: %v %q", err, buf.String())
	}
}

func TestRunLoopCountMode(t *testing.T) {
	var mu sync.Mutex
	total := 0
	lr, err := RunLoop(context.Background(), Spec{Concurrency: 4, Batch: 16, Count: 1000},
		func(w int) (Op, error) {
			return func(ctx context.Context, n int, tl *Tally) (int, int, error) {
				mu.Lock()
				total += n
				mu.Unlock()
				tl.Add("NEW", int64(n))
				return n, 1, nil
			}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if lr.Rec.IDs != 1000 || total != 1000 || lr.Rec.Outcomes["NEW"] != 1000 {
		t.Fatalf("count mode measured %d IDs, sent %d, outcomes %v", lr.Rec.IDs, total, lr.Rec.Outcomes)
	}
	if lr.Rec.Calls != 63 { // 62 full batches of 16 and one of 8
		t.Fatalf("calls %d, want 63", lr.Rec.Calls)
	}
}

func TestRunLoopStopsOnErrors(t *testing.T) {
	lr, err := RunLoop(context.Background(), Spec{Concurrency: 2, Batch: 1, Duration: time.Minute, MaxErrors: 5},
		func(w int) (Op, error) {
			return func(ctx context.Context, n int, tl *Tally) (int, int, error) {
				return 0, 0, status.Error(codes.Unavailable, "no leader")
			}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if lr.Stopped == "" || !strings.Contains(lr.FirstError, "no leader") {
		t.Fatalf("want an early stop with the error, got %+v", lr)
	}
}

// startNode starts one real dedupnode node (testcluster.Start: Raft,
// Pebble, gRPC on loopback) and returns its gRPC address once it is a
// ready leader.
func startNode(t *testing.T) string {
	t.Helper()
	srvs, _ := testcluster.Start(t, 1, nil)
	return srvs[0].GRPCAddr()
}

func TestRunAgainstRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := startNode(t)
	for _, wl := range Workloads {
		t.Run(wl, func(t *testing.T) {
			res, err := Run(context.Background(), Config{
				Addrs: []string{addr}, Namespace: "bench", Workload: wl,
				Concurrency: 4, Batch: 8, Count: 800, Preload: 500, CreateNamespace: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.IDs != 800 {
				t.Fatalf("%s: ids %d errors %d note %q", wl, res.IDs, res.Errors, res.Note)
			}
			if res.Unexpected != 0 {
				t.Fatalf("%s: %d unexpected answers: %v", wl, res.Unexpected, res.Outcomes)
			}
			if wl == MarkMixed && res.Outcomes["DUPLICATE"] == 0 {
				t.Fatalf("mark-mixed produced no duplicates: %v", res.Outcomes)
			}
		})
	}
}

// TestRunCoalescedAgainstRealNode: with Coalesce every caller's IDs go
// through one client.Batcher, which merges the concurrent single-ID calls
// (32 in flight here, at most 4 RPCs) into fewer RPCs; answers stay right.
func TestRunCoalescedAgainstRealNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr := startNode(t)
	for _, wl := range coalesceWorkloads {
		t.Run(wl, func(t *testing.T) {
			res, err := Run(context.Background(), Config{
				Addrs: []string{addr}, Namespace: "bench", Workload: wl, Coalesce: true,
				Concurrency: 4, Batch: 8, Count: 800, Preload: 500, CreateNamespace: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.IDs != 800 || res.Unexpected != 0 {
				t.Fatalf("%s: ids %d errors %d unexpected %d (%v) note %q", wl, res.IDs, res.Errors, res.Unexpected, res.Outcomes, res.Note)
			}
			if res.Variant != "coalesced" || res.RPCs == 0 || res.RPCItems < res.IDs {
				t.Fatalf("%s: variant %q, %d RPCs carrying %d IDs for %d measured IDs", wl, res.Variant, res.RPCs, res.RPCItems, res.IDs)
			}
			if res.RPCs >= res.RPCItems {
				t.Fatalf("%s: %d RPCs for %d IDs: nothing was coalesced", wl, res.RPCs, res.RPCItems)
			}
		})
	}
	_, err := Run(context.Background(), Config{Addrs: []string{addr}, Workload: ClaimCommit, Coalesce: true, Count: 8})
	if err == nil || !strings.Contains(err.Error(), "cannot be coalesced") {
		t.Fatalf("claim-commit with Coalesce: want a cannot-be-coalesced error, got %v", err)
	}
}

// startWithReplica starts a one-voter cluster with Raft proxies and a read
// replica r1, and returns it with the replica's index once it is healthy.
func startWithReplica(t *testing.T, ctx context.Context) (*devcluster.Cluster, int) {
	t.Helper()
	cl := testcluster.New(t, devcluster.Config{Nodes: 1, RaftProxies: true})
	r, err := cl.Add(ctx, devcluster.AddConfig{ID: "r1", ReadReplica: true})
	if err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 30*time.Second, "r1 healthy", func() bool { return cl.Server(r).Node().Healthy() })
	return cl, r
}

// A run against a read replica of a fresh cluster, with CreateNamespace
// and bounded checks: no call fails with "namespace not found" (the run
// waits until the replica applied the namespace the leader created).
func TestRunAgainstReplicaCreatesNamespaceFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nodes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, r := startWithReplica(t, ctx)
	res, err := Run(ctx, Config{
		Addrs: []string{cl.Server(r).GRPCAddr()}, Namespace: "bench", Workload: CheckMiss,
		Consistency: "bounded", MaxStaleness: 5 * time.Second,
		Concurrency: 4, Batch: 8, Count: 400, CreateNamespace: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.IDs != 400 {
		t.Fatalf("ids %d errors %d note %q", res.IDs, res.Errors, res.Note)
	}
}

// waitNamespace returns only once every target node knows the namespace:
// a replica whose Raft traffic is cut while the leader creates it is
// waited for until it is healed and has applied it.
func TestWaitNamespaceWaitsForTheReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nodes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, r := startWithReplica(t, ctx)
	replica := cl.Server(r).GRPCAddr()
	if err := cl.Cut(r); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = cl.Heal(r)
		}
	}()
	leader := testcluster.Client(t, []string{cl.Server(0).GRPCAddr()})
	if err := EnsureNamespace(ctx, leader, "bench", time.Hour); err != nil {
		t.Fatal(err)
	}
	ns, err := dial(ctx, []string{replica}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.close()
	done := make(chan error, 1)
	go func() { done <- ns.waitNamespace(ctx, "bench", 60*time.Second) }()
	// The replica cannot know the namespace yet: the wait is still on.
	probe := [][]byte{[]byte("x")}
	if _, err := ns.get(0).c.CheckAt(ctx, replica, "bench", probe, client.Stale); !errors.Is(err, client.ErrNamespaceNotFound) {
		t.Fatalf("cut replica: check = %v, want namespace not found", err)
	}
	select {
	case err := <-done:
		t.Fatalf("waitNamespace returned (%v) while the replica could not know the namespace", err)
	default:
	}
	if err := cl.Heal(r); err != nil {
		t.Fatal(err)
	}
	healed = true
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := ns.get(0).c.CheckAt(ctx, replica, "bench", probe, client.Stale); err != nil {
		t.Fatalf("after the wait: check at the replica = %v", err)
	}
}
