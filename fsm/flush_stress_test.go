package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dedupnode/dedupnode/bloom"
	"github.com/dedupnode/dedupnode/internal/longtest"
)

// TestBackgroundCommitsUnderReadersCompactionsAndRestores: applies with
// tiny buffers (so a background commit is nearly always in flight, each
// one slowed down at random), while other goroutines Check, compact Bloom
// chains and take digests; snapshots and restores on the apply goroutine. After every
// batch the FSM answers every Check exactly as a reference replica does
// (a Bloom false negative, a lost or resurrected record would differ),
// and at the end both digests agree. Two seeds (a chain with a hash log,
// one without) of 600 entries by default; three of 1200 as a long test
// (longtest): the readers and the compactor spin for as long as the
// applies take, which on two loaded cores under -race is minutes.
func TestBackgroundCommitsUnderReadersCompactionsAndRestores(t *testing.T) {
	seeds, entries := longtest.Pick(uint64(2), uint64(3)), longtest.Pick(600, 1200)
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1234))
			logs := randomLog(300+seed, entries)
			bcfg := Config{Bloom: bloom.Config{ExpectedPerBucket: 4}, BloomCompactInterval: -1}
			if seed%2 == 1 {
				// Compactions read storage (and the buffers in flight), as a
				// chain without a hash log is compacted.
				bcfg.Bloom.LogIDs = -1
			}
			ref := newHarnessConfig(t, bcfg)
			ref.f.cfg.Buffer = BufferLimits{MaxEntries: 1}.withDefaults()
			h := newHarnessConfig(t, bcfg)
			h.f.cfg.Buffer = BufferLimits{MaxRecords: 1 + rng.IntN(12), MaxEntries: 1 + rng.IntN(6)}.withDefaults()
			waitReady(t, ref.f)
			waitReady(t, h.f)
			f := h.f
			f.beforeFlush = func() {
				if rand.IntN(3) == 0 {
					time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				}
			}
			ids := make([][]byte, 40)
			for i := range ids {
				ids[i] = fmt.Appendf(nil, "id-%d", i)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var inflight atomic.Int64
			defer func() { t.Logf("compactor passes with a buffer in flight: %d", inflight.Load()) }()
			var swap sync.RWMutex // the compactor stands for the FSM's background: stopped around a restore
			errc := make(chan error, 16)
			// Readers.
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ns := ""
						if (i+r)%2 == 0 {
							ns = "short"
						}
						if _, err := f.Check(ns, ids[i%len(ids):], f.LastTimestamp()); err != nil && !errors.Is(err, ErrNamespaceNotFound) {
							errc <- err
							return
						}
					}
				}()
			}
			// Bloom compactor: every live bucket, again and again.
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for {
					select {
					case <-stop:
						return
					default:
					}
					swap.RLock()
					f.mu.RLock()
					var keys []bloom.Key
					for k := range f.st.registry {
						keys = append(keys, k)
					}
					if f.flushing != nil {
						inflight.Add(1)
					}
					f.mu.RUnlock()
					for _, k := range keys {
						if err := f.compactChain(ctx, k); err != nil {
							swap.RUnlock()
							errc <- err
							return
						}
					}
					swap.RUnlock()
				}
			}()
			// Digests.
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					if _, err := f.DigestState(context.Background()); err != nil && !errors.Is(err, ErrRestoring) {
						errc <- err
						return
					}
				}
			}()
			for i := 0; i < len(logs); {
				n := min(1+rng.IntN(8), len(logs)-i)
				want := fmt.Sprintf("%+v", deref(ref.f.ApplyBatch(logs[i:i+n])))
				got := fmt.Sprintf("%+v", deref(f.ApplyBatch(logs[i:i+n])))
				if got != want {
					close(stop)
					wg.Wait()
					t.Fatalf("entries %d..%d: results differ:\n%s\n%s", i+1, i+n, got, want)
				}
				i += n
				now := ref.f.LastTimestamp()
				for _, ns := range []string{"", "short"} {
					w, err1 := ref.f.Check(ns, ids, now)
					g, err2 := f.Check(ns, ids, now)
					if err1 != nil || err2 != nil {
						close(stop)
						wg.Wait()
						t.Fatal(err1, err2)
					}
					if a, b := fmt.Sprintf("%+v", g), fmt.Sprintf("%+v", w); a != b {
						close(stop)
						wg.Wait()
						t.Fatalf("after entry %d: Check %q differs:\n%s\n%s", i, ns, a, b)
					}
				}
				switch rng.IntN(40) {
				case 0:
					s, err := f.Snapshot()
					if err != nil {
						t.Fatal(err)
					}
					s.Release()
				case 1:
					swap.Lock()
					restoreFrom(t, ref.f, f)
					waitReady(t, f)
					swap.Unlock()
				}
				select {
				case err := <-errc:
					close(stop)
					wg.Wait()
					t.Fatal(err)
				default:
				}
			}
			close(stop)
			wg.Wait()
			dw, _ := ref.f.Digest()
			dg, _ := f.Digest()
			if !bytes.Equal(dw, dg) {
				t.Fatal("digests differ")
			}
		})
	}
}

// TestCrashWhileABufferIsBeingCommitted: a crash while a sealed buffer is
// being written (held before its write) reopens at the index before it,
// with exactly that prefix's state.
func TestCrashWhileABufferIsBeingCommitted(t *testing.T) {
	logs := randomLog(77, 300)
	ref := newBuffered(t, BufferLimits{}, nil)
	prefix := make([][]byte, len(logs)+1)
	for i := 0; i <= len(logs); i++ {
		if i > 0 {
			ref.ApplyBatch(logs[i-1 : i])
		}
		d, err := ref.Digest()
		if err != nil {
			t.Fatal(err)
		}
		prefix[i] = d
	}
	mem := vfs.NewCrashableMem()
	f := newBuffered(t, BufferLimits{MaxRecords: 5, MaxEntries: 7}, mem)
	dbDir := filepath.Join(f.cfg.Dir, dbDirName)
	started, release := make(chan struct{}), make(chan struct{})
	var n int
	f.beforeFlush = func() {
		n++
		if n == 6 {
			close(started)
			<-release
		}
	}
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	i := 0
loop:
	for ; i < len(logs); i++ {
		f.ApplyBatch(logs[i : i+1])
		f.mu.RLock()
		job := f.flushing
		f.mu.RUnlock()
		if job != nil {
			select {
			case <-started:
				break loop
			case <-job.done:
			}
		}
	}
	if err := f.db.LogData(nil, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	persisted := f.PersistedIndex()
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	close(release)
	g := reopenOn(t, crashed, dbDir)
	p := g.AppliedIndex()
	t.Logf("held after entry %d, persisted %d, reopened at %d", i+1, persisted, p)
	if p != persisted {
		t.Fatalf("reopened at %d, persisted index was %d", p, persisted)
	}
	if d, _ := g.Digest(); !bytes.Equal(d, prefix[p]) {
		t.Fatalf("state at %d is not the prefix's", p)
	}
}
