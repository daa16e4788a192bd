package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// An invalid item's error says which item it is, typed (Error.Item,
// counting from 1) and without the field in the violation's words, so a
// caller can name the item in its own terms (the CLI names the input line)
// without reading the message.
func TestInvalidItemErrorNamesTheItem(t *testing.T) {
	cl := testcluster.New(t, devcluster.Config{Nodes: 1, AutoCreateNamespaces: true})
	ctx := testCtx(t, 30*time.Second)
	c := newClient(t, cl.Addrs())
	long := []byte(strings.Repeat("x", 600)) // over the default 512 bytes
	items := []client.Item{{ID: []byte("a")}, {ID: []byte("b")}, {ID: long}, {ID: []byte("d")}}
	if _, err := c.Mark(ctx, "items", items[:1], 0); err != nil { // creates the namespace
		t.Fatal(err)
	}
	_, err := c.Mark(ctx, "items", items, 0)
	if err == nil {
		t.Fatal("mark with a long third ID: no error")
	}
	e := client.AsError(err)
	if !errors.Is(err, client.ErrInvalidArgument) || e.Item != 3 || e.Field != "items[2].id" ||
		e.Violation == "" || strings.Contains(e.Violation, "items[") {
		t.Fatalf("mark with a long third ID: %v (item %d, field %q, violation %q), want item 3, field items[2].id", err, e.Item, e.Field, e.Violation)
	}
	_, err = c.Check(ctx, "items", [][]byte{[]byte("a"), long}, client.Linearizable)
	if err == nil {
		t.Fatal("check with a long second ID: no error")
	}
	if e := client.AsError(err); !errors.Is(err, client.ErrInvalidArgument) || e.Item != 2 || e.Field != "ids[1]" {
		t.Fatalf("check with a long second ID: %v (item %d, field %q), want item 2, field ids[1]", err, e.Item, e.Field)
	}
	_, err = c.Mark(ctx, "items", items[:1], 400*24*time.Hour)
	if err == nil {
		t.Fatal("mark with a TTL out of range: no error")
	}
	if e := client.AsError(err); !errors.Is(err, client.ErrInvalidArgument) || e.Item != 0 {
		t.Fatalf("mark with a TTL out of range: %v (item %d), want item 0: no single item", err, e.Item)
	}
}

// Issue 14 item 4: during an election the client stops dialling the dead
// leader after its first refused connection and finds the new leader
// through the other addresses. The figure (leader killed → first
// acknowledged write) is logged; the write's deadline is deliberately
// generous (two loaded cores under -race): the test's point is the call
// count.
func TestDeadLeaderIsNotDialledAgainDuringElection(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 90*time.Second)
	var log rpcLog
	c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor()))
	if _, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("before")}}, 0); err != nil {
		t.Fatal(err)
	}
	leader := cl.Leader()
	dead := cl.Addrs()[leader]
	if c.Leader() != dead {
		t.Fatalf("client leader %q, cluster leader %q", c.Leader(), dead)
	}
	before := len(log.snapshot())
	if err := cl.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	within := testcluster.Election + 15*time.Second
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if _, err := c.Mark(wctx, "orders", []client.Item{{ID: []byte("after")}}, 0); err != nil {
		t.Fatalf("mark after killing the leader, waited up to %v: %v", within, err)
	}
	took := time.Since(killed)
	t.Logf("leader killed → first acknowledged write through the client: %v (election timeout %v)", took.Round(time.Millisecond), testcluster.Election)
	toDead := 0
	for _, call := range log.snapshot()[before:] {
		if call.target == dead {
			toDead++
		}
	}
	if toDead > 1 {
		t.Errorf("the client sent %d calls to the dead leader %s after the kill; want at most 1 (the first refusal)", toDead, dead)
	}
}

// Issue 12 input 8: a write that reached a leader which then lost quorum
// fails with ErrOutcomeUnknown ("outcome unknown; retry with the same
// request token"), whatever the last attempt saw (a refused connection, no
// leader), and names the node that last acted as leader.
//
// The write must reach the leader while it still leads. The leader steps
// down a lease timeout after it last heard from a majority, and on loaded
// cores that can pass while the followers are being killed: then the
// leader answers that it leads no more, nothing is written, and the call
// must not say the outcome is unknown. The followers then come back and
// the case is tried again.
func TestWriteAfterQuorumLossSaysOutcomeUnknownAndLastLeader(t *testing.T) {
	cl := testcluster.Demo(t)
	ctx := testCtx(t, 5*time.Minute)
	var log rpcLog
	c := newClient(t, cl.Addrs(), client.WithDialOptions(log.interceptor()))
	for round := 1; ; round++ {
		if _, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("before")}}, 0); err != nil {
			t.Fatal(err)
		}
		leader := -1
		testcluster.WaitFor(t, 60*time.Second, "the client to know the leader", func() bool {
			if _, err := c.Check(ctx, "orders", [][]byte{[]byte("before")}, client.Linearizable); err != nil {
				return false
			}
			leader = cl.Leader()
			return leader >= 0 && c.Leader() == cl.Addrs()[leader]
		})
		var killed []int
		for i := range cl.Size() {
			if i != leader {
				if err := cl.Kill(i); err != nil {
					t.Fatal(err)
				}
				killed = append(killed, i)
			}
		}
		sent := len(log.snapshot())
		wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		_, err := c.Mark(wctx, "orders", []client.Item{{ID: fmt.Appendf(nil, "in-doubt-%d", round)}}, 0)
		cancel()
		attempts := log.snapshot()[sent:]
		if len(attempts) == 0 || attempts[0].target != cl.Addrs()[leader] {
			t.Fatalf("round %d: the first attempt went to %v, want the leader %s", round, attempts, cl.Addrs()[leader])
		}
		if errors.Is(client.AsError(attempts[0].err), client.ErrNotLeader) {
			// The leader had stepped down before the write reached it.
			if errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("round %d: %v, although the leader refused the write and no other node accepted a connection", round, err)
			}
			if round == 5 {
				t.Fatalf("the leader stepped down before the write reached it in %d rounds; last: %v", round, err)
			}
			t.Logf("round %d: the leader stepped down before the write reached it (%v); again", round, err)
			for _, i := range killed {
				if err := cl.Restart(ctx, i); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := cl.WaitLeader(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("mark without quorum: %v, want ErrOutcomeUnknown", err)
		}
		if !strings.Contains(err.Error(), "outcome unknown; retry with the same request token") {
			t.Errorf("error text %q does not say so", err)
		}
		var e *client.Error
		if !errors.As(err, &e) || e.LastLeader != cl.Addrs()[leader] {
			t.Errorf("last leader %q, want %s (the node that led)", e.LastLeader, cl.Addrs()[leader])
		}
		return
	}
}

func (l *rpcLog) snapshot() []rpcCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]rpcCall(nil), l.calls...)
}
