package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// A run against a read replica with CreateNamespace waits until the
// replica has applied the namespace the leader created before measuring:
// no call fails with "namespace not found". The replica's Raft traffic is
// cut until the leader knows the namespace, so without the wait the run
// would start while the replica cannot know it.
func TestRunWaitsForReplicaToKnowNewNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nodes")
	}
	cl := testcluster.New(t, devcluster.Config{Nodes: 1, RaftProxies: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := cl.Add(ctx, devcluster.AddConfig{ID: "r1", ReadReplica: true})
	if err != nil {
		t.Fatal(err)
	}
	replica := cl.Server(r)
	testcluster.WaitFor(t, 30*time.Second, "r1 healthy", func() bool { return replica.Node().Healthy() })
	if err := cl.Cut(r); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = cl.Heal(r)
		}
	}()
	type out struct {
		res *Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := Run(ctx, Config{
			Addrs: []string{replica.GRPCAddr()}, Namespace: "bench", Workload: CheckMiss,
			Consistency: "bounded", MaxStaleness: 5 * time.Second,
			Concurrency: 4, Batch: 8, Count: 400, CreateNamespace: true,
		})
		done <- out{res, err}
	}()
	leader := testcluster.Client(t, []string{cl.Server(0).GRPCAddr()})
	testcluster.WaitFor(t, 60*time.Second, "the leader to know namespace bench", func() bool {
		_, err := leader.DescribeNamespace(ctx, "bench")
		return err == nil
	})
	if err := cl.Heal(r); err != nil {
		t.Fatal(err)
	}
	healed = true
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.Errors != 0 || o.res.IDs != 400 {
		t.Fatalf("ids %d errors %d note %q", o.res.IDs, o.res.Errors, o.res.Note)
	}
}
