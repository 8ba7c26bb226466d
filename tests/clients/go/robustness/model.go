// Package robustness runs randomized traffic against a real cluster while it injects faults,
// records every operation and every watch event, and checks the histories: porcupine for the
// KV operations' linearizability (with revisions: etcd's responses name the revision each
// read saw and each write made, so the model checks them too), and the watch guarantees
// against the same history. Run by robustness_test.go (a short profile, in the README's test
// command) and by cmd/robustness (long runs; tests/tools/robustness.sh).
package robustness

import (
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The keys the traffic touches: few, so that operations collide. Every kind of operation
// uses the first nShared; each of the rest is one client's, put once on each short lease the
// client takes, so that it stays on the lease until the lease expires (on a shared key
// another write soon replaces it).
const (
	nKeys   = 14
	nShared = 8
)

// Prefix holds every key the traffic writes.
const Prefix = "/r/"

// Resources are the two halves of the keys, as Kubernetes keeps each kind of object under a
// prefix of its own: keys 0-6 under Prefix+"a/", 7-13 under Prefix+"b/".
var Resources = [2]string{Prefix + "a/", Prefix + "b/"}

func resource(i int) string { return Resources[i*len(Resources)/nKeys] }

// keyName: zero-padded, so that the store's order is the keys' order.
func keyName(i int) string { return fmt.Sprintf("%sk%02d", resource(i), i) }

func keyIndex(k string) int {
	for i := 0; i < nKeys; i++ {
		if keyName(i) == k {
			return i
		}
	}
	return -1
}

// kv is one key as etcd answers it; mod == 0 means absent.
type kv struct {
	value                   string
	create, mod, ver, lease int64
}

func (k kv) String() string {
	if k.mod == 0 {
		return "-"
	}
	s := fmt.Sprintf("%s@c%d/m%d/v%d", k.value, k.create, k.mod, k.ver)
	if k.lease != 0 {
		s += fmt.Sprintf("/l%x", k.lease)
	}
	return s
}

// state is the store in the model: its revision and every key.
type state struct {
	rev int64
	kvs [nKeys]kv
}

type opKind int

const (
	opGet opKind = iota
	opList
	opPut
	opDelete
	// opTxn: if the key's mod revision is cmpMod then put, else get it.
	opTxn
	opRevoke
	// opListAt: a paginated list at revision cmpMod (not in the model: see pagedList).
	opListAt
	// opEnd: the end of a range of revisions checked alone (see checkKV): the store must be
	// output.end.
	opEnd
)

var kindNames = [...]string{"get", "list", "put", "delete", "txn", "revoke", "list-at", "end"}

type input struct {
	kind  opKind
	key   int
	value string
	lease int64
	// limit of a list; 0 is none.
	limit  int64
	cmpMod int64
}

func (i input) write() bool { return i.kind >= opPut && i.kind <= opRevoke }

type output struct {
	// unknown: a write whose outcome is not known (it failed in flight): it may have taken
	// effect at any time after its call, or never.
	unknown bool
	// end: the store an opEnd must find.
	end state
	rev int64
	// get, the else branch of txn, the previous kv of put and delete.
	kv kv
	// list
	kvs   []kv
	keys  []int
	count int64
	more  bool
	// delete
	deleted int64
	// txn
	succeeded bool
}

func (s state) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d:", s.rev)
	for i, k := range s.kvs {
		if k.mod != 0 {
			fmt.Fprintf(&b, " k%d=%s", i, k)
		}
	}
	return b.String()
}

// put is the state after a put of key i at the next revision.
func (s state) put(i int, value string, lease int64) state {
	s.rev++
	k := s.kvs[i]
	if k.mod == 0 {
		k = kv{create: s.rev}
	}
	k.value, k.mod, k.ver, k.lease = value, s.rev, k.ver+1, lease
	s.kvs[i] = k
	return s
}

// listing is what a list of Prefix answers in state s with `limit` (0: none): the keys and
// their kvs in order, and how many there are in all.
func (s state) listing(limit int64) (keys []int, kvs []kv, count int64) {
	for k, v := range s.kvs {
		if v.mod == 0 {
			continue
		}
		count++
		if limit == 0 || int64(len(keys)) < limit {
			keys = append(keys, k)
			kvs = append(kvs, v)
		}
	}
	return keys, kvs, count
}

