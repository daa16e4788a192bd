// Command scaleprobe times how long a dedupnode node takes to become
// useful after it was started, for scripts/scale.sh. It polls one node
// through a client pinned to it (client.WithPinnedNode: no leader routing,
// unlike the CLI) and prints, as one JSON object, the milliseconds from --since
// (a Unix time in nanoseconds, taken just before the node was started) to
// each milestone it reached:
//
//	listen_ms      the gRPC port accepts TCP connections
//	status_ms      Admin.Status answers
//	leader_ms      the node names a leader
//	caught_up_ms   its applied index reached the leader's commit index, as
//	               read from the leader when the leader first became known
//	               (what `dedupnode status --wait` waits for)
//	check_ms       a linearizable Check of --id sent to this node answers
//	               SEEN (a follower asks the leader for a read index and
//	               answers from its own state)
//	snapshot_ms    its last snapshot index is above zero (a fresh follower:
//	               the snapshot it was sent is in its snapshot store; it
//	               is restored into the state machine after that)
//	voter_ms       it is a voter in its own view of the configuration
//	bloom_ms       its Bloom filters are ready (loaded or rebuilt)
//
// Every poll is bounded by --timeout; the command exits 1 if a milestone
// asked for with --until was not reached in time (the JSON still says
// which were).
//
// scaleprobe --raft-log DATADIR instead reads the Raft log of a STOPPED
// node (either store) and prints, as one JSON object, the store, its first
// and last index, the entries and their bytes (what the log must keep), and
// the allocated bytes of the log's file or directory (what it takes on
// disk, as du counts them).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
)

// printRaftLog prints cluster.InspectLog's figures and the allocated size
// of the log on disk.
func printRaftLog(dataDir string) error {
	info, err := cluster.InspectLog(dataDir)
	if err != nil {
		return err
	}
	var disk int64
	err = filepath.Walk(info.Path, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !fi.IsDir() {
			disk += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"store": info.Store, "path": info.Path, "first_index": info.FirstIndex, "last_index": info.LastIndex,
		"entries": info.Entries, "entry_bytes": info.EntryBytes, "disk_bytes": disk,
	})
}

type result struct {
	Addr       string `json:"addr"`
	ListenMs   *int64 `json:"listen_ms,omitempty"`
	StatusMs   *int64 `json:"status_ms,omitempty"`
	LeaderMs   *int64 `json:"leader_ms,omitempty"`
	CaughtUpMs *int64 `json:"caught_up_ms,omitempty"`
	CheckMs    *int64 `json:"check_ms,omitempty"`
	SnapshotMs *int64 `json:"snapshot_ms,omitempty"`
	VoterMs    *int64 `json:"voter_ms,omitempty"`
	BloomMs    *int64 `json:"bloom_ms,omitempty"`
	// Target is the leader commit index caught_up_ms waited for.
	Target uint64 `json:"target_index,omitempty"`
	// Snapshot is the node's last snapshot index when snapshot_ms was met.
	Snapshot uint64 `json:"snapshot_index,omitempty"`
	Error    string `json:"error,omitempty"`
}

func main() {
	var (
		addr      = flag.String("addr", "", "gRPC HOST:PORT of the node")
		sinceNs   = flag.Int64("since", 0, "Unix time in ns the milestones are measured from (default: now)")
		timeout   = flag.Duration("timeout", 2*time.Minute, "give up after this long")
		namespace = flag.String("namespace", "default", "namespace of --id")
		id        = flag.String("id", "", "an ID marked before; check_ms waits until a linearizable Check of it answers SEEN")
		until     = flag.String("until", "caught_up,check", "comma-separated milestones to wait for: listen, status, leader, caught_up, check, snapshot, voter, bloom")
		interval  = flag.Duration("interval", 20*time.Millisecond, "poll interval")
		raftLog   = flag.String("raft-log", "", "print the Raft log figures of the stopped node whose data dir this is, and exit")
	)
	flag.Parse()
	if *raftLog != "" {
		if err := printRaftLog(*raftLog); err != nil {
			fmt.Fprintln(os.Stderr, "scaleprobe:", err)
			os.Exit(1)
		}
		return
	}
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "scaleprobe: --addr is required")
		os.Exit(2)
	}
	since := time.Now()
	if *sinceNs > 0 {
		since = time.Unix(0, *sinceNs)
	}
	want := map[string]bool{}
	for _, m := range strings.Split(*until, ",") {
		switch m = strings.TrimSpace(m); m {
		case "":
		case "listen", "status", "leader", "caught_up", "check", "snapshot", "voter", "bloom":
			want[m] = true
		default:
			fmt.Fprintf(os.Stderr, "scaleprobe: unknown milestone %q in --until\n", m)
			os.Exit(2)
		}
	}
	if want["check"] && *id == "" {
		fmt.Fprintln(os.Stderr, "scaleprobe: --until check needs --id")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res := probe(ctx, *addr, since, want, *namespace, *id, *interval)
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	if res.Error != "" {
		os.Exit(1)
	}
}

