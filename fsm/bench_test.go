package fsm

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
)

// BenchmarkApplyMarkNew applies entries of 1000 new 16-byte IDs, 64 entries
// per ApplyBatch as Raft delivers them. Reported per ID.
func BenchmarkApplyMarkNew(b *testing.B) {
	f := newBenchFSM(b, Config{Dir: b.TempDir(), Bloom: bloom.Config{ExpectedPerBucket: 1 << 20}})
	const perEntry, perBatch = 1000, 64
	var index uint64
	id := make([]byte, 16)
	mkLog := func() *raft.Log {
		op := Op{Kind: OpMark, Items: make([]Item, perEntry)}
		for i := range op.Items {
			index++
			binary.BigEndian.PutUint64(id, index*2654435761)
			binary.BigEndian.PutUint64(id[8:], index)
			op.Items[i].ID = append([]byte(nil), id...)
		}
		return logOf(index, &Command{TimestampMs: t0, Ops: []Op{op}})
	}
	applyTimed(b, f, perEntry, perBatch, mkLog)
}

// BenchmarkApplyMarkNewRandom is the replicated workload as the FSM sees
// it: random 16-byte IDs with a 16-byte request token, 200 IDs per entry,
// 4 entries per ApplyBatch, timestamps advancing so that `buckets` expiry
// buckets are live (each lookup probes that many Bloom filter chains).
// cpu-ns/id counts the whole process (Pebble flushes and compactions too),
// measured with getrusage.
//
//	go test ./fsm -run '^$' -bench ApplyMarkNewRandom -benchtime 1000000x
func BenchmarkApplyMarkNewRandom(b *testing.B) {
	for _, buckets := range []int{1, 24} {
		b.Run(fmt.Sprintf("buckets=%d", buckets), func(b *testing.B) {
			benchApplyRandom(b, buckets)
		})
	}
}

func benchApplyRandom(b *testing.B, buckets int) {
	f := newBenchFSM(b, Config{Dir: b.TempDir()})
	const perEntry, perBatch = 200, 4
	width := DefaultNamespaceConfig("x").BucketWidthMs
	rng := rand.New(rand.NewPCG(1, 2))
	var index uint64
	ts := t0
	mkLog := func() *raft.Log {
		index++
		return randomMarkLog(rng, index, ts, perEntry)
	}
	// Fill buckets-1 earlier buckets (1 000 IDs each) so they are live.
	for i := 1; i < buckets; i++ {
		for range 5 {
			f.ApplyBatch([]*raft.Log{mkLog()})
		}
		ts += width
	}
	applyTimed(b, f, perEntry, perBatch, mkLog)
}

// applyTimed is a benchmark's measured part: ApplyBatch calls of perBatch
// entries from mkLog (made outside the timer), perEntry IDs each, until
// b.N IDs; whole-process CPU per ID reported as cpu-ns/id.
func applyTimed(b *testing.B, f *FSM, perEntry, perBatch int, mkLog func() *raft.Log) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for n := 0; n < b.N; n += perEntry * perBatch {
		b.StopTimer()
		logs := make([]*raft.Log, perBatch)
		for i := range logs {
			logs[i] = mkLog()
		}
		b.StartTimer()
		f.ApplyBatch(logs)
	}
	b.StopTimer()
	cpu.report(b, f)
}

// randomMarkLog is log entry index: a Mark of n random 16-byte IDs sharing
// one random request token, at ts, as a client's batch replicates.
func randomMarkLog(rng *rand.Rand, index uint64, ts int64, n int) *raft.Log {
	op := Op{Kind: OpMark, Items: make([]Item, n)}
	tok := make([]byte, 16)
	binary.BigEndian.PutUint64(tok, rng.Uint64())
	for i := range op.Items {
		op.Items[i] = Item{ID: randomID(rng), Token: tok}
	}
	return logOf(index, &Command{TimestampMs: ts, Ops: []Op{op}})
}

// randomID is a random 16-byte message ID.
func randomID(rng *rand.Rand) []byte {
	id := make([]byte, 16)
	binary.BigEndian.PutUint64(id, rng.Uint64())
	binary.BigEndian.PutUint64(id[8:], rng.Uint64())
	return id
}

// BenchmarkApplyMarkNewAgedBuckets is the steady state of a namespace
// with the default 24 h TTL: new IDs marked while 24 earlier buckets are
// full (200k random IDs each, sized Bloom filters), so about one new ID
// in five has a candidate bucket whose filter cannot rule it out, and its
// lookup reads storage. With windows of 2^13 records each full bucket
// holds 25 of them, as a bucket of 25M IDs would with windows of 2^20
// records (the layout of 0d70e03), and each such lookup seeks all 25.
// reads-storage/id is the share of new IDs whose lookup read storage.
//
//	go test ./fsm -run '^$' -bench ApplyMarkNewAgedBuckets -benchtime 400000x
func BenchmarkApplyMarkNewAgedBuckets(b *testing.B) {
	runWithWindows(b, benchAgedBuckets, windowShift, 13)
}

