package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestGrafanaDashboardUsesKnownMetrics keeps grafana/dedupnode.json in step
// with the metric names: every dedup_ name a panel queries must be exported.
func TestGrafanaDashboardUsesKnownMetrics(t *testing.T) {
	raw, err := os.ReadFile("../grafana/dedupnode.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	snap := testSnapshot(t)
	m := New(Options{NoRuntimeMetrics: true, Source: SourceFunc(func() Snapshot { return snap })})
	m.ObserveRequest("mark", "OK", OriginClient, time.Millisecond, 1)
	m.ObserveItems("ns", "mark", ResultDuplicate, 1)
	m.ObserveDuplicate("ns", time.Now())
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, mf := range mfs {
		known[mf.GetName()] = true
	}
	re := regexp.MustCompile(`dedup_[a-z0-9_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range re.FindAllString(tg.Expr, -1) {
				queried++
				base := name
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suf); ok && known[b] {
						base = b
					}
				}
				if !known[base] {
					t.Errorf("panel %q queries %s, which is not exported", p.Title, name)
				}
			}
		}
	}
	if queried < 20 {
		t.Errorf("only %d metric references found in the dashboard", queried)
	}
}