func ms(since time.Time) *int64 {
	v := time.Since(since).Milliseconds()
	return &v
}

func probe(ctx context.Context, addr string, since time.Time, want map[string]bool, ns, id string, interval time.Duration) *result {
	res := &result{Addr: addr}
	missing := func() []string {
		reached := map[string]bool{
			"listen": res.ListenMs != nil, "status": res.StatusMs != nil, "leader": res.LeaderMs != nil,
			"caught_up": res.CaughtUpMs != nil, "check": res.CheckMs != nil, "snapshot": res.SnapshotMs != nil,
			"voter": res.VoterMs != nil, "bloom": res.BloomMs != nil,
		}
		var out []string
		for m := range want {
			if !reached[m] {
				out = append(out, m)
			}
		}
		sort.Strings(out)
		return out
	}
	done := func() bool { return len(missing()) == 0 }
	sleep := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
			return true
		}
	}
	fail := func(what string) *result {
		res.Error = fmt.Sprintf("%s within the timeout (missing: %s)", what, strings.Join(missing(), ","))
		return res
	}

	// 1. the port accepts connections (a plain TCP dial: gRPC's reconnect
	// backoff would add up to seconds to a node that is not listening yet)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			res.ListenMs = ms(since)
			break
		}
		if !sleep() {
			return fail("the port never accepted a connection")
		}
	}
	// A client pinned to this node: every call goes there (no leader
	// routing), as one attempt bounded by 2 s; a quick reconnect backoff,
	// as the node may still be coming up.
	c, err := client.New(ctx, []string{addr}, client.WithPinnedNode(), client.WithRetry(1, 0, 0),
		client.WithTimeout(2*time.Second), client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer c.Close()

	var targetKnown bool
	for !done() {
		st, err := c.StatusOf(ctx, addr)
		if err == nil {
			if res.StatusMs == nil {
				res.StatusMs = ms(since)
			}
			if st.LeaderID != "" {
				if res.LeaderMs == nil {
					res.LeaderMs = ms(since)
				}
				if !targetKnown {
					if st.State == "leader" {
						res.Target, targetKnown = st.CommitIndex, true
					} else if la := st.LeaderGRPCAddr; la != "" {
						if ci, ok := leaderCommit(ctx, c, la); ok {
							res.Target, targetKnown = ci, true
						}
					}
				}
				if targetKnown && res.CaughtUpMs == nil && st.AppliedIndex >= res.Target {
					res.CaughtUpMs = ms(since)
				}
			}
			if res.SnapshotMs == nil && st.LastSnapshotIndex > 0 {
				res.SnapshotMs = ms(since)
				res.Snapshot = st.LastSnapshotIndex
			}
			if res.VoterMs == nil {
				for _, m := range st.Members {
					if m.ID == st.NodeID && m.Suffrage == "voter" {
						res.VoterMs = ms(since)
					}
				}
			}
			if res.BloomMs == nil && st.Bloom.Ready {
				res.BloomMs = ms(since)
			}
		}
		if want["check"] && res.CheckMs == nil && res.LeaderMs != nil {
			rs, err := c.Check(ctx, ns, [][]byte{[]byte(id)}, client.Linearizable)
			if err == nil && len(rs) == 1 && rs[0].Code == client.CodeSeen {
				res.CheckMs = ms(since)
			}
		}
		if done() {
			break
		}
		if !sleep() {
			return fail("not every milestone was reached")
		}
	}
	return res
}

// leaderCommit reads the leader's commit index from its own Status (one
// attempt to the leader's address, over c's connection to it).
func leaderCommit(ctx context.Context, c *client.Client, addr string) (uint64, bool) {
	st, err := c.StatusOf(ctx, addr)
	if err != nil || st.State != "leader" {
		return 0, false
	}
	return st.CommitIndex, true
}
