package robustness

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A delete of unknown outcome left so (output.idleAt) is placed where it deletes, or at the end
// as never applied — never as a no-op in the middle — and porcupine still finds the histories
// it cannot explain.
func TestUnknownDeletesArePlacedWhereTheyChangeSomething(t *testing.T) {
	a := kv{value: "a", create: 2, mod: 2, ver: 1}
	put := porcupine.Operation{ClientId: 0, Input: input{kind: opPut, key: 0, value: "a"}, Call: 0, Output: output{rev: 2}, Return: 10}
	del := func(final int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: input{kind: opDelete, key: 0}, Call: 20, Output: output{unknown: true, idleAt: final}, Return: never}
	}
	get := func(o output) porcupine.Operation {
		return porcupine.Operation{ClientId: 2, Input: input{kind: opGet, key: 0}, Call: 30, Output: o, Return: 40}
	}
	for _, c := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"applied: the key gone at revision 3", []porcupine.Operation{put, del(3), get(output{rev: 3})}, porcupine.Ok},
		{"never applied: the key still there", []porcupine.Operation{put, del(2), get(output{rev: 2, kv: a})}, porcupine.Ok},
		{"the key gone with no revision for it", []porcupine.Operation{put, del(2), get(output{rev: 2})}, porcupine.Illegal},
		{"a revision no write made", []porcupine.Operation{put, del(3), get(output{rev: 3, kv: a})}, porcupine.Illegal},
	} {
		if got := porcupine.CheckOperationsTimeout(model, c.hist, time.Minute); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
