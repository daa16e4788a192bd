// Package inbox implements the Inbox pattern on top of dedupnode: the
// message ID is recorded in the same database transaction as the
// message's effect, so that the effect and the record of it commit or roll
// back together.
//
// Use it when the effect is a write to your own SQL database. Plain
// client.Process leaves one gap there: a consumer that crashes after its
// transaction committed but before dedupnode recorded the commit lets a
// redelivery run the effect again once the lease expires. With the inbox,
// that redelivery finds the inbox row, does not run fn, and completes the
// dedupnode commit. When the effect is elsewhere (an HTTP call, an email,
// another team's service) there is no transaction to join: use
// client.Process and pass the lease's fencing token (client.LeaseFrom) to
// the downstream system if it can refuse stale tokens.
//
// Each call of Process:
//
//  1. claims the ID in dedupnode (a duplicate returns at once, without
//     touching the database; a claim held elsewhere answers
//     OutcomeInProgress: redeliver later);
//  2. begins a transaction and inserts (namespace, id, fencing token) into
//     the inbox table, whose primary key is (namespace, id);
//  3. if the insert went in, runs fn(ctx, tx) and commits the transaction;
//     if a row was already there, fn does not run: a row with an older (or
//     the same) fencing token is an earlier holder's committed effect whose
//     dedupnode commit was lost (Recovered), a row with a newer token means
//     this caller's claim is stale and is refused (ErrStaleFence);
//  4. commits in dedupnode (also after a recovery).
//
// A redelivery after a crash between 3 and 4 first gets OutcomeInProgress
// until the crashed holder's lease expires (the inbox is not read then:
// the holder might still be alive and about to commit), then a claim with
// a newer fencing token, which finds the row and recovers. Keep the lease
// short enough for that wait. The inbox table is never updated, only
// inserted into, so an older fence can never overwrite a newer one; the
// primary key makes a second insert wait for the first transaction and
// then find its row.
//
// Rows must be kept at least as long as redeliveries and replays of the
// ID can arrive (dedupnode's commit TTL, 24 h by default, plus the time a
// message can sit in the broker); delete older rows by applied_at.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"

	"github.com/dedupnode/dedupnode/client"
)

// DefaultTable is the inbox table's default name.
const DefaultTable = "dedup_inbox"

// Dialect names the SQL database, for the schema.
type Dialect uint8

const (
	// Postgres: PostgreSQL 9.5 or later (ON CONFLICT).
	Postgres Dialect = iota + 1
	// SQLite: SQLite 3.24 or later (ON CONFLICT ... DO NOTHING).
	SQLite
)

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// Schema returns the CREATE TABLE statement of the inbox table named
// table ("" for DefaultTable) in dialect d:
//
// PostgreSQL:
//
//	CREATE TABLE IF NOT EXISTS dedup_inbox (
//	    namespace     TEXT        NOT NULL,
//	    id            BYTEA       NOT NULL,
//	    fencing_token BIGINT      NOT NULL CHECK (fencing_token > 0),
//	    applied_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
//	    PRIMARY KEY (namespace, id)
//	)
//
// SQLite:
//
//	CREATE TABLE IF NOT EXISTS dedup_inbox (
//	    namespace     TEXT    NOT NULL,
//	    id            BLOB    NOT NULL,
//	    fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
//	    applied_at    TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
//	    PRIMARY KEY (namespace, id)
//	) WITHOUT ROWID
func Schema(d Dialect, table string) (string, error) {
	if table == "" {
		table = DefaultTable
	}
	if !tableName.MatchString(table) {
		return "", fmt.Errorf("inbox: table name %q: want an identifier, optionally schema-qualified", table)
	}
	switch d {
	case Postgres:
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    namespace     TEXT        NOT NULL,
    id            BYTEA       NOT NULL,
    fencing_token BIGINT      NOT NULL CHECK (fencing_token > 0),
    applied_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
)`, nil
	case SQLite:
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
    namespace     TEXT    NOT NULL,
    id            BLOB    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
    applied_at    TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (namespace, id)
) WITHOUT ROWID`, nil
	}
	return "", fmt.Errorf("inbox: unknown dialect %d", d)
}

