package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// An ID given twice to one CLI command, through the real binary and a
// real serve process: the first occurrence wins and the others answer as
// a second command would (README Guarantees (1)), whether the IDs are
// arguments or lines on standard input, within one request or across the
// requests --batch splits them into; a re-run with the request token
// answers as the first run did.
func TestCLIRepeatedIDsInOneRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 1)
	cl.args = []string{"--bootstrap"}
	cl.startAll()
	addr := cl.nodes[0].grpc
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)

	// answers runs the command and returns "ID result" per output line.
	answers := func(stdin string, args ...string) string {
		t.Helper()
		code, out, errs := cli(t, bin, stdin, append(args[:1:1], append([]string{"--addr", addr}, args[1:]...)...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			f := strings.Split(l, "\t")
			if len(f) < 2 {
				t.Fatalf("%v: line %q is not ID<TAB>result", args, l)
			}
			got = append(got, f[0]+" "+f[1])
		}
		return strings.Join(got, ", ")
	}
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"mark", "X", "X", "X"}, "X new, X duplicate, X duplicate"},
		{"p1\np1\np2\n", []string{"mark", "-"}, "p1 new, p1 duplicate, p2 new"},
		{"q1\nq1\nq2\nq1\n", []string{"mark", "--batch", "2", "-"}, "q1 new, q1 duplicate, q2 new, q1 duplicate"},
		{"", []string{"claim", "cl1", "cl1"}, "cl1 acquired, cl1 in_progress"},
		// The same request twice (its reply lost, say): the re-run with
		// its token answers as the first run.
		{"", []string{"mark", "--request-token", "a1b2", "r", "r", "s"}, "r new, r duplicate, s new"},
		{"", []string{"mark", "--request-token", "a1b2", "r", "r", "s"}, "r new, r duplicate, s new"},
		{"", []string{"mark", "r", "r"}, "r duplicate, r duplicate"},
	} {
		if got := answers(c.stdin, c.args...); got != c.want {
			t.Fatalf("%q on stdin, %v: got %s, want %s", c.stdin, c.args, got, c.want)
		}
	}
}
