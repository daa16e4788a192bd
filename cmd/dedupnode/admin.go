package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/spf13/cobra"
)

// firstStatus returns the view of the first node in --addr order that
// answers.
func firstStatus(e *env, cmd *cobra.Command, f *clientFlags) (client.Status, error) {
	var st client.Status
	err := f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
		for _, a := range f.addrs {
			s, err := c.StatusOf(ctx, a)
			if err == nil {
				st = s
				return nil
			}
			if !client.Heals(err) {
				return explain(err, f, "")
			}
		}
		// None of the given addresses answered at once: let the client
		// retry across every node it knows until --timeout.
		s, err := c.Status(ctx)
		if err != nil {
			return explain(err, f, "")
		}
		st = s
		return nil
	})
	return st, err
}

func newStatusCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var wait bool
	cmd := &cobra.Command{
		Use:   "status [flags]",
		Short: "Show the leader, Raft indexes, members, IDs stored and Bloom filter figures",
		Long: `Status prints the cluster as seen by the first node of --addr that answers:
its role, the leader, the Raft term and commit/applied indexes, the members
with their suffrage (voter, nonvoter or replica), the number of IDs stored and the
Bloom filter figures (memory, bits per ID, configured and observed
false-positive rate), and the cluster's ID (which every client command
checks: --cluster-id). --output json prints one JSON object with node_id,
cluster_id, state, leader_id, leader_grpc_addr, term, commit_index, applied_index,
members (id, raft_addr, grpc_addr, suffrage, leader, region, reachability,
and unreachable_since, log_lag, last_error when set), ids_stored, bloom, and
region and preferred_leader_regions when set.

Each member's liveness (LIVENESS; reachability in JSON) is the leader's view,
from its Raft heartbeats, whichever node answers: a follower asks the leader.
reachable: it answered within the last heartbeat timeout (with how many log
entries it was behind, if any); UNREACHABLE: a call to it failed since it
last answered, or it answered none for a heartbeat timeout (a killed, frozen
or cut-off node), with when the leader last heard from it and the last
error; unknown: no leader answered (election, no quorum, or the leader did
not answer within 1 s). The answering node's own health is the health line.

--wait asks the first node of --addr only, and returns once that node knows
a leader, its applied index has reached the leader's commit index as read
from the leader when the wait began, and it is healthy (its status says so
and its gRPC health check answers SERVING: not while a new leader is still
getting ready, nor with its disk low): the node has caught up and can
serve. It exits 1 if that does not happen within --timeout, saying why.
Use it after starting or restarting a node, before taking down the next
one.`,
		Example: strings.ReplaceAll(`  dedupnode status --addr 127.0.0.1:7070
  dedupnode status --addr 127.0.0.1:7071 --wait   # until n2 knows a leader and has caught up
  dedupnode status --output json | jq -r .leader_id`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(cmd); err != nil {
				return err
			}
			var st client.Status
			var err error
			if wait {
				st, err = waitStatus(e, cmd, f)
			} else {
				st, err = firstStatus(e, cmd, f)
			}
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(e.stdout, statusJSON(st))
			}
			printStatus(e.stdout, st)
			return nil
		}),
	}
	f.register(cmd)
	cmd.Flags().Lookup("timeout").Usage = "give up after this `DURATION`: asking the nodes of --addr, or with --wait, waiting for the node to catch up"
	cmd.Flags().BoolVar(&wait, "wait", false, "wait (up to --timeout) until the first node of --addr knows a leader, has applied the log up to the leader's commit index as of the wait's start (caught up) and is healthy (SERVING)")
	return cmd
}

// waitStatus polls the first node of --addr until it names a leader, has
// applied the log up to the leader's commit index (read from the leader
// once, when the leader first becomes known) and is healthy, or --timeout
// passes.
func waitStatus(e *env, cmd *cobra.Command, f *clientFlags) (client.Status, error) {
	var st client.Status
	err := f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) (err error) {
		st, err = waitCaughtUp(ctx, e, f, c)
		return err
	})
	return st, err
}

