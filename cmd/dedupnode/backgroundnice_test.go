package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestServeBackgroundNiceOutOfRange: a nice step outside 0-19 is a usage
// error naming the flag, before the node starts.
func TestServeBackgroundNiceOutOfRange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, bad := range []string{"20", "-1"} {
		code, _, errb := runCLI(t, ctx, "", "serve", "--node-id", "n1", "--data-dir", t.TempDir(), "--bootstrap",
			"--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--background-nice", bad)
		if code != 2 || !strings.Contains(errb, "--background-nice "+bad+": want 0 (off) to 19") {
			t.Fatalf("--background-nice %s: exit %d, %q; want a usage error naming the flag", bad, code, errb)
		}
	}
}
