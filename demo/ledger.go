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
//
// It is an effect store to copy, so it is durable: an Apply that returned
// nil is on disk (its write-ahead log record synced), because the consumer
// goes on to commit the event's ID in dedupnode, after which the event is
// never delivered again — an effect lost in a crash after that would be
// lost for good. Opening a ledger loads its stored balances. A write that
// a crash (kill -9, power loss) cut short was never acknowledged: Pebble's
// log replay drops a torn last record, and the event, not committed in
// dedupnode, is delivered and applied again.
type Ledger struct {
	mu       sync.Mutex
	db       *pebble.DB
	balances map[string]int64 // as stored
	applied  int64
	repeats  map[string]int // event ID → re-runs refused
}

const (
	appliedPrefix = "applied/"
	balancePrefix = "balance/"
)

// OpenLedger opens (or creates) the ledger in dir, loading its balances;
// Pebble logs to logger (nil: discarded).
func OpenLedger(dir string, logger *slog.Logger) (*Ledger, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLog{logger.With("component", "ledger")}})
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l := &Ledger{db: db, balances: map[string]int64{}, repeats: map[string]int{}}
	st, err := l.Scan()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open ledger: load balances: %w", err)
	}
	l.balances = st.Balances
	return l, nil
}

// ErrAlreadyApplied means the event's effect is in the ledger already.
var ErrAlreadyApplied = errors.New("event already applied to the ledger")

// Apply adds amount to account for event id, under the claim's fencing
// token, in one atomic write, and returns once that write is durable;
// ErrAlreadyApplied (also once durable) if id was applied before.
func (l *Ledger) Apply(id string, fence uint64, account string, amount int64) error {
	werr := l.write(id, fence, account, amount)
	if werr != nil && !errors.Is(werr, ErrAlreadyApplied) {
		return werr
	}
	if err := l.sync(); err != nil {
		return err
	}
	return werr // nil, or ErrAlreadyApplied once the earlier write is durable too
}

// write applies the event in memory and to Pebble's log without waiting
// for the disk. It runs under the lock, so that balance writes reach the
// log in the order they were computed.
func (l *Ledger) write(id string, fence uint64, account string, amount int64) error {
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

// sync makes every write logged so far durable. It runs outside the lock:
// Pebble syncs its log once for all the Applies waiting at that moment
// (group commit), where a sync under the lock would cost one disk flush
// per event. An Apply that finds its event applied syncs too, since the
// write it found may still be waiting for its own sync.
func (l *Ledger) sync() error {
	if err := l.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("ledger: sync: %w", err)
	}
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
