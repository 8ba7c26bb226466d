package robustness

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// windowOps is about how many operations porcupine checks at once. Its memory grows with the
// square of a history's length (every configuration it caches holds a bit per operation): a
// 10-minute run on one member, 400,000 revisions, would need hundreds of gigabytes in one
// piece.
const windowOps = 4000

// kvCheck is what the linearizability check found.
type kvCheck struct {
	result porcupine.CheckResult
	// windows: how many pieces porcupine checked.
	windows int
	// why: the first operation found out of real-time order, if any.
	why string
	// bad: the piece porcupine found Illegal and its model, to draw it.
	bad      []porcupine.Operation
	badModel porcupine.Model
}

// checkKV checks the KV history (writes of unknown outcome resolved by patch) for
// linearizability.
//
// Once the watchers' events cover every revision, the store at every revision is known, and
// every operation but the writes left unknown sits at one revision: the one a write made, or
// the one a read (a transaction's else branch, a delete of nothing) found. The history is
// then linearizable if and only if
//   - an operation called after another returned sits at the same revision or a later one
//     (checked here over the whole history, in one sweep), and
//   - the operations of each range of revisions are linearizable from the store at the
//     revision before the range to the store at its last: porcupine checks each range
//     alone, from that store, with an operation added that must come after all of the
//     range's and find the store as the events left it at the range's end.
//
// patch leaves no write of unknown outcome once the events cover every revision (one left
// would keep the rest of the history in its range). Without events for every revision,
// porcupine checks the history in one piece.
func checkKV(hist []porcupine.Operation, c *watchCheck, timeout time.Duration) kvCheck {
	if !c.complete {
		res := porcupine.CheckOperationsTimeout(model, hist, timeout)
		return kvCheck{result: res, windows: 1, bad: hist, badModel: model}
	}
	if why := realTimeOrder(hist); why != "" {
		return kvCheck{result: porcupine.Illegal, why: why}
	}
	type placed struct {
		op     porcupine.Operation
		lo, hi int64
	}
	ops := make([]placed, 0, len(hist))
	for _, op := range hist {
		o := op.Output.(output)
		lo, hi := o.rev, o.rev
		if o.unknown {
			// patch leaves none once the events cover every revision; one left could be
			// anywhere.
			lo, hi = 1, c.finalRev
		}
		ops = append(ops, placed{op, lo, hi})
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].lo < ops[j].lo })
	out := kvCheck{result: porcupine.Ok}
	deadline := time.Now().Add(timeout)
	check := func(from, to int64, win []porcupine.Operation) bool {
		out.windows++
		var last int64
		for _, op := range win {
			if !op.Output.(output).unknown {
				last = max(last, op.Return)
			}
		}
		end := c.stateAt(to)
		win = append(win, porcupine.Operation{ClientId: endClient, Input: input{kind: opEnd},
			Call: last + 1, Output: output{rev: to, end: end}, Return: last + 2})
		m := modelFrom(c.stateAt(from - 1))
		res := porcupine.CheckOperationsTimeout(m, win, max(time.Until(deadline), time.Second))
		switch res {
		case porcupine.Illegal:
			out.result, out.bad, out.badModel = res, win, m
			return false
		case porcupine.Unknown:
			out.result = res
			return false
		}
		return true
	}
	from, reach := int64(1), int64(0)
	var win []porcupine.Operation
	for _, p := range ops {
		if len(win) >= windowOps && p.lo > reach {
			if !check(from, p.lo-1, win) {
				return out
			}
			from, win = p.lo, nil
		}
		win = append(win, p.op)
		reach = max(reach, p.hi)
	}
	check(from, c.finalRev, win)
	return out
}

// realTimeOrder: the first operation at a revision before that of one that returned before it
// was called ("" if none). Writes left unknown are left out: one never applied has no
// revision.
func realTimeOrder(hist []porcupine.Operation) string {
	var known []porcupine.Operation
	for _, op := range hist {
		if !op.Output.(output).unknown {
			known = append(known, op)
		}
	}
	byRet := append([]porcupine.Operation(nil), known...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	// highest[i]: of byRet[:i+1], the one at the highest revision.
	highest := make([]int, len(byRet))
	for i := range byRet {
		highest[i] = i
		if i > 0 && byRet[highest[i-1]].Output.(output).rev > byRet[i].Output.(output).rev {
			highest[i] = highest[i-1]
		}
	}
	for _, op := range known {
		n := sort.Search(len(byRet), func(i int) bool { return byRet[i].Return >= op.Call })
		if n == 0 {
			continue
		}
		before := byRet[highest[n-1]]
		if rev := op.Output.(output).rev; before.Output.(output).rev > rev {
			return fmt.Sprintf("%s, called at %s, is at a revision before %s, which returned at %s",
				model.DescribeOperation(op.Input, op.Output), time.Duration(op.Call),
				model.DescribeOperation(before.Input, before.Output), time.Duration(before.Return))
		}
	}
	return ""
}

// endClient is the client id of the operation that ends each range porcupine checks.
const endClient = expiryClient + 1

// modelFrom is the model starting from the store `init`.
func modelFrom(init state) porcupine.Model {
	m := model
	m.Init = func() interface{} { return init }
	return m
}
