package main

import (
	"context"
	"os"
	"strings"
	"testing"
)

// Read replica and bounded-staleness flags: bad combinations are usage
// errors that name the flag.
func TestReplicaFlagUsageErrors(t *testing.T) {
	t.Setenv("DEDUPNODE_ADDR", "")
	os.Unsetenv("DEDUPNODE_ADDR")
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bounded without max staleness", []string{"check", "--consistency", "bounded", "x"}, "--consistency bounded needs --max-staleness"},
		{"max staleness without bounded", []string{"check", "--max-staleness", "5s", "x"}, "--max-staleness 5s: only --consistency bounded"},
		{"sub-ms max staleness", []string{"check", "--consistency", "bounded", "--max-staleness", "1500us", "x"}, "whole number of milliseconds"},
		{"replica without join", []string{"serve", "--node-id", "r1", "--data-dir", dir, "--bootstrap", "--read-replica"}, "--read-replica goes with --join only"},
		{"replica with nothing", []string{"serve", "--node-id", "r1", "--data-dir", dir, "--read-replica"}, "give one of --bootstrap"},
		{"zero clock offset", []string{"serve", "--node-id", "r1", "--data-dir", dir, "--join", "127.0.0.1:7070", "--max-clock-offset", "0s"}, "--max-clock-offset 0s"},
		{"bench bounded without max staleness", []string{"bench", "-w", "check-miss", "--consistency", "bounded", "--duration", "1s"}, "max staleness"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := runCLI(t, context.Background(), "", tc.args...)
			if code == exitOK || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q, want an error containing %q", code, errs, tc.want)
			}
			if out != "" {
				t.Fatalf("stdout must be empty, got %q", out)
			}
		})
	}
}
