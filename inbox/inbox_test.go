package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/inbox"
	"github.com/dedupnode/dedupnode/internal/pgproc"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// requireEnv set to 1 makes a missing PostgreSQL fail the tests (CI).
const requireEnv = "DEDUPNODE_REQUIRE_BROKERS"

// pg is one PostgreSQL server shared by the package's tests; each test
// gets its own database in it. nil with pgSkip set when not available.
var (
	pg     *pgproc.Server
	pgSkip string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(childEnv) != "" {
		os.Exit(crashChild())
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	required := os.Getenv(requireEnv) == "1"
	switch err := pgproc.Installed(); {
	case err != nil && required:
		fmt.Fprintf(os.Stderr, "inbox: %s=1 but %v\n", requireEnv, err)
		return 1
	case err != nil:
		pgSkip = err.Error()
		return m.Run()
	case testing.Short() && !required:
		pgSkip = "-short: not starting PostgreSQL"
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	if pg, err = pgproc.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "inbox: start PostgreSQL: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "inbox: PostgreSQL (pid %d) up in %.1f s\n", pg.PID(), time.Since(start).Seconds())
	defer pg.Close()
	return m.Run()
}

// backend is a database the inbox is tested on.
type backend struct {
	name    string
	dialect inbox.Dialect
	// open returns the driver name and DSN of a fresh, empty database.
	open func(t *testing.T) (driver, dsn string)
}

var dbCount atomic.Int64

var backends = []backend{
	{name: "postgres", dialect: inbox.Postgres, open: func(t *testing.T) (string, string) {
		if pg == nil {
			t.Skip("no PostgreSQL: " + pgSkip)
		}
		admin, err := sql.Open("pgx", pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		name := fmt.Sprintf("t%d", dbCount.Add(1))
		if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
			t.Fatal(err)
		}
		return "pgx", strings.Replace(pg.DSN(), "/postgres?", "/"+name+"?", 1)
	}},
	{name: "sqlite", dialect: inbox.SQLite, open: func(t *testing.T) (string, string) {
		// WAL and a busy timeout: concurrent writers wait for each other.
		return "sqlite", "file:" + filepath.Join(t.TempDir(), "app.db") + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)"
	}},
}

// setup opens a fresh database with the inbox table and the test's own
// tables: accounts(name, balance), effects(id) (one row per run of fn).
func setup(t *testing.T, b backend) (db *sql.DB, driver, dsn string) {
	t.Helper()
	driver, dsn = b.open(t)
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	schema, err := inbox.Schema(b.dialect, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		schema,
		`CREATE TABLE accounts (name TEXT PRIMARY KEY, balance BIGINT NOT NULL)`,
		`CREATE TABLE effects (id TEXT NOT NULL)`,
		`INSERT INTO accounts (name, balance) VALUES ('acct', 0)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return db, driver, dsn
}

// credit is the effect: add amount to the account and note the run.
func credit(id string, amount int64) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $1 WHERE name = 'acct'`, amount); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES ($1)`, id)
		return err
	}
}

func balance(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var b int64
	if err := db.QueryRow(`SELECT balance FROM accounts WHERE name = 'acct'`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func effectRuns(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT id FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func inboxFence(t *testing.T, db *sql.DB, ns, id string) (int64, bool) {
	t.Helper()
	var f int64
	err := db.QueryRow(`SELECT fencing_token FROM dedup_inbox WHERE namespace = $1 AND id = $2`, ns, []byte(id)).Scan(&f)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return f, true
}

func newInbox(t *testing.T, p client.Processor, db *sql.DB) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Processor: p, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// The crash child: a real process that processes one message through the
// inbox and is SIGKILLed after its transaction committed and before its
// dedupnode commit.
const childEnv = "DEDUPNODE_INBOX_CRASH_CHILD"

func crashChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "crash child:", err); return 2 }
	db, err := sql.Open(os.Getenv("INBOX_DRIVER"), os.Getenv("INBOX_DSN"))
	if err != nil {
		return fail(err)
	}
	c, err := client.New(ctx, strings.Split(os.Getenv("INBOX_ADDRS"), ","), testcluster.PatientRetry)
	if err != nil {
		return fail(err)
	}
	ib, err := inbox.New(inbox.Config{Processor: c, DB: db})
	if err != nil {
		return fail(err)
	}
	inbox.SetAfterTxCommit(ib, func() {
		// Die here: no deferred function, no dedupnode commit, no release.
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	})
	id := os.Getenv("INBOX_ID")
	res, err := ib.Process(ctx, os.Getenv("INBOX_NS"), []byte(id), credit(id, 100), client.WithLease(3*time.Second))
	return fail(fmt.Errorf("not killed: outcome %v, %v", res.Outcome, err))
}

// A consumer crashes after its transaction committed and before its
// dedupnode commit (a real process, SIGKILLed at that point). The
// redelivery waits out the dead consumer's lease (in progress), then
// claims with a newer fence, finds the inbox row with the old fence, does
// not run fn, and completes the dedupnode commit: the effect is applied
// once and the ID is committed.
func TestCrashBetweenTxCommitAndDedupnodeCommit(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db, driver, dsn := setup(t, b)
			cl := testcluster.Demo(t)
			c := testcluster.Client(t, cl.Addrs())
			const ns, id = "payments", "pay-1"

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=1", "INBOX_DRIVER="+driver, "INBOX_DSN="+dsn,
				"INBOX_ADDRS="+strings.Join(cl.Addrs(), ","), "INBOX_NS="+ns, "INBOX_ID="+id)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("crash child did not die by SIGKILL: %v\n%s", err, out)
			}

			// The crash left: the effect and the inbox row committed, the
			// dedupnode record still leased by the dead consumer.
			if got := balance(t, db); got != 100 {
				t.Fatalf("balance %d after the crash, want 100 (the transaction committed)", got)
			}
			oldFence, ok := inboxFence(t, db, ns, id)
			if !ok {
				t.Fatal("no inbox row after the crash")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			chk, err := c.Check(ctx, ns, [][]byte{[]byte(id)}, client.Linearizable)
			if err != nil {
				t.Fatal(err)
			}
			// Leased, and to anyone but the dead holder without what names
			// its lease (its fencing token and request token).
			if r := chk[0].Record; r == nil || r.State != client.StateLeased || r.FencingToken != 0 || len(r.RequestToken) != 0 {
				t.Fatalf("dedupnode record after the crash %+v, want leased, without its fencing token %d nor request token", r, oldFence)
			}

			// Redeliveries until one is not in progress.
			ib := newInbox(t, c, db)
			inProgress := 0
			var res inbox.Result
			testcluster.WaitFor(t, 30*time.Second, "the dead consumer's lease to expire", func() bool {
				res, err = ib.Process(ctx, ns, []byte(id), credit(id, 100), client.WithLease(3*time.Second))
				if err != nil {
					t.Fatalf("redelivery: %v", err)
				}
				if res.Outcome == client.OutcomeInProgress {
					if r := res.Record; r == nil || r.FencingToken != 0 || len(r.RequestToken) != 0 || res.Lease.RequestToken != nil {
						t.Fatalf("in-progress redelivery: %+v, want the dead holder's lease without its tokens", res)
					}
					inProgress++
					time.Sleep(100 * time.Millisecond) // a redelivery delay
					return false
				}
				return true
			})
			if res.Outcome != client.OutcomeDuplicate || !res.Recovered || res.Ran {
				t.Fatalf("redelivery %+v, want a recovered duplicate without running fn", res)
			}
			newFence := res.Lease.FencingToken
			if newFence <= uint64(oldFence) {
				t.Fatalf("recovery claimed with fence %d, not newer than the crashed %d", res.Lease.FencingToken, oldFence)
			}
			chk, err = c.Check(ctx, ns, [][]byte{[]byte(id)}, client.Linearizable)
			if err != nil {
				t.Fatal(err)
			}
			if r := chk[0].Record; chk[0].Code != client.CodeSeen || r == nil || r.State != client.StateCommitted {
				t.Fatalf("dedupnode after recovery: %v %+v, want committed", chk[0].Code, r)
			}
			// A later replay is a plain duplicate.
			res, err = ib.Process(ctx, ns, []byte(id), credit(id, 100))
			if err != nil || res.Outcome != client.OutcomeDuplicate || res.Recovered || res.Ran {
				t.Fatalf("replay: %+v %v, want a duplicate", res, err)
			}
			if got, runs := balance(t, db), effectRuns(t, db); got != 100 || runs[id] != 1 {
				t.Fatalf("balance %d, runs %v: want the effect applied once", got, runs)
			}
			if f, _ := inboxFence(t, db, ns, id); f != oldFence {
				t.Fatalf("inbox fence %d, want the crashed holder's %d (rows are never updated)", f, oldFence)
			}
			t.Logf("crashed holder's fence %d, recovered with fence %d after %d in-progress answers", oldFence, newFence, inProgress)
		})
	}
}

// Many redeliveries of the same IDs processed concurrently by several
// consumers: each effect is applied exactly once.
func TestConcurrentDeliveriesApplyOnce(t *testing.T) {
	cl := testcluster.Demo(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db, _, _ := setup(t, b)
			const ids, consumers, copies = 60, 3, 3
			var wg sync.WaitGroup
			var mu sync.Mutex
			outcomes := map[client.Outcome]int{}
			for cons := range consumers {
				ib := newInbox(t, testcluster.Batcher(t, cl.Addrs()), db)
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					// Every consumer gets every message copies times, in its
					// own order, four at a time.
					work := make(chan int)
					var inner sync.WaitGroup
					for range 4 {
						inner.Add(1)
						go func() {
							defer inner.Done()
							for k := range work {
								id := fmt.Sprintf("evt-%d", k)
								for {
									res, err := ib.Process(ctx, "orders-"+b.name, []byte(id), credit(id, int64(k)))
									mu.Lock()
									outcomes[res.Outcome]++
									mu.Unlock()
									if err != nil && ctx.Err() != nil {
										t.Errorf("%s: %v", id, err)
										return
									}
									if res.Outcome == client.OutcomeProcessed || res.Outcome == client.OutcomeDuplicate {
										break
									}
									time.Sleep(20 * time.Millisecond) // redelivery delay
								}
							}
						}()
					}
					for c := range copies {
						for i := range ids {
							work <- (i*7 + cons*13 + c*29) % ids
						}
					}
					close(work)
					inner.Wait()
				}()
			}
			wg.Wait()
			runs := effectRuns(t, db)
			var want int64
			for k := range ids {
				want += int64(k)
				if n := runs[fmt.Sprintf("evt-%d", k)]; n != 1 {
					t.Fatalf("evt-%d applied %d times, want once (outcomes %v)", k, n, outcomes)
				}
			}
			if got := balance(t, db); got != want {
				t.Fatalf("balance %d, want %d", got, want)
			}
			if outcomes[client.OutcomeProcessed] != ids || outcomes[client.OutcomeDuplicate] < ids*(consumers*copies-1) {
				t.Fatalf("outcomes %v: want %d processed and the rest duplicates", outcomes, ids)
			}
			t.Logf("outcomes %v", outcomes)
		})
	}
}

// The table refuses a stale fencing token: a holder whose claim was
// superseded finds the newer holder's row (even when both transactions
// run at once: its insert waits for the newer one's commit) and neither
// runs fn nor writes anything; a newer token than the row's recovers.
func TestStaleFenceRefused(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db, _, _ := setup(t, b)
			cl := testcluster.Demo(t)
			ib := newInbox(t, testcluster.Client(t, cl.Addrs()), db)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			lease := func(id string, fence uint64) client.Lease { return client.Lease{ID: []byte(id), FencingToken: fence} }

			st, err := ib.Apply(ctx, "ns", lease("a", 10), credit("a", 1))
			if err != nil || st != inbox.StatusApplied {
				t.Fatalf("first apply: %v %v", st, err)
			}
			ran := false
			st, err = ib.Apply(ctx, "ns", lease("a", 5), func(ctx context.Context, tx *sql.Tx) error { ran = true; return nil })
			if !errors.Is(err, inbox.ErrStaleFence) || st != inbox.StatusStale || ran {
				t.Fatalf("older fence: %v %v ran=%v, want ErrStaleFence without running fn", st, err, ran)
			}
			st, err = ib.Apply(ctx, "ns", lease("a", 12), func(ctx context.Context, tx *sql.Tx) error { ran = true; return nil })
			if err != nil || st != inbox.StatusRecovered || ran {
				t.Fatalf("newer fence: %v %v ran=%v, want recovered without running fn", st, err, ran)
			}

			// Both at once: the newer holder (fence 20) inserts and holds
			// its transaction open; the stale one (fence 15) starts, and
			// its insert must wait; the newer commits; the stale is refused.
			inFn, release := make(chan struct{}), make(chan struct{})
			newer := make(chan error, 1)
			go func() {
				_, err := ib.Apply(ctx, "ns", lease("b", 20), func(ctx context.Context, tx *sql.Tx) error {
					if err := credit("b", 2)(ctx, tx); err != nil {
						return err
					}
					close(inFn)
					<-release
					return nil
				})
				newer <- err
			}()
			<-inFn
			stale := make(chan error, 1)
			var staleStatus inbox.Status
			go func() {
				var err error
				staleStatus, err = ib.Apply(ctx, "ns", lease("b", 15), func(ctx context.Context, tx *sql.Tx) error { ran = true; return nil })
				stale <- err
			}()
			select {
			case err := <-stale:
				t.Fatalf("the stale holder finished (%v) while the newer transaction held the key", err)
			case <-time.After(300 * time.Millisecond):
				// Not proof of waiting by itself; the result below is.
			}
			close(release)
			if err := <-newer; err != nil {
				t.Fatalf("newer holder: %v", err)
			}
			if err := <-stale; !errors.Is(err, inbox.ErrStaleFence) || staleStatus != inbox.StatusStale || ran {
				t.Fatalf("stale holder: %v %v ran=%v, want ErrStaleFence", staleStatus, err, ran)
			}
			if f, _ := inboxFence(t, db, "ns", "b"); f != 20 {
				t.Fatalf("inbox fence for b is %d, want 20", f)
			}
			if runs := effectRuns(t, db); runs["a"] != 1 || runs["b"] != 1 || balance(t, db) != 3 {
				t.Fatalf("runs %v balance %d", runs, balance(t, db))
			}
		})
	}
}

// A failing fn rolls back its effect and the inbox row together, and
// releases the claim: the redelivery runs fn again at once.
func TestFailureRollsBackAndReleases(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db, _, _ := setup(t, b)
			cl := testcluster.Demo(t)
			ib := newInbox(t, testcluster.Client(t, cl.Addrs()), db)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			boom := errors.New("card declined")
			res, err := ib.Process(ctx, "ns", []byte("x"), func(ctx context.Context, tx *sql.Tx) error {
				if err := credit("x", 5)(ctx, tx); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) || res.Outcome != client.OutcomeFailed || !res.Ran {
				t.Fatalf("failing fn: %+v %v", res, err)
			}
			if _, ok := inboxFence(t, db, "ns", "x"); ok || balance(t, db) != 0 {
				t.Fatal("the failed transaction left its row or its effect")
			}
			res, err = ib.Process(ctx, "ns", []byte("x"), credit("x", 5))
			if err != nil || res.Outcome != client.OutcomeProcessed || !res.Ran {
				t.Fatalf("retry: %+v %v, want processed at once (claim released)", res, err)
			}
			if balance(t, db) != 5 {
				t.Fatalf("balance %d, want 5", balance(t, db))
			}
		})
	}
}

func TestConfigAndSchema(t *testing.T) {
	if _, err := inbox.New(inbox.Config{}); err == nil || !strings.Contains(err.Error(), "Processor") || !strings.Contains(err.Error(), "DB") {
		t.Fatalf("empty config: %v", err)
	}
	if _, err := inbox.Schema(inbox.Postgres, "bad name;"); err == nil {
		t.Fatal("Schema accepted a bad table name")
	}
	if _, err := inbox.Schema(0, ""); err == nil {
		t.Fatal("Schema accepted an unknown dialect")
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := inbox.New(inbox.Config{Processor: &client.Client{}, DB: db, Table: "x y"}); err == nil {
		t.Fatal("New accepted a bad table name")
	}
	ib, err := inbox.New(inbox.Config{Processor: &client.Client{}, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	for _, fence := range []uint64{0, 1 << 63} {
		if _, err := ib.Apply(context.Background(), "ns", client.Lease{ID: []byte("a"), FencingToken: fence}, nil); err == nil {
			t.Fatalf("Apply accepted fence %d", fence)
		}
	}
}
