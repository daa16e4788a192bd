package check

import (
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dedupnode/dedupnode/chaos/history"
)

// The linearizability model: one ID is a set-once register holding the
// request token of the Mark that recorded it ("" while absent).
//
//   - mark(token) answered NEW is legal when the register is empty (it then
//     holds token) or already holds token (a retry of the winner);
//   - mark answered DUPLICATE or CONFLICT is legal when it holds another
//     token;
//   - a mark whose outcome is unknown may have happened (then it sets an
//     empty register) — its return time is +inf, so porcupine may also place
//     it after everything else, which is "did not happen";
//   - check answers SEEN iff the register is set.
//
// Only IDs whose history holds nothing but Mark and linearizable Check, and
// whose returned records all outlive the history, are checked this way;
// claims (leases that expire with time) are checked by the direct rules.

type linInput struct {
	kind  history.Kind
	token string
}

type linOutput struct {
	known  bool
	result string
}

var dedupModel = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := state.(string)
		in := input.(linInput)
		out := output.(linOutput)
		switch in.kind {
		case history.Mark:
			if !out.known {
				if st == "" {
					return true, in.token
				}
				return true, st
			}
			switch out.result {
			case history.New:
				if st == "" || st == in.token {
					return true, in.token
				}
				return false, st
			default: // duplicate, conflict
				return st != "" && st != in.token, st
			}
		case history.Check:
			return (out.result == history.Seen) == (st != ""), st
		}
		return false, st
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(linInput)
		out := output.(linOutput)
		res := out.result
		if !out.known {
			res = "?"
		}
		if in.kind == history.Mark {
			return fmt.Sprintf("mark(%s) -> %s", shortTok(in.token), res)
		}
		return "check -> " + res
	},
	DescribeState: func(state interface{}) string {
		if s := state.(string); s != "" {
			return "recorded by " + shortTok(s)
		}
		return "absent"
	},
}

func (c *checker) linearizable(kh *keyHist) {
	var ops []porcupine.Operation
	var involved []*history.Op
	endNs := c.h.Meta.End
	if endNs == 0 {
		for _, o := range kh.ops {
			endNs = max(endNs, o.End)
		}
	}
	for _, o := range kh.ops {
		switch o.Kind {
		case history.Mark:
			if o.Outcome == history.Fail {
				continue
			}
			if o.Record != nil && o.Record.ExpiresMs*int64(time.Millisecond) <= endNs+c.opt.Margin.Nanoseconds() {
				return // expiry inside the run: the register model does not apply
			}
			op := porcupine.Operation{ClientId: o.Client, Input: linInput{kind: history.Mark, token: o.Token}, Call: o.Start}
			if o.Acked() {
				op.Output, op.Return = linOutput{known: true, result: o.Result}, o.End
			} else {
				op.Output, op.Return = linOutput{}, math.MaxInt64
			}
			ops = append(ops, op)
			involved = append(involved, o)
		case history.Check:
			if !o.Acked() || o.Consistency == history.Stale || o.Consistency == history.Bounded {
				continue
			}
			ops = append(ops, porcupine.Operation{ClientId: o.Client, Input: linInput{kind: history.Check},
				Call: o.Start, Output: linOutput{known: true, result: o.Result}, Return: o.End})
			involved = append(involved, o)
		default:
			return // claims, commits, releases: not this model
		}
	}
	if len(ops) == 0 {
		return
	}
	c.rep.LinearizabilityChecked++
	switch porcupine.CheckOperationsTimeout(dedupModel, ops, c.opt.PorcupineTimeout) {
	case porcupine.Ok:
	case porcupine.Unknown:
		c.rep.LinearizabilityUnknown++
	case porcupine.Illegal:
		c.violate(Linearizable, kh.key, involved,
			"the %d mark/check operations on this ID have no linearization (set-once register model)", len(ops))
	}
}
