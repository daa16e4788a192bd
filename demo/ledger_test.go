package demo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// A reopened ledger starts from its stored balances: 5 then, after a
// reopen, 7 is 12, as stored and as Apply computes the next balance from.
func TestLedgerReopenLoadsBalances(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply("ev-1", 1, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct{ amount, want int64 }{{7, 12}, {3, 15}} {
		l, err = OpenLedger(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Apply(fmt.Sprintf("ev-%d", i+2), 2, "alice", step.amount); err != nil {
			t.Fatal(err)
		}
		if err := l.Apply("ev-1", 3, "alice", 5); err != ErrAlreadyApplied {
			t.Fatalf("ev-1 again after a reopen: %v, want ErrAlreadyApplied", err)
		}
		st, err := l.Scan()
		if err != nil {
			t.Fatal(err)
		}
		if st.Balances["alice"] != step.want || st.Total != step.want || st.AppliedIDs != i+2 {
			t.Fatalf("after reopen %d: %+v, want alice %d", i+1, st, step.want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

const (
	// ledgerChildEnv names the ledger directory a re-executed test binary
	// applies events to (see ledgerChild).
	ledgerChildEnv = "DEDUPNODE_TEST_LEDGER_CHILD_DIR"
	childEvents    = 400
	childWorkers   = 8
)

// A consumer process killed (SIGKILL) right after Apply returned keeps
// that effect: the child applies events from several goroutines, prints
// each event's ID once its Apply returned, and is killed while it goes on
// applying; every event it printed is in the reopened ledger, and the
// stored balances are the sum of the events stored.
func TestLedgerKilledAfterApplyKeepsEffects(t *testing.T) {
	if dir := os.Getenv(ledgerChildEnv); dir != "" {
		ledgerChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerKilledAfterApplyKeepsEffects$", "-test.count=1")
	cmd.Env = append(os.Environ(), ledgerChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	hold, err := cmd.StdinPipe() // the child, done, waits for stdin to close: it is killed first
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	// Kill the child as soon as half of the events are reported applied,
	// while its workers are still applying the others.
	acked := map[string]bool{}
	sc := bufio.NewScanner(out)
	for len(acked) < childEvents/2 && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "applied "); ok {
			acked[id] = true
		}
	}
	if len(acked) < childEvents/2 {
		t.Fatalf("the child reported %d applies before it ended (%v)", len(acked), sc.Err())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	// What the child printed between the last read and the kill was
	// acknowledged as well.
	rest, _ := io.ReadAll(out)
	for _, line := range strings.Split(string(rest), "\n") {
		if id, ok := strings.CutPrefix(line, "applied "); ok {
			acked[id] = true
		}
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child: %v, want killed", err)
	}

	l, err := OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	st, err := l.Scan()
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for id := range acked {
		if err := l.Apply(id, 99, childAccount(id), 1_000_000); err != ErrAlreadyApplied {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of the %d effects the child had reported applied are not in the ledger after kill -9 (%d stored)", lost, len(acked), st.AppliedIDs)
	}
	// Balances match the stored events: each event adds 1 to its account.
	if int(st.Total) != st.AppliedIDs {
		t.Fatalf("stored total %d for %d stored events", st.Total, st.AppliedIDs)
	}
	t.Logf("child reported %d applies; %d stored", len(acked), st.AppliedIDs)
}

func childAccount(id string) string { return "acct-" + id[len(id)-1:] }

// ledgerChild is the killed consumer: it applies childEvents events with
// childWorkers goroutines, printing each ID after its Apply returned, then
// waits for its stdin to close (the parent kills it first).
func ledgerChild(dir string) {
	l, err := OpenLedger(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	w := bufio.NewWriter(os.Stdout)
	for range childWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= childEvents {
					return
				}
				id := fmt.Sprintf("ev-%04d", i)
				if err := l.Apply(id, 1, childAccount(id), 1); err != nil {
					fmt.Fprintln(os.Stderr, "child:", err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintf(w, "applied %s\n", id)
				w.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	io.Copy(io.Discard, os.Stdin)
	os.Exit(3)
}
