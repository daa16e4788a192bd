package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command that dials a cluster takes the connection flags from the
// one definition (clientFlags.registerConn): same names, same help, so the
// same DEDUPNODE_* variables. demo's --addr says more (without it the demo
// runs its own cluster, and its --timeout bounds the whole run); --timeout
// may say what a request is for the command (status --wait, digest).
func TestClusterCommandsShareConnectionFlags(t *testing.T) {
	e := &env{ctx: context.Background(), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, progName: "dedupnode"}
	root := newRootCmd(e)
	ref := &cobra.Command{Use: "ref"}
	(&clientFlags{}).register(ref)
	dials := map[string]bool{"mark": true, "check": true, "status": true, "backup": true, "export": true, "import": true,
		"webhook-proxy": true, "bench": true, "demo": true}
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		name := strings.TrimPrefix(c.CommandPath(), "dedupnode ")
		if c.Flags().Lookup("addr") == nil {
			if dials[name] {
				t.Errorf("%s: no --addr", name)
			}
			return
		}
		seen[name] = true
		for _, flag := range []string{"addr", "tls-ca", "tls-cert", "tls-key", "token", "timeout"} {
			got, want := c.Flags().Lookup(flag), ref.Flags().Lookup(flag)
			switch {
			case got == nil:
				t.Errorf("%s: no --%s", name, flag)
			case name == "demo" && (flag == "addr" || flag == "timeout"):
			case flag == "timeout":
			case got.Usage != want.Usage || got.DefValue != want.DefValue:
				t.Errorf("%s --%s: %q (default %s), want the shared %q (default %s)", name, flag, got.Usage, got.DefValue, want.Usage, want.DefValue)
			}
		}
	}
	walk(root)
	for name := range dials {
		if !seen[name] {
			t.Errorf("%s: not found with --addr", name)
		}
	}
}
