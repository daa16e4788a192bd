package cluster

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dedupnode/dedupnode/internal/diskspace"
)

// An AppendEntries carrying entries to a node whose disk has no room is
// answered with a transport error (the leader retries with backoff and
// keeps nextIndex) and never reaches raft, whose failed StoreLogs would
// answer Success=false and walk the leader back one entry per round trip.
// Heartbeats still reach raft, and entries do once there is room.
func TestAppendFilter_RefusesEntriesWithoutRoomAsTransportErrors(t *testing.T) {
	recv, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	send, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()

	var full atomic.Bool
	full.Store(true)
	var asked atomic.Uint64
	room := func(bytes uint64) error {
		asked.Store(bytes)
		if full.Load() {
			return &diskspace.RoomError{Path: "/data", Op: "appending to the raft log", Free: 0, Need: 24 << 20}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newAppendFilter(ctx, recv.Consumer(), room)
	// raft's side: answer whatever gets through, and count it.
	var reached atomic.Int64
	go func() {
		for {
			select {
			case rpc := <-f.consumer():
				reached.Add(1)
				rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
			case <-ctx.Done():
				return
			}
		}
	}()

	entries := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(send.LocalAddr())}, Term: 1,
		PrevLogEntry: 10, PrevLogTerm: 1, Entries: []*raft.Log{{Index: 11, Term: 1, Type: raft.LogCommand, Data: make([]byte, 1000)}}}
	var resp raft.AppendEntriesResponse
	err = send.AppendEntries("b", recv.LocalAddr(), entries, &resp)
	if err == nil || !strings.Contains(err.Error(), "not appending 1 entries") || !strings.Contains(err.Error(), diskspace.ErrLowSpace.Error()) {
		t.Fatalf("entries to a full disk: %v, want a transport error naming the disk", err)
	}
	if resp.Success || reached.Load() != 0 {
		t.Fatalf("entries to a full disk reached raft (%d) or succeeded (%v)", reached.Load(), resp.Success)
	}
	if asked.Load() < 1000 {
		t.Fatalf("room asked for %d bytes, want at least the entry's 1000", asked.Load())
	}

	heartbeat := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(send.LocalAddr())}, Term: 1}
	if err := send.AppendEntries("b", recv.LocalAddr(), heartbeat, &resp); err != nil || !resp.Success {
		t.Fatalf("heartbeat to a full disk: %v %v, want it answered by raft", err, resp.Success)
	}

	full.Store(false)
	if err := send.AppendEntries("b", recv.LocalAddr(), entries, &resp); err != nil || !resp.Success {
		t.Fatalf("entries once there is room: %v %v", err, resp.Success)
	}
	if got := reached.Load(); got != 2 {
		t.Fatalf("raft got %d RPCs, want the heartbeat and the entries once there was room", got)
	}
}