// waitCaughtUp is waitStatus's loop, with c until ctx (--timeout) ends.
func waitCaughtUp(ctx context.Context, e *env, f *clientFlags, c *client.Client) (client.Status, error) {
	addr := f.addrs[0]
	var (
		st      client.Status
		lastErr error
		target  uint64
		known   bool // target read from the leader
		serving bool // the node's gRPC health check answered SERVING
	)
	for {
		st, lastErr = c.StatusOf(ctx, addr)
		if lastErr != nil && !client.Heals(lastErr) {
			// Bad credentials, a TLS mismatch, a wrong port: waiting
			// does not heal them.
			return client.Status{}, explain(lastErr, f, "")
		}
		if lastErr == nil && st.LeaderID != "" {
			if !known {
				ls := st
				if st.State != "leader" && st.LeaderGRPCAddr != "" {
					ls, lastErr = c.StatusOf(ctx, st.LeaderGRPCAddr)
				}
				if lastErr == nil && ls.State == "leader" {
					target, known = ls.CommitIndex, true
				}
			}
			if known && st.AppliedIndex >= target && st.Healthy {
				// What load balancers see: the health service, which the
				// node updates from the verdict its status carries.
				serving, lastErr = c.HealthOf(ctx, addr)
				if lastErr != nil && !client.Heals(lastErr) {
					return client.Status{}, explain(lastErr, f, "")
				}
				if waitDone(st, target, known, serving) {
					return st, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if e.ctx.Err() != nil {
				return client.Status{}, explain(e.ctx.Err(), f, "")
			}
			switch {
			case lastErr != nil && st.NodeID == "":
				return client.Status{}, explain(lastErr, f, "")
			case st.LeaderID == "":
				return client.Status{}, &opError{err: fmt.Errorf("%s knows no leader after --timeout %s", addr, f.timeout),
					hint: "a majority of the members must be up and reach each other; see the node logs"}
			case !known:
				return client.Status{}, &opError{err: fmt.Errorf("could not read the commit index of the leader %s at %s within --timeout %s", st.LeaderID, st.LeaderGRPCAddr, f.timeout),
					hint: "check that the leader's gRPC address is reachable from here"}
			}
			if st.AppliedIndex < target {
				return client.Status{}, &opError{err: fmt.Errorf("%s has applied up to index %d, not yet the leader's commit index %d, after --timeout %s", addr, st.AppliedIndex, target, f.timeout),
					hint: "it is still catching up: wait longer with a larger --timeout, or see its log"}
			}
			if !st.Healthy {
				return client.Status{}, &opError{err: fmt.Errorf("%s has caught up but is not healthy after --timeout %s: %s", addr, f.timeout, st.HealthReason),
					hint: "see its log and 'dedupnode status --addr " + addr + "'"}
			}
			return client.Status{}, &opError{err: fmt.Errorf("%s reports itself healthy but its gRPC health check did not answer SERVING within --timeout %s", addr, f.timeout),
				hint: "see its log"}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitDone is status --wait's condition on the node's status st: it knows
// a leader, has applied up to target (the leader's commit index, known
// once read), and is healthy, both in st and in its gRPC health check
// (serving).
func waitDone(st client.Status, target uint64, known, serving bool) bool {
	return st.LeaderID != "" && known && st.AppliedIndex >= target && st.Healthy && serving
}

// statusJSONShape is client.Status with the leader time omitted when
// unknown.
type statusJSONShape struct {
	client.Status
	LeaderTime string `json:"leader_time,omitempty"`
}

func statusJSON(st client.Status) statusJSONShape {
	out := statusJSONShape{Status: st}
	if !st.LeaderTime.IsZero() {
		out.LeaderTime = st.LeaderTime.Format(timeLayout)
	}
	if out.Members == nil {
		out.Members = []client.Member{}
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func printStatus(w io.Writer, st client.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	leader := st.LeaderID
	if leader == "" {
		leader = "(none: election in progress or no quorum)"
	} else if st.LeaderGRPCAddr != "" {
		leader += " at " + st.LeaderGRPCAddr
	}
	if st.ReadReplica {
		fmt.Fprintf(tw, "node\t%s (%s, read replica)\n", st.NodeID, st.State)
	} else {
		fmt.Fprintf(tw, "node\t%s (%s)\n", st.NodeID, st.State)
	}
	if st.ClusterID != "" {
		fmt.Fprintf(tw, "cluster\t%s\n", st.ClusterID)
	} else {
		fmt.Fprintf(tw, "cluster\t(not applied on this node yet)\n")
	}
	if st.Region != "" || len(st.PreferredLeaderRegions) > 0 {
		region, pref := st.Region, strings.Join(st.PreferredLeaderRegions, ",")
		if region == "" {
			region = "-"
		}
		if pref == "" {
			pref = "none"
		}
		fmt.Fprintf(tw, "region\t%s (preferred leader regions: %s)\n", region, pref)
	}
	if st.Healthy {
		fmt.Fprintf(tw, "health\tSERVING\n")
	} else {
		fmt.Fprintf(tw, "health\tNOT_SERVING: %s\n", st.HealthReason)
	}
	fmt.Fprintf(tw, "leader\t%s\n", leader)
	fmt.Fprintf(tw, "term\t%d\n", st.Term)
	fmt.Fprintf(tw, "commit index\t%d\n", st.CommitIndex)
	fmt.Fprintf(tw, "applied index\t%d\n", st.AppliedIndex)
	fmt.Fprintf(tw, "last snapshot\t%d\n", st.LastSnapshotIndex)
	plural := "s"
	if st.Buckets == 1 {
		plural = ""
	}
	fmt.Fprintf(tw, "ids stored\t%d (in %d expiry bucket%s)\n", st.IDsStored, st.Buckets, plural)
	b := st.Bloom
	ready := "ready"
	if !b.Ready {
		ready = "rebuilding (reads go to storage)"
	}
	fmt.Fprintf(tw, "bloom\t%s, %d filters, %s, %d ids, %.1f bits/id\n", ready, b.Filters, humanBytes(b.MemoryBytes), b.IDs, b.BitsPerID)
	fmt.Fprintf(tw, "bloom fp rate\tconfigured %.2f%%, observed %.2f%% (%d false of %d maybe lookups)\n",
		100*b.ConfiguredFPRate, 100*b.ObservedFPRate, b.FalsePositives, b.MaybeLookups)
	if d := st.Disk; d.TotalBytes > 0 {
		state := "ok"
		switch {
		case d.ApplyPaused:
			state = "FULL: applying paused"
		case d.WritesRefused:
			state = "LOW: writes refused"
		}
		fmt.Fprintf(tw, "disk\t%s: %s free of %s (writes refused below %s), node files %s\n",
			state, humanBytes(d.FreeBytes), humanBytes(d.TotalBytes), humanBytes(d.MinFreeBytes), humanBytes(d.UsedBytes))
	}
	if st.LogStoreStalled {
		fmt.Fprintf(tw, "raft log store\tSTALLED (longest write %v)\n", st.LogStoreMaxWrite)
	}
	tw.Flush()
	fmt.Fprintln(w)
	printMembers(w, st.Members)
}

// printMembers prints the members' table. LIVENESS is last so that the
// columns scripts read by position keep their place.
func printMembers(w io.Writer, ms []client.Member) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREGION\tSUFFRAGE\tRAFT ADDR\tGRPC ADDR\tLEADER\tLIVENESS")
	for _, m := range ms {
		l := ""
		if m.Leader {
			l = "*"
		}
		region := m.Region
		if region == "" {
			region = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, region, m.Suffrage, m.RaftAddr, m.GRPCAddr, l, liveness(m, time.Now()))
	}
	tw.Flush()
}

// liveness is a member's LIVENESS cell: reachable (with its log lag when
// behind), UNREACHABLE with since when and the leader's last error, or
// unknown (no leader answered).
func liveness(m client.Member, now time.Time) string {
	switch m.Reachability {
	case client.Reachable:
		if m.LogLag > 0 {
			return fmt.Sprintf("reachable (%d entries behind)", m.LogLag)
		}
		return "reachable"
	case client.Unreachable:
		out := "UNREACHABLE"
		if !m.UnreachableSince.IsZero() {
			out += fmt.Sprintf(" since %s (%s)", m.UnreachableSince.UTC().Format(timeLayout), now.Sub(m.UnreachableSince).Round(time.Second))
		}
		if m.LastError != "" {
			out += ": " + m.LastError
		}
		return out
	}
	return "unknown (no leader answered)"
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func newMembersCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "members [flags]",
		Short: "List the cluster's members with their addresses and suffrage",
		Long: `Members lists the nodes of the Raft configuration: ID, region (serve
--region, "-" when none), suffrage (voter, nonvoter: a joined node votes
once it has caught up, or replica: a read replica, which never votes unless
promoted with 'promote'), Raft and gRPC
addresses, which one leads, and its liveness as the leader sees it
(reachable, UNREACHABLE since when, or unknown; see status --help).
--output json prints one object per member.`,
		Example: strings.ReplaceAll(`  dedupnode members --addr 127.0.0.1:7070`, "dedupnode ", e.progName+" "),
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(cmd); err != nil {
				return err
			}
			st, err := firstStatus(e, cmd, f)
			if err != nil {
				return err
			}
			if f.output == "json" {
				for _, m := range st.Members {
					if err := writeJSON(e.stdout, m); err != nil {
						return err
					}
				}
				return nil
			}
			printMembers(e.stdout, st.Members)
			return nil
		}),
	}
	f.register(cmd)
	return cmd
}

func newJoinCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var id, raftAddr, grpcAddr string
	var force bool
	cmd := &cobra.Command{
		Use:   "join --node-id ID --raft-addr HOST:PORT --grpc-addr HOST:PORT [flags]",
		Short: "Add a running node to the cluster (as a non-voter, promoted once caught up)",
		Long: `Join asks the cluster at --addr to add the node with the given ID and
addresses. The node enters as a non-voter and the leader promotes it to
voter once it has caught up. A node started with 'serve --join ADDR' does
this by itself; use this command for nodes started without it.

Start the node first: join asks the node at --grpc-addr for its status and
refuses (exit 1, nothing changed) when no dedupnode node answers there or
the one that does has another ID. --force adds the node without asking.`,
		Example: strings.ReplaceAll(`  dedupnode join --addr 127.0.0.1:7070 --node-id n4 --raft-addr 10.0.0.4:7000 --grpc-addr 10.0.0.4:7070`, "dedupnode ", e.progName+" "),
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags([]string{"node-id", id, "raft-addr", raftAddr, "grpc-addr", grpcAddr}); err != nil {
				return err
			}
			if err := checkNodeIDFlag("--node-id", id); err != nil {
				return err
			}
			if err := checkHostPortFlag("--raft-addr", raftAddr); err != nil {
				return err
			}
			if err := checkHostPortFlag("--grpc-addr", grpcAddr); err != nil {
				return err
			}
			c, err := f.dial(e.ctx, cmd)
			if err != nil {
				return explain(err, f, "")
			}
			if !force {
				if err := checkJoiner(e, f, id, grpcAddr); err != nil {
					c.Close()
					return err
				}
			}
			defer c.Close()
			ctx, cancel := f.withTimeout(e.ctx)
			defer cancel()
			// Join is idempotent: say so when the node was a member already
			// rather than claim it joined (it may well be a voter).
			// A member at another Raft address keeps its suffrage and
			// takes the new address (OPERATIONS.md, "Changing a node's
			// Raft address").
			var was, movedFrom string
			if st, err := c.Status(ctx); err == nil {
				for _, m := range st.Members {
					if m.ID == id {
						was = m.Suffrage
						if m.RaftAddr != raftAddr {
							movedFrom = m.RaftAddr
						}
					}
				}
			}
			// A member keeps its ID, even one from before the rule on
			// separators; a new one follows it.
			if was == "" {
				if err := checkNewNodeIDFlag("--node-id", id); err != nil {
					return err
				}
			}
			if err := c.Join(ctx, id, raftAddr, grpcAddr); err != nil {
				return explain(err, f, "")
			}
			if was != "" && movedFrom != "" {
				return report(e.stdout, f.output, map[string]any{"joined": id, "raft_addr": raftAddr, "grpc_addr": grpcAddr, "already_member": was, "previous_raft_addr": movedFrom},
					"%s is a member already (%s); its Raft address is now %s (was %s)", id, was, raftAddr, movedFrom)
			}
			if was != "" {
				return report(e.stdout, f.output, map[string]any{"joined": id, "raft_addr": raftAddr, "grpc_addr": grpcAddr, "already_member": was},
					"%s is a member already (%s); nothing changed", id, was)
			}
			return report(e.stdout, f.output, map[string]any{"joined": id, "raft_addr": raftAddr, "grpc_addr": grpcAddr},
				"%s joined as a non-voter; it becomes a voter once caught up (see '%s members')", id, e.progName)
		}),
	}
	f.register(cmd)
	cmd.Flags().StringVar(&id, "node-id", "", "`ID` of the node to add (unique across all time)")
	cmd.Flags().StringVar(&raftAddr, "raft-addr", "", "Raft `HOST:PORT` of the node, as the others reach it")
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", "", "gRPC `HOST:PORT` of the node, as clients reach it")
	cmd.Flags().BoolVar(&force, "force", false, "add the node without checking that it answers at --grpc-addr with --node-id")
	return cmd
}