// ErrStaleFence means the inbox already holds the ID under a newer
// fencing token: another consumer claimed the ID after this caller's lease
// ended and applied the effect. fn did not run and nothing was written.
var ErrStaleFence = errors.New("inbox: stale fencing token (a newer claim applied the effect)")

// Config configures an Inbox.
type Config struct {
	// Processor claims and commits IDs in dedupnode: a *client.Batcher or
	// a *client.Client. Required.
	Processor client.Processor
	// DB is the database holding the inbox table and the effects.
	// Required. With SQLite, set a busy timeout (modernc.org/sqlite:
	// "file:app.db?_pragma=busy_timeout(10000)") so that concurrent
	// transactions wait for each other instead of failing.
	DB *sql.DB
	// Table is the inbox table (default DefaultTable); create it with
	// Schema.
	Table string
	// TxOptions are the options of the transaction fn runs in (default:
	// the database's default isolation, read-write).
	TxOptions *sql.TxOptions
	// ProcessOptions are passed to every claim (lease, commit TTL, digest).
	ProcessOptions []client.ProcessOption

	// afterTxCommit, when set (tests only), runs after the transaction
	// committed and before the dedupnode commit: the crash window.
	afterTxCommit func()
}

// Inbox runs effects in SQL transactions at most once per message ID.
// Safe for concurrent use.
type Inbox struct {
	cfg                 Config
	insert, selectFence string
}

