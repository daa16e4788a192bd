// Command gen writes the fixture of cluster's TestReplay_V1LogFixture: a
// one-node data dir (raft-boltdb log, the only store then) whose Raft log
// holds entries in the Raft entry format of commit e7189b4 (command format
// version 1: a request token, digest and fence repeated per ID), and
// records.json, the records that build's FSM read after applying them.
//
// It was run once with the source tree of e7189b4 (copied into a worktree
// of that commit), so that the log is written by that code:
//
//	git worktree add /tmp/v1 e7189b4
//	mkdir -p /tmp/v1/cmd/v1gen && cp cluster/testdata/v1log/gen/main.go /tmp/v1/cmd/v1gen/
//	(cd /tmp/v1 && go run ./cmd/v1gen -out $PWD/cluster/testdata/v1log)
//
// and its FSM directory was then deleted: the test replays the log.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
)

// Record is one ID's state as the FSM reads it (fsm.FSM.Check).
type Record struct {
	Namespace   string `json:"ns"`
	ID          string `json:"id"`
	Code        string `json:"code"`
	State       uint8  `json:"state"`
	FirstSeenMs int64  `json:"first_seen_ms"`
	ExpiresMs   int64  `json:"expires_ms"`
	Token       []byte `json:"token"`
	Digest      []byte `json:"digest"`
	Fence       uint64 `json:"fence"`
}

// Fixture is records.json.
type Fixture struct {
	AppliedIndex uint64   `json:"applied_index"`
	LastTsMs     int64    `json:"last_ts_ms"`
	Records      []Record `json:"records"`
}

