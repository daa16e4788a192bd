package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/replicacheck"
)

// digestNodeJSON is one node's line of digest --output json.
type digestNodeJSON struct {
	NodeID            string `json:"node_id"`
	Addr              string `json:"grpc_addr"`
	AppliedIndex      uint64 `json:"applied_index,omitempty"`
	AppliedTerm       uint64 `json:"applied_term,omitempty"`
	Records           uint64 `json:"records,omitempty"`
	Keys              uint64 `json:"keys,omitempty"`
	LastAppliedUnixMs int64  `json:"last_applied_unix_ms,omitempty"`
	Digest            string `json:"digest,omitempty"`
	Error             string `json:"error,omitempty"`
}

func newDigestCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "digest [flags]",
		Short: "Check that every replica holds the same state (SHA-256 digest at one applied index)",
		Long: `Digest asks every member of the cluster (as listed by the first node of
--addr that answers) for a SHA-256 digest of its whole state together with
the Raft applied index it covers, and reports whether the replicas agree.

Digests are comparable only at the same applied index, and a node cannot be
asked for its digest at a past index: digest asks all nodes at once, again
every --interval, until one round finds every node at the same applied index
(normally the first round once writes stop), then compares. Under continuous
writes that round may never come: run it on a quiet cluster (the leader's
occasional expiry ticks are fine). Each node scans its whole state for its
answer (about as long as a backup's read; writes are not blocked).

Output: one line per node (node, gRPC address, applied index, records,
digest), then the verdict. --output json prints one object with agree,
same_index, applied_index, rounds and nodes (node_id, grpc_addr,
applied_index, applied_term, records, keys, last_applied_unix_ms, digest in
hex, error). Exit 0: every replica has the same digest at the same applied
index. Exit 1: the digests differ (the replicas diverged: a bug), a node did
not answer, or no common applied index was seen within --timeout.`,
		Example: strings.ReplaceAll(`  dedupnode digest --addr 127.0.0.1:7070
  dedupnode digest --addr 127.0.0.1:7070 --timeout 1m --output json | jq .agree`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(cmd); err != nil {
				return err
			}
			if interval <= 0 {
				return usagef("--interval %v: want a positive duration", interval)
			}
			st, err := firstStatus(e, cmd, f)
			if err != nil {
				return err
			}
			return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
				var nodes []string
				addrs := map[string]string{}
				for _, m := range st.Members {
					nodes = append(nodes, m.ID)
					addrs[m.ID] = m.GRPCAddr
				}
				if len(nodes) == 0 {
					return &opError{err: errors.New("the cluster lists no members")}
				}
				var mu sync.Mutex
				denied := map[string]string{} // node → the node's refusal
				ask := func(ctx context.Context, node string) (*dedupv1.DigestResponse, error) {
					if addrs[node] == "" {
						return nil, errors.New("no gRPC address known for this member")
					}
					r, err := c.DigestOf(ctx, addrs[node])
					if errors.Is(err, client.ErrPermissionDenied) {
						mu.Lock()
						denied[node] = client.AsError(err).Message
						mu.Unlock()
					}
					if err != nil {
						// Explained with this member's address, not --addr's.
						nf := &clientFlags{addrs: []string{addrs[node]}, timeout: f.timeout, output: f.output,
							tlsCA: f.tlsCA, tlsCert: f.tlsCert, tlsKey: f.tlsKey, token: f.token}
						return nil, explain(err, nf, "")
					}
					return r, nil
				}
				res := replicacheck.Compare(ctx, nodes, ask, replicacheck.Options{Interval: interval})
				if f.output == "json" {
					out := map[string]any{"agree": res.Agree, "same_index": res.SameIndex, "rounds": res.Rounds}
					if res.SameIndex {
						out["applied_index"] = res.Index
					}
					var list []digestNodeJSON
					for _, a := range res.Answers {
						n := digestNodeJSON{NodeID: a.Node, Addr: addrs[a.Node]}
						if a.Err != nil {
							n.Error = oneLine(a.Err.Error())
						} else {
							n.AppliedIndex, n.AppliedTerm, n.Records, n.Keys = a.Resp.AppliedIndex, a.Resp.AppliedTerm, a.Resp.Records, a.Resp.Keys
							n.LastAppliedUnixMs, n.Digest = a.Resp.LastAppliedUnixMs, replicacheck.Hex(a.Resp.Digest)
						}
						list = append(list, n)
					}
					out["nodes"] = list
					if err := writeJSON(e.stdout, out); err != nil {
						return err
					}
				} else {
					tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NODE\tADDR\tAPPLIED_INDEX\tRECORDS\tDIGEST")
					for _, a := range res.Answers {
						if a.Err != nil {
							fmt.Fprintf(tw, "%s\t%s\t-\t-\terror: %s\n", a.Node, addrs[a.Node], oneLine(a.Err.Error()))
							continue
						}
						fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", a.Node, addrs[a.Node], a.Resp.AppliedIndex, a.Resp.Records, replicacheck.Hex(a.Resp.Digest))
					}
					tw.Flush()
					if res.Agree {
						fmt.Fprintf(e.stdout, "agree: %d replicas, same digest at applied index %d\n", len(res.Answers), res.Index)
					}
				}
				if !res.Agree && len(denied) > 0 {
					// The token, not the nodes: starting or removing
					// nodes would not help.
					var who []string
					var msg string
					for _, a := range res.Answers {
						if m, ok := denied[a.Node]; ok {
							who, msg = append(who, a.Node), m
						}
					}
					return &opError{err: fmt.Errorf("permission denied by %s: %s", strings.Join(who, ", "), msg),
						hint: "digest needs a token with the admin right on all namespaces (\"*\"): pass one with --token or DEDUPNODE_TOKEN, or ask an admin to grant it in the auth file"}
				}
				if !res.Agree {
					return &opError{err: errors.New(res.Summary())}
				}
				return nil
			})
		}),
	}
	f.register(cmd)
	cmd.Flags().Lookup("timeout").Usage = "give up finding the members, and then waiting for every node to report the same applied index, after this `DURATION` each"
	cmd.Flags().DurationVar(&interval, "interval", 200*time.Millisecond, "wait this `DURATION` between rounds of questions while the nodes' applied indexes differ")
	return cmd
}
