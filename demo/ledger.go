package demo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Ledger is the consumers' side effect: account balances in a Pebble
// database. Each applied event also records its ID with the fencing token
// of the claim under which it was applied, in the same write, so the
// ledger can refuse to apply one event twice: the second, idempotency
// layer that a consumer needs for the one case no dedup store can close
// alone, a crash between the effect and the commit.
type Ledger struct {
	mu       sync.Mutex
	db       *pebble.DB
	balances map[string]int64
	applied  int64
	repeats  map[string]int // event ID → re-runs refused
}

const (
	appliedPrefix = "applied/"
	balancePrefix = "balance/"
)

// OpenLedger opens (or creates) the ledger in dir; Pebble logs to logger
// (nil: discarded).
func OpenLedger(dir string, logger *slog.Logger) (*Ledger, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLog{logger.With("component", "ledger")}})
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	return &Ledger{db: db, balances: map[string]int64{}, repeats: map[string]int{}}, nil
}

// ErrAlreadyApplied means the event's effect is in the ledger already.
var ErrAlreadyApplied = errors.New("event already applied to the ledger")

// Apply adds amount to account for event id, under the claim's fencing
// token, in one atomic write; ErrAlreadyApplied if id was applied before.
func (l *Ledger) Apply(id string, fence uint64, account string, amount int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := []byte(appliedPrefix + id)
	if _, closer, err := l.db.Get(key); err == nil {
		closer.Close()
		l.repeats[id]++
		return ErrAlreadyApplied
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	bal := l.balances[account] + amount
	b := l.db.NewBatch()
	defer b.Close()
	if err := b.Set(key, binary.BigEndian.AppendUint64(nil, fence), nil); err != nil {
		return err
	}
	if err := b.Set([]byte(balancePrefix+account), binary.BigEndian.AppendUint64(nil, uint64(bal)), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	l.balances[account] = bal
	l.applied++
	return nil
}

// Applied returns the number of effects applied since open.
func (l *Ledger) Applied() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied
}

// Repeats returns the event IDs whose re-run the ledger refused, with
// counts.
func (l *Ledger) Repeats() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.repeats))
	for k, v := range l.repeats {
		out[k] = v
	}
	return out
}

// LedgerState is what a scan of the stored ledger finds.
type LedgerState struct {
	AppliedIDs int
	Balances   map[string]int64
	Total      int64
}

// Scan reads the stored ledger (not the in-memory counters).
func (l *Ledger) Scan() (LedgerState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LedgerState{Balances: map[string]int64{}}
	it, err := l.db.NewIter(nil)
	if err != nil {
		return st, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := string(it.Key())
		switch {
		case strings.HasPrefix(k, appliedPrefix):
			st.AppliedIDs++
		case strings.HasPrefix(k, balancePrefix):
			v := int64(binary.BigEndian.Uint64(it.Value()))
			st.Balances[strings.TrimPrefix(k, balancePrefix)] = v
			st.Total += v
		}
	}
	return st, it.Error()
}

// Close flushes and closes the ledger.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.db.Flush(); err != nil {
		l.db.Close()
		return err
	}
	return l.db.Close()
}

// pebbleLog adapts slog for Pebble: info at DEBUG, errors at WARN.
type pebbleLog struct{ l *slog.Logger }

func (p pebbleLog) Infof(format string, args ...any)  { p.l.Debug(fmt.Sprintf(format, args...)) }
func (p pebbleLog) Errorf(format string, args ...any) { p.l.Warn(fmt.Sprintf(format, args...)) }
func (p pebbleLog) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic(msg)
}