// step is the model: whether the operation could have answered `o` in state s, and the state
// after it.
func step(s state, i input, o output) (bool, state) {
	if o.unknown {
		return true, apply(s, i)
	}
	switch i.kind {
	case opGet:
		return o.rev == s.rev && o.kv == s.kvs[i.key], s
	case opList:
		keys, kvs, n := s.listing(i.limit)
		return o.rev == s.rev && slices.Equal(keys, o.keys) && slices.Equal(kvs, o.kvs) &&
			n == o.count && o.more == (i.limit > 0 && n > i.limit), s
	case opPut:
		return o.rev == s.rev+1 && o.kv == s.kvs[i.key], s.put(i.key, i.value, i.lease)
	case opDelete:
		if s.kvs[i.key].mod == 0 {
			return o.deleted == 0 && o.rev == s.rev, s
		}
		ok := o.deleted == 1 && o.rev == s.rev+1 && o.kv == s.kvs[i.key]
		return ok, apply(s, i)
	case opTxn:
		if s.kvs[i.key].mod == i.cmpMod {
			return o.succeeded && o.rev == s.rev+1, s.put(i.key, i.value, i.lease)
		}
		return !o.succeeded && o.rev == s.rev && o.kv == s.kvs[i.key], s
	case opRevoke:
		after := apply(s, i)
		return o.rev == after.rev, after
	case opEnd:
		return s == o.end, s
	}
	return false, s
}

// apply is the write's effect, unchecked.
func apply(s state, i input) state {
	switch i.kind {
	case opPut:
		return s.put(i.key, i.value, i.lease)
	case opDelete:
		if s.kvs[i.key].mod != 0 {
			s.rev++
			s.kvs[i.key] = kv{}
		}
	case opTxn:
		if s.kvs[i.key].mod == i.cmpMod {
			return s.put(i.key, i.value, i.lease)
		}
	case opRevoke:
		hit := false
		for k, v := range s.kvs {
			if v.mod != 0 && v.lease == i.lease {
				s.kvs[k] = kv{}
				hit = true
			}
		}
		if hit {
			s.rev++
		}
	}
	return s
}

var model = porcupine.Model{
	Init: func() interface{} { return state{rev: 1} },
	Step: func(s, in, out interface{}) (bool, interface{}) {
		ok, next := step(s.(state), in.(input), out.(output))
		return ok, next
	},
	Hash: func(s interface{}) uint64 {
		st := s.(state)
		h := uint64(st.rev)
		for _, k := range st.kvs {
			h = h*1099511628211 ^ uint64(k.mod)
		}
		return h
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		what := fmt.Sprintf("%s(k%d", kindNames[i.kind], i.key)
		switch i.kind {
		case opList:
			what = fmt.Sprintf("list(limit %d", i.limit)
		case opPut:
			what += ", " + i.value
		case opTxn:
			what += fmt.Sprintf(" m%d ? put %s", i.cmpMod, i.value)
		case opRevoke:
			what = fmt.Sprintf("revoke(%x", i.lease)
		case opEnd:
			return fmt.Sprintf("end: %s", o.end)
		}
		if i.lease != 0 && i.kind != opRevoke {
			what += fmt.Sprintf(" l%x", i.lease)
		}
		what += ")"
		if o.unknown {
			return what + " -> ?"
		}
		switch i.kind {
		case opGet:
			return fmt.Sprintf("%s -> %s @%d", what, o.kv, o.rev)
		case opList:
			return fmt.Sprintf("%s -> %d of %d @%d", what, len(o.kvs), o.count, o.rev)
		case opDelete:
			return fmt.Sprintf("%s -> %d @%d", what, o.deleted, o.rev)
		case opTxn:
			return fmt.Sprintf("%s -> %v %s @%d", what, o.succeeded, o.kv, o.rev)
		}
		return fmt.Sprintf("%s @%d", what, o.rev)
	},
	DescribeState: func(s interface{}) string { return s.(state).String() },
}
