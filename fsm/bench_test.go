package fsm

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/bloom"
)

// BenchmarkApplyMarkNew applies entries of 1000 new 16-byte IDs, 64 entries
// per ApplyBatch as Raft delivers them. Reported per ID.
func BenchmarkApplyMarkNew(b *testing.B) {
	f, err := New(Config{Dir: b.TempDir(), Bloom: bloom.Config{ExpectedPerBucket: 1 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	waitReadyB(b, f)
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
	b.ResetTimer()
	for n := 0; n < b.N; n += perEntry * perBatch {
		b.StopTimer()
		logs := make([]*raft.Log, perBatch)
		for i := range logs {
			logs[i] = mkLog()
		}
		b.StartTimer()
		f.ApplyBatch(logs)
	}
}

// BenchmarkCheckMiss measures a Check of an absent ID among 100k stored.
func BenchmarkCheckMiss(b *testing.B) {
	f, err := New(Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	waitReadyB(b, f)
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

func waitReadyB(b *testing.B, f *FSM) {
	deadline := time.Now().Add(time.Minute)
	for !f.filters.Ready() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}