func main() {
	out := flag.String("out", "", "fixture directory to write (data/ and records.json)")
	flag.Parse()
	if *out == "" {
		log.Fatal("-out is required")
	}
	dataDir := filepath.Join(*out, "data")
	if err := os.RemoveAll(dataDir); err != nil {
		log.Fatal(err)
	}
	n, err := cluster.New(cluster.Config{
		NodeID: "v1", DataDir: dataDir, RaftAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:1", Bootstrap: true,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaderLeaseTimeout: 150 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n.WaitReady(ctx) != nil {
		if ctx.Err() != nil {
			log.Fatal("no leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	prop := func(ops ...fsm.Op) []fsm.OpResult {
		res, err := n.Propose(ctx, ops)
		if err != nil {
			log.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil {
				log.Fatalf("op %d (%v): %v", i, ops[i].Kind, r.Err)
			}
		}
		return res
	}

	sliding := fsm.DefaultNamespaceConfig("fx-sliding")
	sliding.Mode = fsm.ExpirySliding
	sliding.DefaultTTLMs = 3_600_000
	prop(fsm.Op{Kind: fsm.OpCreateNamespace, Config: fsm.DefaultNamespaceConfig("fx")},
		fsm.Op{Kind: fsm.OpCreateNamespace, Config: sliding})

	var ids []Record // (ns, id) pairs to read back
	want := func(ns, id string) { ids = append(ids, Record{Namespace: ns, ID: id}) }

	// One call of 40 IDs sharing the call's token (what a client sends).
	call := fsm.Op{Kind: fsm.OpMark, Namespace: "fx", DurationMs: 600_000}
	for i := range 40 {
		id := fmt.Sprintf("shared-%02d", i)
		call.Items = append(call.Items, fsm.Item{ID: []byte(id), Token: []byte("token-of-call-0001")})
		want("fx", id)
	}
	// Digests on some IDs; per-item tokens (the Go client's Batcher merges
	// single-ID calls, each with its own token); an empty token.
	mixed := fsm.Op{Kind: fsm.OpMark, Namespace: "fx"}
	for i := range 12 {
		id := fmt.Sprintf("mixed-%02d", i)
		it := fsm.Item{ID: []byte(id), Token: []byte(fmt.Sprintf("own-token-%02d", i))}
		if i%3 == 0 {
			it.Digest = []byte(fmt.Sprintf("sha256-of-payload-%02d", i))
		}
		if i == 5 {
			it.Token = nil
		}
		mixed.Items = append(mixed.Items, it)
		want("fx", id)
	}
	// Several calls grouped into one entry, in the default and the sliding
	// namespace, and a duplicate with another token (answers DUPLICATE).
	prop(call, mixed,
		fsm.Op{Kind: fsm.OpMark, Namespace: "fx-sliding", DurationMs: 120_000, Items: []fsm.Item{{ID: []byte("slide-1"), Token: []byte("t-s")}, {ID: []byte("slide-2"), Token: []byte("t-s")}}},
		fsm.Op{Kind: fsm.OpMark, Items: []fsm.Item{{ID: []byte("default-ns-id"), Token: []byte("t-d"), Digest: []byte("d")}}},
		fsm.Op{Kind: fsm.OpMark, Namespace: "fx", Items: []fsm.Item{{ID: []byte("shared-00"), Token: []byte("another-token")}}})
	want("fx-sliding", "slide-1")
	want("fx-sliding", "slide-2")
	want("default", "default-ns-id")
	// A later duplicate extends a sliding record.
	prop(fsm.Op{Kind: fsm.OpMark, Namespace: "fx-sliding", DurationMs: 300_000, Items: []fsm.Item{{ID: []byte("slide-1"), Token: []byte("t-s2")}}})

	// Claims (fenced leases), then commit, renew, release with the fences.
	claim := fsm.Op{Kind: fsm.OpClaim, Namespace: "fx", DurationMs: 60_000}
	for i := range 4 {
		id := fmt.Sprintf("lease-%d", i)
		claim.Items = append(claim.Items, fsm.Item{ID: []byte(id), Token: []byte("claim-call")})
		want("fx", id)
	}
	res := prop(claim)
	fence := func(i int) uint64 { return res[0].Items[i].Record.Fence }
	prop(fsm.Op{Kind: fsm.OpCommit, Namespace: "fx", DurationMs: 900_000, Items: []fsm.Item{{ID: []byte("lease-0"), Token: []byte("commit-call"), Fence: fence(0)}}},
		fsm.Op{Kind: fsm.OpRenew, Namespace: "fx", DurationMs: 90_000, Items: []fsm.Item{{ID: []byte("lease-1"), Token: []byte("renew-call"), Fence: fence(1)}}},
		fsm.Op{Kind: fsm.OpRelease, Namespace: "fx", Items: []fsm.Item{{ID: []byte("lease-2"), Token: []byte("release-call"), Fence: fence(2)}}})
	// Forget, a tick, a node-table entry and a namespace update.
	prop(fsm.Op{Kind: fsm.OpForget, Namespace: "fx", Items: []fsm.Item{{ID: []byte("shared-39"), Token: []byte("forget-call")}}},
		fsm.Op{Kind: fsm.OpTick},
		fsm.Op{Kind: fsm.OpSetNode, Node: fsm.NodeInfo{ID: "other", GRPCAddr: "10.0.0.9:7070"}})
	upd := sliding
	upd.DefaultTTLMs = 7_200_000
	prop(fsm.Op{Kind: fsm.OpUpdateNamespace, Config: upd})
	if err := n.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}

	f, err := fsm.New(fsm.Config{Dir: filepath.Join(dataDir, "fsm")})
	if err != nil {
		log.Fatal(err)
	}
	fx := Fixture{AppliedIndex: f.AppliedIndex(), LastTsMs: f.LastTimestamp()}
	for _, r := range ids {
		got, err := f.Check(r.Namespace, [][]byte{[]byte(r.ID)}, fx.LastTsMs)
		if err != nil {
			log.Fatal(err)
		}
		rec := got[0].Record
		fx.Records = append(fx.Records, Record{Namespace: r.Namespace, ID: r.ID, Code: got[0].Code.String(), State: uint8(rec.State),
			FirstSeenMs: rec.FirstSeenMs, ExpiresMs: rec.ExpiresMs, Token: rec.Token, Digest: rec.Digest, Fence: rec.Fence})
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	b, err := json.MarshalIndent(fx, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "records.json"), append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	// The test replays the log into an empty FSM.
	if err := os.RemoveAll(filepath.Join(dataDir, "fsm")); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s: applied index %d, %d records\n", *out, fx.AppliedIndex, len(fx.Records))
}