// New checks cfg and returns an Inbox.
func New(cfg Config) (*Inbox, error) {
	var errs []error
	if cfg.Processor == nil {
		errs = append(errs, errors.New("Processor is required"))
	}
	if cfg.DB == nil {
		errs = append(errs, errors.New("DB is required"))
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !tableName.MatchString(cfg.Table) {
		errs = append(errs, fmt.Errorf("Table %q: want an identifier, optionally schema-qualified", cfg.Table))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	// $n placeholders: PostgreSQL's, and SQLite takes them in order.
	return &Inbox{
		cfg:         cfg,
		insert:      `INSERT INTO ` + cfg.Table + ` (namespace, id, fencing_token) VALUES ($1, $2, $3) ON CONFLICT (namespace, id) DO NOTHING`,
		selectFence: `SELECT fencing_token FROM ` + cfg.Table + ` WHERE namespace = $1 AND id = $2`,
	}, nil
}

// Status says what Apply found in the inbox.
type Status uint8

const (
	// StatusUnknown: Apply failed before it could tell.
	StatusUnknown Status = iota
	// StatusApplied: the row went in, fn ran and the transaction
	// committed.
	StatusApplied
	// StatusRecovered: a row with an older (or the same) fencing token was
	// there: an earlier holder's effect is committed; fn did not run.
	StatusRecovered
	// StatusStale: a row with a newer fencing token was there; fn did not
	// run (the error is ErrStaleFence).
	StatusStale
)

var statusNames = [...]string{"unknown", "applied", "recovered", "stale"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Apply runs fn(ctx, tx) in a transaction together with the insert of
// (namespace, lease.ID, lease.FencingToken) into the inbox table, for a
// caller that holds the lease (from its own Claim). fn does not run when
// the row is already there (StatusRecovered, or StatusStale with
// ErrStaleFence). A fn error rolls the transaction back and is returned.
// The transaction is bound to ctx: cancelling ctx (as client.Process does
// when the lease is lost) before the commit rolls it back.
func (ib *Inbox) Apply(ctx context.Context, namespace string, lease client.Lease, fn func(ctx context.Context, tx *sql.Tx) error) (_ Status, err error) {
	if lease.FencingToken == 0 || lease.FencingToken > math.MaxInt64 {
		return StatusUnknown, fmt.Errorf("inbox: fencing token %d out of range 1..%d", lease.FencingToken, int64(math.MaxInt64))
	}
	if len(lease.ID) == 0 {
		return StatusUnknown, errors.New("inbox: empty ID")
	}
	fence := int64(lease.FencingToken)
	tx, err := ib.cfg.DB.BeginTx(ctx, ib.cfg.TxOptions)
	if err != nil {
		return StatusUnknown, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// The insert comes first: it takes the key, so that a concurrent
	// holder's insert waits for this transaction and then sees its row.
	res, err := tx.ExecContext(ctx, ib.insert, namespace, lease.ID, fence)
	if err != nil {
		return StatusUnknown, fmt.Errorf("inbox: insert into %s: %w", ib.cfg.Table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return StatusUnknown, fmt.Errorf("inbox: insert into %s: rows affected: %w", ib.cfg.Table, err)
	}
	if n == 0 {
		var have int64
		if err := tx.QueryRowContext(ctx, ib.selectFence, namespace, lease.ID).Scan(&have); err != nil {
			return StatusUnknown, fmt.Errorf("inbox: read %s row: %w", ib.cfg.Table, err)
		}
		_ = tx.Rollback()
		if have > fence {
			return StatusStale, fmt.Errorf("%w: the inbox holds token %d, this claim has %d", ErrStaleFence, have, fence)
		}
		return StatusRecovered, nil
	}
	if err := fn(ctx, tx); err != nil {
		return StatusUnknown, err
	}
	if err := tx.Commit(); err != nil {
		return StatusUnknown, fmt.Errorf("inbox: commit: %w", err)
	}
	return StatusApplied, nil
}

// Result says what Process did.
type Result struct {
	// Outcome is as for client.Process, except that a recovery (fn not
	// run; an earlier holder's committed effect found in the inbox, the
	// dedupnode commit completed now) is OutcomeDuplicate with Recovered
	// set, and a stale claim is OutcomeLeaseLost with ErrStaleFence.
	// Processed and Duplicate: acknowledge the message. InProgress:
	// redeliver later (after Record.Expires). Failed, LeaseLost, Error:
	// redeliver later.
	Outcome client.Outcome
	// Ran is true when fn was called (its transaction may still have
	// rolled back: see Outcome).
	Ran bool
	// Recovered: the inbox row proved an earlier run's effect; the
	// dedupnode commit was completed by this call.
	Recovered bool
	// Lease is the lease taken (zero when the claim was not acquired).
	Lease client.Lease
	// Record is the ID's record as last returned by dedupnode.
	Record *client.Record
}

// Process runs fn(ctx, tx) at most once per ID, inside a transaction that
// also records the ID in the inbox table, claiming and committing the ID
// in dedupnode around it; see the package documentation for the steps.
func (ib *Inbox) Process(ctx context.Context, namespace string, id []byte, fn func(ctx context.Context, tx *sql.Tx) error, opts ...client.ProcessOption) (Result, error) {
	if len(id) == 0 {
		return Result{Outcome: client.OutcomeError}, errors.New("inbox: empty ID")
	}
	var status Status
	ran := false
	all := append(ib.cfg.ProcessOptions[:len(ib.cfg.ProcessOptions):len(ib.cfg.ProcessOptions)], opts...)
	pr, err := ib.cfg.Processor.Process(ctx, namespace, id, func(ctx context.Context) error {
		lease, ok := client.LeaseFrom(ctx)
		if !ok {
			return errors.New("inbox: no lease in the Process context")
		}
		var err error
		status, err = ib.Apply(ctx, namespace, lease, func(ctx context.Context, tx *sql.Tx) error {
			ran = true
			return fn(ctx, tx)
		})
		if err != nil {
			return err
		}
		if ib.cfg.afterTxCommit != nil {
			ib.cfg.afterTxCommit()
		}
		return nil
	}, all...)
	r := Result{Outcome: pr.Outcome, Ran: ran, Lease: pr.Lease, Record: pr.Record}
	switch {
	case status == StatusRecovered && pr.Outcome == client.OutcomeProcessed:
		r.Outcome, r.Recovered = client.OutcomeDuplicate, true
	case status == StatusStale:
		r.Outcome = client.OutcomeLeaseLost
	}
	return r, err
}
