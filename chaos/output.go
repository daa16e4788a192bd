package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/dedupnode/dedupnode/chaos/check"
	"github.com/dedupnode/dedupnode/chaos/history"
	"github.com/dedupnode/dedupnode/chaos/netproxy"
)

// Summary is the JSON shape of a run's outcome (`dedupnode chaos --output
// json`): at least operations, faults and violations (invariant → count).
type Summary struct {
	Operations     int                       `json:"operations"`
	Faults         int                       `json:"faults"`
	FaultsFailed   int                       `json:"faults_failed,omitempty"`
	Violations     map[string]int            `json:"violations"`
	Passed         bool                      `json:"passed"`
	Mode           string                    `json:"mode,omitempty"`
	Nodes          int                       `json:"nodes,omitempty"`
	Clients        int                       `json:"clients,omitempty"`
	Seed           int64                     `json:"seed,omitempty"`
	DurationS      float64                   `json:"duration_s,omitempty"`
	TotalS         float64                   `json:"total_s,omitempty"`
	Keys           int                       `json:"ids"`
	OpsByKind      map[string]map[string]int `json:"ops_by_kind"`
	FaultsByKind   map[string]int            `json:"faults_by_kind"`
	FaultKinds     []string                  `json:"fault_kinds,omitempty"`
	Linearizable   int                       `json:"linearizability_checked_ids"`
	Undecided      int                       `json:"linearizability_undecided_ids,omitempty"`
	Details        []check.Violation         `json:"details,omitempty"`
	Notes          []string                  `json:"notes,omitempty"`
	Cluster        string                    `json:"cluster,omitempty"`
	Proxy          *netproxy.Stats           `json:"raft_proxy,omitempty"`
	HistoryFile    string                    `json:"history_file,omitempty"`
	ViolationFile  string                    `json:"violation_file,omitempty"`
	UnsafeSettings []string                  `json:"unsafe_server_flags,omitempty"`
	StateDigests   []history.NodeDigest      `json:"state_digests,omitempty"`
	RegionProbes   *ProbeStats               `json:"region_probes,omitempty"`
}

// Summarize flattens a result for JSON output.
func (r *Result) Summarize() Summary {
	rep := r.Report
	s := Summary{Operations: rep.Operations, Faults: rep.Faults, FaultsFailed: rep.FaultErrors, Violations: rep.Violations, Passed: rep.OK(),
		Mode: r.Mode, Nodes: r.Nodes, Clients: r.Clients, Seed: r.Seed, DurationS: r.WorkloadSeconds, TotalS: r.TotalSeconds,
		Keys: rep.Keys, OpsByKind: rep.OpsByKind, FaultsByKind: rep.FaultsByKind, FaultKinds: r.FaultKinds,
		Linearizable: rep.LinearizabilityChecked, Undecided: rep.LinearizabilityUnknown, Details: rep.Details,
		Notes: r.Notes, Cluster: r.Cluster, Proxy: r.Proxy, HistoryFile: r.HistoryFile, ViolationFile: r.ViolationFile,
		RegionProbes: r.Probes}
	if r.Probes != nil && !r.Probes.OK() {
		s.Passed = false
	}
	if r.History != nil {
		s.UnsafeSettings = r.History.Meta.Unsafe
		s.StateDigests = r.History.Digests
	}
	return s
}

// WriteJSON writes the summary as one JSON object.
func (r *Result) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r.Summarize())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteTable writes the run and the checker's report for people.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "chaos run: mode %s, %s, %s, %.0fs under faults (%.0fs in all), seed %d\n",
		r.Mode, count(r.Nodes, "node"), count(r.Clients, "client"), r.WorkloadSeconds, r.TotalSeconds, r.Seed)
	fmt.Fprintf(w, "cluster:   %s\n", r.Cluster)
	if len(r.FaultKinds) > 0 {
		fmt.Fprintf(w, "faults:    %s\n", strings.Join(r.FaultKinds, ", "))
	} else {
		fmt.Fprintf(w, "faults:    none\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note:      %s\n", n)
	}
	if r.History != nil && len(r.History.Meta.Unsafe) > 0 {
		fmt.Fprintf(w, "UNSAFE:    server runs with %s (guarantees deliberately broken)\n", strings.Join(r.History.Meta.Unsafe, " "))
	}
	if r.Proxy != nil {
		fmt.Fprintf(w, "raft proxy: %d connections (%d of unknown sender), %d bytes forwarded, %d dropped, %d resets\n",
			r.Proxy.Conns, r.Proxy.Unknown, r.Proxy.Forwarded, r.Proxy.Dropped, r.Proxy.Resets)
	}
	if r.History != nil && len(r.History.Digests) > 0 {
		fmt.Fprintf(w, "digests:   %s\n", digestLine(r.History.Digests))
	}
	if r.Probes != nil {
		fmt.Fprintf(w, "cut-off replicas: %s\n", r.Probes)
	}
	fmt.Fprintln(w)
	if err := r.Report.WriteTable(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if r.HistoryFile != "" {
		fmt.Fprintf(w, "history:   %s\n", r.HistoryFile)
	}
	if r.ViolationFile != "" {
		fmt.Fprintf(w, "smallest offending history: %s\n", r.ViolationFile)
	}
	if r.Probes != nil && !r.Probes.OK() {
		_, err := fmt.Fprintf(w, "RESULT: FAIL (%d violations; cut-off replicas: %d stale checks failed, %d wrong answers, %d past the deadline)\n",
			r.Report.Total(), r.Probes.StaleFailed, r.Probes.Wrong, r.Probes.Late)
		return err
	}
	if r.Report.OK() {
		_, err := fmt.Fprintf(w, "RESULT: PASS (0 violations)\n")
		return err
	}
	_, err := fmt.Fprintf(w, "RESULT: FAIL (%d violations: %s)\n", r.Report.Total(), r.Report.Summary())
	return err
}

// count is "1 node", "3 nodes".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// digestLine says in one line what the nodes' final state digests were.
func digestLine(ds []history.NodeDigest) string {
	same := true
	for _, d := range ds {
		if d.Error != "" || d.AppliedIndex != ds[0].AppliedIndex || d.Digest != ds[0].Digest {
			same = false
		}
	}
	if same {
		return fmt.Sprintf("%s agree at applied index %d (%d records, sha256 %.16s)", count(len(ds), "node"), ds[0].AppliedIndex, ds[0].Records, ds[0].Digest)
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		if d.Error != "" {
			parts[i] = fmt.Sprintf("%s error: %s", d.Node, d.Error)
		} else {
			parts[i] = fmt.Sprintf("%s at %d %.16s (%d records)", d.Node, d.AppliedIndex, d.Digest, d.Records)
		}
	}
	return strings.Join(parts, "; ")
}
