package netproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

func encodeRPC(t *testing.T, typ byte, req any) []byte {
	t.Helper()
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	w.WriteByte(typ)
	if err := codec.NewEncoder(w, &codec.MsgpackHandle{}).Encode(req); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	return b.Bytes()
}

func TestSenderOfReadsEveryRaftRequest(t *testing.T) {
	h := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n2"), Addr: []byte("127.0.0.1:1")}
	reqs := map[string]any{
		"append":   &raft.AppendEntriesRequest{RPCHeader: h, Term: 3, Entries: []*raft.Log{{Index: 1, Term: 1, Data: []byte("x")}}},
		"vote":     &raft.RequestVoteRequest{RPCHeader: h, Term: 3},
		"prevote":  &raft.RequestPreVoteRequest{RPCHeader: h, Term: 3},
		"snapshot": &raft.InstallSnapshotRequest{RPCHeader: h, Term: 3, Size: 10},
		"timeout":  &raft.TimeoutNowRequest{RPCHeader: h},
	}
	for name, req := range reqs {
		b := encodeRPC(t, 0, req)
		if got := SenderOf(bytes.NewReader(append(b, "trailing bytes"...))); got != "n2" {
			t.Errorf("%s: sender %q, want n2", name, got)
		}
	}
	if got := SenderOf(bytes.NewReader([]byte("PRI * HTTP/2.0\r\n"))); got != Unknown {
		t.Errorf("non-raft bytes: sender %q, want %q", got, Unknown)
	}
}

// node is a raft NetworkTransport answering AppendEntries, counting what it
// received.
type node struct {
	id    string
	trans *raft.NetworkTransport
	got   atomic.Int64
}

func newNode(t *testing.T, id string) *node {
	t.Helper()
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 500*time.Millisecond, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{id: id, trans: tr}
	t.Cleanup(func() { tr.Close() })
	go func() {
		for rpc := range tr.Consumer() {
			n.got.Add(1)
			rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
		}
	}()
	return n
}

func (n *node) send(to string, addr string) error {
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(n.id), Addr: []byte(n.trans.LocalAddr())}, Term: 1}
	var resp raft.AppendEntriesResponse
	return n.trans.AppendEntries(raft.ServerID(to), raft.ServerAddress(addr), req, &resp)
}

// eventually retries fn until it succeeds or the deadline passes.
func eventually(t *testing.T, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 20 s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func setup(t *testing.T) (*Net, *node, *node, string, string) {
	t.Helper()
	pn := New(nil)
	t.Cleanup(func() { pn.Close() })
	a, b := newNode(t, "a"), newNode(t, "b")
	pa, err := pn.Add("a", "127.0.0.1:0", string(a.trans.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	pb, err := pn.Add("b", "127.0.0.1:0", string(b.trans.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	return pn, a, b, pa, pb
}

func TestProxyForwardsRaftRPCs(t *testing.T) {
	pn, a, b, pa, pb := setup(t)
	eventually(t, "a→b", func() error { return a.send("b", pb) })
	eventually(t, "b→a", func() error { return b.send("a", pa) })
	if st := pn.Stats(); st.Unknown != 0 || st.Conns < 2 {
		t.Fatalf("stats %+v: want every connection's sender known", st)
	}
}

func TestDropIsABlackholeUntilHealed(t *testing.T) {
	pn, a, b, _, pb := setup(t)
	eventually(t, "a→b before the partition", func() error { return a.send("b", pb) })
	pn.Partition([]string{"a"}, []string{"b"})
	before := b.got.Load()
	for i := 0; i < 3; i++ {
		if err := a.send("b", pb); err == nil {
			t.Fatal("an RPC crossed a full partition")
		}
	}
	if b.got.Load() != before {
		t.Fatal("b received an RPC across a full partition")
	}
	pn.Heal()
	eventually(t, "a→b after heal", func() error { return a.send("b", pb) })
}

func TestOneWayPartitionLetsRequestsInButNoAnswersOut(t *testing.T) {
	pn, a, b, _, pb := setup(t)
	eventually(t, "a→b before the partition", func() error { return a.send("b", pb) })
	// b's bytes to a are lost: a's requests reach b, b's answers do not.
	pn.Set("b", "a", Rule{Drop: true})
	before := b.got.Load()
	err := a.send("b", pb)
	if err == nil {
		t.Fatal("an answer crossed a one-way partition")
	}
	if b.got.Load() == before {
		t.Fatalf("the request did not reach b (err %v)", err)
	}
	pn.Set("b", "a", Rule{})
	eventually(t, "a→b after heal", func() error { return a.send("b", pb) })
}

func TestDelayHoldsBytesBack(t *testing.T) {
	pn, a, _, _, pb := setup(t)
	eventually(t, "warm up", func() error { return a.send("b", pb) })
	pn.Set("a", "b", Rule{Delay: 150 * time.Millisecond})
	start := time.Now()
	eventually(t, "delayed a→b", func() error { return a.send("b", pb) })
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("RPC took %v through a 150 ms delay", d)
	}
}

func TestResetsCloseConnections(t *testing.T) {
	pn, a, _, _, pb := setup(t)
	eventually(t, "warm up", func() error { return a.send("b", pb) })
	pn.Set(Any, "b", Rule{ResetProb: 1})
	if err := a.send("b", pb); err == nil {
		t.Fatal("an RPC crossed a link that resets every chunk")
	}
	if pn.Stats().Resets == 0 {
		t.Fatal("no reset counted")
	}
	pn.Heal()
	eventually(t, "a→b after heal", func() error { return a.send("b", pb) })
}

func TestUnknownSendersOnlyMatchWildcards(t *testing.T) {
	pn, _, _, _, pb := setup(t)
	pn.Set("a", "b", Rule{Drop: true})
	c, err := net.Dial("tcp", pb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Not Raft: forwarded as is (b's transport then rejects it).
	if _, err := c.Write([]byte{0xc1, 0xc1, 0xc1, 0xc1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "unknown sender counted", func() error {
		if pn.Stats().Unknown == 0 {
			return errors.New("no unknown connection yet")
		}
		return nil
	})
}

func TestWildcardRuleCoversEveryLink(t *testing.T) {
	pn, a, _, _, pb := setup(t)
	eventually(t, "warm up", func() error { return a.send("b", pb) })
	pn.Set(Any, Any, Rule{Drop: true})
	if err := a.send("b", pb); err == nil {
		t.Fatal("an RPC crossed a link dropped by the wildcard rule")
	}
	pn.Heal()
	eventually(t, "a→b after heal", func() error { return a.send("b", pb) })
}
