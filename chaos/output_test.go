package chaos

import (
	"strings"
	"testing"

	"github.com/dedupnode/dedupnode/chaos/history"
)

func TestDigestLine(t *testing.T) {
	d := func(n string, idx uint64, dg, err string) history.NodeDigest {
		return history.NodeDigest{Node: n, AppliedIndex: idx, Digest: dg, Records: 5, Error: err}
	}
	if got := digestLine([]history.NodeDigest{d("n1", 9, "ab", ""), d("n2", 9, "ab", "")}); got != "2 nodes agree at applied index 9 (5 records, sha256 ab)" {
		t.Errorf("agree: %q", got)
	}
	got := digestLine([]history.NodeDigest{d("n1", 9, "ab", ""), d("n2", 9, "cd", ""), d("n3", 0, "", "Unavailable")})
	for _, w := range []string{"n1 at 9 ab", "n2 at 9 cd", "n3 error: Unavailable"} {
		if !strings.Contains(got, w) {
			t.Errorf("differ: %q lacks %q", got, w)
		}
	}
}