func benchAgedBuckets(b *testing.B, shift uint8) {
	const perBucket, buckets, perEntry, perBatch = 200_000, 24, 200, 4
	f := newBenchFSM(b, Config{Dir: b.TempDir(), Bloom: bloom.Config{ExpectedPerBucket: perBucket}, windowShift: shift})
	width := DefaultNamespaceConfig("x").BucketWidthMs
	rng := rand.New(rand.NewPCG(1, 2))
	var index uint64
	ts := t0
	mkLog := func() *raft.Log {
		index++
		return randomMarkLog(rng, index, ts, perEntry)
	}
	for range buckets {
		for range perBucket / perEntry {
			f.ApplyBatch([]*raft.Log{mkLog()})
		}
		ts += width // the next IDs expire in the next bucket
	}
	commitBuffer(f)
	if err := f.db.Flush(); err != nil {
		b.Fatal(err)
	}
	maybe := f.filters.Stats().MaybeLookups
	applyTimed(b, f, perEntry, perBatch, mkLog)
	b.ReportMetric(float64(f.filters.Stats().MaybeLookups-maybe)/float64(b.N), "reads-storage/id")
}

// BenchmarkApplyMarkDuplicates is a redelivery storm as the FSM sees it:
// Marks of IDs already stored (1M random 16-byte IDs, committed and
// flushed to sstables first), 200 per entry, 4 entries per ApplyBatch, in
// random order, so every lookup reads the database. Reported per ID,
// whole-process CPU in cpu-ns/id.
//
//	go test ./fsm -run '^$' -bench ApplyMarkDuplicates -benchtime 400000x
func BenchmarkApplyMarkDuplicates(b *testing.B) {
	// The 1M IDs in one write window (the default size), and in 8 (a
	// window of 2^17 records): each lookup then seeks the windows newest
	// first until it finds its ID, 4.5 seeks on average.
	runWithWindows(b, benchMarkDuplicates, windowShift, 17)
}

// runWithWindows runs bench once per window size (log2 records), as
// sub-benchmarks named by the size.
func runWithWindows(b *testing.B, bench func(*testing.B, uint8), shifts ...uint8) {
	for _, shift := range shifts {
		b.Run(fmt.Sprintf("window=2^%d", shift), func(b *testing.B) { bench(b, shift) })
	}
}

func benchMarkDuplicates(b *testing.B, shift uint8) {
	f := newBenchFSM(b, Config{Dir: b.TempDir(), Bloom: bloom.Config{ExpectedPerBucket: 1 << 20}, windowShift: shift})
	const stored, perEntry, perBatch = 1_000_000, 200, 4
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([][]byte, stored)
	for i := range ids {
		ids[i] = randomID(rng)
	}
	var index uint64
	mkLog := func(next func() []byte) *raft.Log {
		op := Op{Kind: OpMark, Items: make([]Item, perEntry)}
		tok := make([]byte, 16)
		binary.BigEndian.PutUint64(tok, rng.Uint64())
		for i := range op.Items {
			op.Items[i] = Item{ID: next(), Token: tok}
		}
		index++
		return logOf(index, &Command{TimestampMs: t0, Ops: []Op{op}})
	}
	n := 0
	for n < stored {
		f.ApplyBatch([]*raft.Log{mkLog(func() []byte { n++; return ids[n-1] })})
	}
	commitBuffer(f)
	if err := f.db.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for n := 0; n < b.N; n += perEntry * perBatch {
		b.StopTimer()
		logs := make([]*raft.Log, perBatch)
		for i := range logs {
			logs[i] = mkLog(func() []byte { return ids[rng.IntN(stored)] })
		}
		b.StartTimer()
		for i, r := range f.ApplyBatch(logs) {
			if res := r.(*ApplyResult).Ops[0].Items[0]; res.Code != CodeDuplicate {
				b.Fatalf("entry %d: first item answered %v, want a duplicate", i, res.Code)
			}
		}
	}
	b.StopTimer()
	cpu.report(b, f)
}

// cpuMeter measures process CPU (user+system) over a benchmark, so that
// background work (Pebble flushes, compactions) is counted.
type cpuMeter struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuMeter { return cpuMeter{processCPU()} }

// report flushes the memtable (its cost belongs to the IDs written) and
// reports process CPU per b.N.
func (c cpuMeter) report(b *testing.B, f *FSM) {
	commitBuffer(f)
	_ = f.db.Flush()
	b.ReportMetric(float64((processCPU()-c.start).Nanoseconds())/float64(b.N), "cpu-ns/id")
}

// commitBuffer commits f's write buffer (its cost belongs to the IDs in it).
func commitBuffer(f *FSM) {
	f.mu.Lock()
	f.flushLocked()
	f.mu.Unlock()
}