// checkJoiner checks that a dedupnode node with ID id answers at grpcAddr
// (one Status, with the CLI's connection flags, within --timeout).
func checkJoiner(e *env, f *clientFlags, id, grpcAddr string) error {
	conn, err := f.connOptions()
	if err != nil {
		return err
	}
	ctx, cancel := f.withTimeout(e.ctx)
	defer cancel()
	hint := fmt.Sprintf("start the node first (serve --node-id %s --grpc-addr %s ...) and check --grpc-addr, or pass --force to add it anyway", id, grpcAddr)
	pc, err := client.New(ctx, []string{grpcAddr}, append([]client.Option{client.WithPinnedNode(), client.WithRetry(1, 0, 0),
		client.WithAttemptTimeout(-1)}, conn...)...)
	var st client.Status
	if err == nil {
		st, err = pc.StatusOf(ctx, grpcAddr)
		pc.Close()
	}
	if err != nil {
		what := client.AsError(err).Message
		if what == "" {
			what = err.Error()
		}
		if h := tlsHint(err); h != "" {
			hint = h + "; or pass --force to add the node without asking it"
		}
		return &opError{err: fmt.Errorf("no dedupnode node answers at --grpc-addr %s (%s); nothing changed", grpcAddr, what), hint: hint}
	}
	if st.NodeID != id {
		return &opError{err: fmt.Errorf("the node at --grpc-addr %s is %q, not %q; nothing changed", grpcAddr, st.NodeID, id),
			hint: "check --node-id and --grpc-addr, or pass --force to add it anyway"}
	}
	return nil
}

func newRemoveCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "remove [flags] NODE_ID",
		Short: "Remove a node from the cluster's configuration",
		Long: `Remove takes a node out of the Raft configuration, for example a machine
that is gone for good. Remove one node at a time and keep a majority of the
remaining voters up. A removed node's ID must not be reused.`,
		Example: strings.ReplaceAll(`  dedupnode remove --addr 127.0.0.1:7070 n3`, "dedupnode ", e.progName+" "),
		Args:    cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.Remove(ctx, args[0]); err != nil {
					return explain(err, f, "")
				}
				if len(args[0]) > fsm.MaxNodeIDBytes {
					// Admitted by a version that did not check IDs: the
					// state machine never recorded it, so there was
					// nothing to retire (join refuses such IDs now).
					return report(e.stdout, f.output, map[string]any{"removed": args[0], "retired": false},
						"%.32q... removed from the Raft configuration; its ID is %d bytes, longer than the %d bytes the state machine records, so it was in no node table and is not retired (join refuses such an ID)",
						args[0], len(args[0]), fsm.MaxNodeIDBytes)
				}
				return report(e.stdout, f.output, map[string]any{"removed": args[0]}, "%s removed", args[0])
			})
		}),
	}
	f.register(cmd)
	return cmd
}

func newTransferLeaderCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "transfer-leader [flags] [NODE_ID]",
		Short: "Hand leadership to another voter (before maintenance on the leader)",
		Long: `Transfer-leader asks the current leader to hand leadership to the voter
NODE_ID, or, without NODE_ID, to the most up-to-date voter. Writes pause
for the moment of the hand-over and clients follow the new leader. If
NODE_ID leads already, it says so and exits 0.`,
		Example: strings.ReplaceAll(`  dedupnode transfer-leader --addr 127.0.0.1:7070
  dedupnode transfer-leader n2`, "dedupnode ", e.progName+" "),
		Args: cobra.MaximumNArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			target := ""
			if len(args) == 1 {
				target = args[0]
			}
			return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
				if target != "" {
					if st, err := c.Status(ctx); err == nil && st.LeaderID == target {
						// What was asked for holds already.
						return report(e.stdout, f.output, map[string]any{"new_leader_id": target}, "%s already leads", target)
					}
				}
				leader, err := c.TransferLeadership(ctx, target)
				if err != nil {
					return explain(err, f, "")
				}
				return report(e.stdout, f.output, map[string]any{"new_leader_id": leader}, "leader is now %s", leader)
			})
		}),
	}
	f.register(cmd)
	return cmd
}

// report prints a one-line outcome: v as JSON, or the formatted text.
func report(w io.Writer, format string, v any, text string, args ...any) error {
	if format == "json" {
		return writeJSON(w, v)
	}
	_, err := fmt.Fprintf(w, text+"\n", args...)
	return err
}
