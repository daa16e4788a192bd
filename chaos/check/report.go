package check

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/dedupnode/dedupnode/chaos/history"
)

// Smallest returns the smallest history that shows a violation: the
// operations on the offending ID (or, for a violation without an ID, the
// operations it names), the faults that overlap them and the ID's final
// reads; a state_digests violation keeps the digests. A violation that
// names operations is preferred to one that names none (a divergence or a
// node that did not converge says less on its own). Meta.Note names the
// violation. It returns nil when rep has none.
func Smallest(h *history.History, rep *Report) *history.History {
	var best *history.History
	for _, v := range rep.Details {
		sub := subHistory(h, v)
		if best == nil || (len(sub.Ops) > 0 && (len(best.Ops) == 0 || len(sub.Ops) < len(best.Ops))) {
			best = sub
		}
	}
	return best
}

func subHistory(h *history.History, v Violation) *history.History {
	sub := &history.History{Meta: h.Meta}
	sub.Meta.Note = fmt.Sprintf("%s: %s", v.Invariant, v.Detail)
	named := map[int64]bool{}
	for _, s := range v.Ops {
		named[s] = true
	}
	lo, hi := int64(math.MaxInt64), int64(0)
	for _, o := range h.Ops {
		if (v.Key != "" && o.Key == v.Key) || (v.Key == "" && named[o.Seq]) {
			sub.Ops = append(sub.Ops, o)
			lo = min(lo, o.Start)
			hi = max(hi, end(&o))
		}
	}
	for _, f := range h.Faults {
		fe := f.End
		if fe == 0 {
			fe = math.MaxInt64
		}
		if f.Start <= hi && fe >= lo {
			sub.Faults = append(sub.Faults, f)
		}
	}
	for _, r := range h.Final {
		if v.Key != "" && r.Key == v.Key {
			sub.Final = append(sub.Final, r)
		}
	}
	if v.Invariant == StateDigests || v.Invariant == Converged {
		sub.Digests = h.Digests
	}
	return sub
}

// WriteTable prints the report for people: operations per kind and
// outcome, faults per kind, violations per invariant and the first details.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "OPERATIONS\t%d\t(%d IDs)\n", r.Operations, r.Keys)
	kinds := sortedKeys(r.OpsByKind)
	for _, k := range kinds {
		m := r.OpsByKind[k]
		total := 0
		var parts []string
		for _, o := range sortedKeys(m) {
			total += m[o]
			parts = append(parts, fmt.Sprintf("%s %d", o, m[o]))
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", k, total, strings.Join(parts, ", "))
	}
	if r.FaultErrors > 0 {
		fmt.Fprintf(tw, "FAULTS\t%d\t(%d not injected or healed fully; see the log)\n", r.Faults, r.FaultErrors)
	} else {
		fmt.Fprintf(tw, "FAULTS\t%d\t\n", r.Faults)
	}
	for _, k := range sortedKeys(r.FaultsByKind) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, r.FaultsByKind[k])
	}
	fmt.Fprintf(tw, "INVARIANT\tVIOLATIONS\t\n")
	for _, inv := range Invariants {
		note := ""
		if inv == Linearizable {
			note = fmt.Sprintf("(%d IDs checked with porcupine", r.LinearizabilityChecked)
			if r.LinearizabilityUnknown > 0 {
				note += fmt.Sprintf(", %d undecided in time", r.LinearizabilityUnknown)
			}
			note += ")"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", inv, r.Violations[inv], note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, v := range r.Details {
		if i == 10 {
			fmt.Fprintf(w, "... %d more violations\n", len(r.Details)-10)
			break
		}
		key := ""
		if v.Key != "" {
			key = " id " + v.Key
		}
		fmt.Fprintf(w, "VIOLATION %s%s: %s\n", v.Invariant, key, v.Detail)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
