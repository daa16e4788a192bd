package metrics

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// The metrics table of docs/OPERATIONS.md names every label of the metrics
// it lists by their full name (a row for one metric, `dedup_...`, whose
// third column names labels in backquotes).
func TestOperationsDocListsEveryLabel(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	snap := testSnapshot(t)
	m := New(Options{NodeID: "n1", Version: "test", Region: "eu", Source: SourceFunc(func() Snapshot { return snap })})
	m.ObserveRequest("mark", "OK", OriginClient, 3*time.Millisecond, 10)
	text := scrape(t, m)
	// Labels of each metric as scraped: name → label names.
	labels := map[string]map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		sm := regexp.MustCompile(`^(dedup_[a-z_]+)\{([^}]*)\}`).FindStringSubmatch(l)
		if sm == nil {
			continue
		}
		set := labels[sm[1]]
		if set == nil {
			set = map[string]bool{}
			labels[sm[1]] = set
		}
		for _, kv := range strings.Split(sm[2], ",") {
			if k, _, ok := strings.Cut(kv, "="); ok && k != "le" {
				set[k] = true
			}
		}
	}
	checked := 0
	for _, row := range strings.Split(string(doc), "\n") {
		rm := regexp.MustCompile("^\\| `(dedup_[a-z_]+)` \\| [^|]+ \\| ([^|]*)\\|").FindStringSubmatch(row)
		if rm == nil || labels[rm[1]] == nil {
			continue
		}
		checked++
		var missing []string
		for k := range labels[rm[1]] {
			if !strings.Contains(rm[2], "`"+k+"`") {
				missing = append(missing, k)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("docs/OPERATIONS.md: row of %s lacks its labels %v: %q", rm[1], missing, row)
		}
	}
	if checked == 0 {
		t.Fatal("no metric row of docs/OPERATIONS.md checked")
	}
}
