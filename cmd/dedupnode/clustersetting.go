package main

import (
	"context"
	"strings"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/spf13/cobra"
)

// newClusterSettingCmd is `dedupnode cluster-setting NAME [VALUE]`.
func newClusterSettingCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var unset bool
	cmd := &cobra.Command{
		Use:   "cluster-setting [flags] NAME (VALUE | --unset)",
		Short: "Set a replicated cluster setting (preferred-leader-regions)",
		Long: `Cluster-setting records a cluster setting through the Raft log, so every
node applies the same value, also nodes that join later. 'dedupnode status'
shows the value in force.

Settings:
  preferred-leader-regions LIST   regions (serve --region), comma-separated,
                                  first preferred: a leader outside them
                                  hands leadership to a caught-up voter
                                  inside, after serve's --preferred-leader-hold
                                  (default 10s); --unset (or "") clears it;
                                  spaces around names are trimmed, an empty
                                  entry ("us,,eu", a trailing comma) is an
                                  error

serve --preferred-leader-regions seeds the setting when a cluster starts;
after that, this command changes it (a cleared setting stays cleared).`,
		Example: strings.ReplaceAll(`  dedupnode cluster-setting --addr 127.0.0.1:7070 preferred-leader-regions us-east,eu-west
  dedupnode cluster-setting --addr 127.0.0.1:7070 preferred-leader-regions --unset`, "dedupnode ", e.progName+" "),
		Args: cobra.RangeArgs(1, 2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if unset == (len(args) == 2) {
				return usagef("give NAME and VALUE, or NAME and --unset")
			}
			value := ""
			if len(args) == 2 {
				value = args[1]
			}
			// Known settings are checked here as the server checks them
			// (it checks again), and sent as it stores them.
			if args[0] == cluster.SettingPreferredLeaderRegions && !unset {
				rs, err := cluster.ParseRegions(value)
				if err != nil {
					return usagef("%s: %v", args[0], err)
				}
				value = strings.Join(rs, ",")
			}
			return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.SetClusterSetting(ctx, args[0], value, unset); err != nil {
					return explain(err, f, "")
				}
				if unset {
					return report(e.stdout, f.output, map[string]any{"name": args[0], "unset": true}, "%s cleared", args[0])
				}
				return report(e.stdout, f.output, map[string]any{"name": args[0], "value": value}, "%s = %s", args[0], value)
			})
		}),
	}
	cmd.Flags().BoolVar(&unset, "unset", false, "clear the setting")
	f.register(cmd)
	return cmd
}
