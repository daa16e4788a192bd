package main

import (
	"os"
	"strings"
	"testing"
)

// The restart step of docs/OPERATIONS.md's rolling upgrade matches what
// serve does: a node restarted with --peers or --bootstrap over its state
// warns that the flag is ignored and to leave it out on restarts, so the
// doc must not say "the same flags" without leaving them out.
func TestRollingUpgradeDocLeavesOutFirstStartFlags(t *testing.T) {
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, _ := strings.Cut(string(doc), "\n## Rolling upgrades and restarts\n")
	sec, _, _ = strings.Cut(sec, "\n## ")
	flat := strings.Join(strings.Fields(sec), " ")
	if !strings.Contains(flat, "Leave `--bootstrap` and `--peers` out when restarting a node") {
		t.Fatalf("the Rolling upgrades section does not say to leave --bootstrap and --peers out on restarts (serve warns they are ignored):\n%s", sec)
	}
	for _, l := range strings.Split(sec, "\n") {
		if strings.Contains(l, "same flags") && !strings.Contains(l, "but") {
			t.Fatalf("the Rolling upgrades section says to restart with the same flags, which with --peers warns on every restart: %q", l)
		}
	}
}
