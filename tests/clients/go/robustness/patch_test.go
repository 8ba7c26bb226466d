package robustness

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A deletion of one of a lease's two keys, seen after the lease's TTL ran out, is not the
// lease's expiry (that deletes both): it is the delete of unknown outcome that was in flight.
// Found by a long run: the checker took such a deletion for an expiry, its model dropped the
// lease's other key, and porcupine called a correct history Illegal.
func TestPatchTakesNoPartOfALeasesKeysForItsExpiry(t *testing.T) {
	const lease = 0x1234
	sec := int64(time.Second)
	ev := func(rev int64, key int, put bool, v, prev kv) wevent {
		return wevent{rev: rev, key: key, put: put, kv: v, prev: prev}
	}
	a := kv{value: "a", create: 2, mod: 2, ver: 1, lease: lease}
	b := kv{value: "b", create: 3, mod: 3, ver: 1, lease: lease}
	s := &session{start: 1, items: []item{
		{events: []wevent{ev(2, 1, true, a, kv{})}, at: 1 * sec},
		{events: []wevent{ev(3, 2, true, b, kv{})}, at: 2 * sec},
		// The lease (TTL 1 s, granted at 0) has run out by now.
		{events: []wevent{ev(4, 1, false, kv{}, a)}, at: 5 * sec},
	}}
	ws := []*watcher{{id: 0, sessions: []*session{s}}}
	op := func(client int, in input, out output, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	hist := []porcupine.Operation{
		op(0, input{kind: opPut, key: 1, value: "a", lease: lease}, output{rev: 2}, sec/2, sec),
		op(1, input{kind: opPut, key: 2, value: "b", lease: lease}, output{rev: 3}, sec, 2*sec),
		op(0, input{kind: opDelete, key: 1}, output{unknown: true}, 3*sec, 6*sec),
		op(1, input{kind: opGet, key: 2}, output{rev: 4, kv: b}, 6*sec, 7*sec),
	}
	leases := map[int64]*leaseRec{lease: {ttl: 1, call: 0, renewed: 0}}
	c := checkWatches(ws, 4, hist, nil, nil)
	if len(c.violations) > 0 || !c.complete {
		t.Fatalf("the events: %v (complete %v)", c.violations, c.complete)
	}
	patched := patch(hist, c, leases)
	if c.expired != 0 || len(c.violations) > 0 {
		t.Errorf("the deletion of k1 alone was taken for the lease's expiry: %d expired, %v", c.expired, c.violations)
	}
	if res := checkKV(patched, c, time.Minute); res.result != porcupine.Ok {
		t.Errorf("a correct history checked %s (%s)", res.result, res.why)
	}
}