// BenchmarkCheckMiss measures a Check of an absent ID among 100k stored.
func BenchmarkCheckMiss(b *testing.B) {
	f := newBenchFSM(b, Config{Dir: b.TempDir()})
	op := Op{Kind: OpMark}
	for i := range 100_000 {
		op.Items = append(op.Items, Item{ID: fmt.Appendf(nil, "present-%08d", i)})
	}
	f.Apply(logOf(1, &Command{TimestampMs: t0, Ops: []Op{op}}))
	ids := [][]byte{[]byte("absent-00000000")}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint32(ids[0][7:], uint32(i))
		if _, err := f.Check("", ids, t0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckMiss16 measures Checks of 16 absent IDs, as a client's
// batch, among 2M stored in one growing bucket (a chain of several
// filter segments, larger than the CPU's L2).
func BenchmarkCheckMiss16(b *testing.B) {
	f := newBenchFSM(b, Config{Dir: b.TempDir()})
	for e := range 200 {
		op := Op{Kind: OpMark}
		for i := range 10_000 {
			op.Items = append(op.Items, Item{ID: fmt.Appendf(nil, "present-%08d", e*10_000+i)})
		}
		f.Apply(logOf(uint64(e+1), &Command{TimestampMs: t0, Ops: []Op{op}}))
	}
	ids := make([][]byte, 16)
	for i := range ids {
		ids[i] = []byte("absent-0000000000")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, id := range ids {
			binary.BigEndian.PutUint64(id[7:], uint64(i*16+j))
		}
		if _, err := f.Check("", ids, t0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckHit16 measures Checks of 16 stored IDs, as a client's
// batch of redeliveries, among 1M random IDs committed and flushed to
// sstables: every ID is read from Pebble. Reported per ID.
func BenchmarkCheckHit16(b *testing.B) {
	f := newBenchFSM(b, Config{Dir: b.TempDir(), Bloom: bloom.Config{ExpectedPerBucket: 1 << 20}})
	const stored = 1_000_000
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([][]byte, stored)
	for i := range ids {
		ids[i] = randomID(rng)
	}
	for e := range stored / 10_000 {
		op := Op{Kind: OpMark, Items: make([]Item, 10_000)}
		for i := range op.Items {
			op.Items[i].ID = ids[e*10_000+i]
		}
		f.Apply(logOf(uint64(e+1), &Command{TimestampMs: t0, Ops: []Op{op}}))
	}
	commitBuffer(f)
	if err := f.db.Flush(); err != nil {
		b.Fatal(err)
	}
	batch := make([][]byte, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(batch) {
		for j := range batch {
			batch[j] = ids[rng.IntN(stored)]
		}
		res, err := f.Check("", batch, t0)
		if err != nil {
			b.Fatal(err)
		}
		if res[0].Code != CodeSeen {
			b.Fatalf("a stored ID answered %v", res[0].Code)
		}
	}
}

func BenchmarkDecodeCommand(b *testing.B) {
	op := Op{Kind: OpMark, Items: make([]Item, 16)}
	for i := range op.Items {
		op.Items[i] = Item{ID: fmt.Appendf(nil, "%016d", i), Token: []byte("0123456789abcdef")}
	}
	data := AppendCommand(nil, &Command{TimestampMs: t0, Ops: []Op{op}})
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeCommand(data); err != nil {
			b.Fatal(err)
		}
	}
}

// newBenchFSM opens an FSM for a benchmark, closed when it ends, and
// waits for its Bloom filters to be ready.
func newBenchFSM(b *testing.B, cfg Config) *FSM {
	f, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	waitReadyB(b, f)
	return f
}

func waitReadyB(b *testing.B, f *FSM) {
	deadline := time.Now().Add(time.Minute)
	for !f.filters.Ready() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkApplyMarkNew3FSMs applies one log of random 16-byte IDs (with a
// request token) to three FSMs at once, as the three replicas of a cluster
// on one machine do: they share its caches and cores. cpu-ns/id is process
// CPU summed over the three, Pebble's flushes and compactions included.
//
//	go test ./fsm -run '^$' -bench ApplyMarkNew3FSMs -benchtime 1500000x
func BenchmarkApplyMarkNew3FSMs(b *testing.B) {
	var fs []*FSM
	for range 3 {
		f := newBenchFSM(b, Config{Dir: b.TempDir()})
		fs = append(fs, f)
	}
	const perEntry = 250 // about what group commit puts in one entry at 50 callers × 16 IDs
	rng := rand.New(rand.NewPCG(1, 2))
	var logs []*raft.Log
	for n, index := 0, uint64(1); n < b.N; n, index = n+perEntry, index+1 {
		logs = append(logs, randomMarkLog(rng, index, t0, perEntry))
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, l := range logs {
				f.ApplyBatch([]*raft.Log{l})
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	for _, f := range fs[1:] {
		commitBuffer(f)
		_ = f.db.Flush()
	}
	cpu.report(b, fs[0])
}
