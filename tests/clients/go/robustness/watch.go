package robustness

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// wevent is one watch event.
type wevent struct {
	rev  int64
	key  int
	put  bool
	kv   kv // a put's key; a delete's is empty
	prev kv // prev_kv, empty if none was sent
}

func (e wevent) String() string {
	if e.put {
		return fmt.Sprintf("@%d put k%d=%s (prev %s)", e.rev, e.key, e.kv, e.prev)
	}
	return fmt.Sprintf("@%d delete k%d (prev %s)", e.rev, e.key, e.prev)
}

// item is what one response brought a session: events, or a progress notification.
type item struct {
	events   []wevent
	progress int64
	// at: when it arrived, on the recorder's clock.
	at int64
}

// session is one Watch stream of a watcher, from its start revision until it broke, was
// compacted, or the run ended.
type session struct {
	member    int
	start     int64
	items     []item
	compacted int64
	end       string
}

// high is the revision the session has seen everything up to (its last event or progress).
func (s *session) high() int64 {
	h := s.start - 1
	for _, it := range s.items {
		for _, e := range it.events {
			h = max(h, e.rev)
		}
		h = max(h, it.progress)
	}
	return h
}

// watcher watches Prefix from revision 1 with prev_kv, for the whole run: when a stream
// breaks it watches again from the revision after the last it saw, through the next member.
// Its streams require a leader, as Kubernetes' do.
type watcher struct {
	id int
	// prefix: the keys it watches ("" for Prefix, all of them), and the revision it starts
	// at (0: 1). A watcher of part of the keys is checked against those of all of them.
	prefix string
	from   int64
	// clock is the recorder's.
	clock    func() int64
	mu       sync.Mutex
	sessions []*session
	events   int
}

// seenTo is what the current session has seen everything up to (0 before the first).
func (w *watcher) seenTo() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.sessions) == 0 {
		return 0
	}
	return w.sessions[len(w.sessions)-1].high()
}

// caughtUp: the current session has seen everything up to rev.
func (w *watcher) caughtUp(rev int64) bool { return w.seenTo() >= rev }

func (w *watcher) run(addrs []string, stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	next, member := max(w.from, 1), w.id%len(addrs)
	for {
		s := &session{member: member, start: next}
		w.mu.Lock()
		w.sessions = append(w.sessions, s)
		w.mu.Unlock()
		stopped := w.session(addrs[member], s, stop)
		w.mu.Lock()
		next = s.high() + 1
		if s.compacted > 0 {
			next = s.compacted
		}
		w.mu.Unlock()
		if stopped {
			return
		}
		member = (member + 1) % len(addrs)
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// session runs one stream until it ends (false) or stop closes (true).
func (w *watcher) session(addr string, s *session, stop <-chan struct{}) bool {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.end = err.Error()
		return false
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// As Kubernetes watches (clientv3's WithRequireLeader): a member that loses its leader
	// ends the stream, and the watcher moves on.
	ctx = metadata.AppendToOutgoingContext(ctx, "hasleader", "true")
	stream, err := pb.NewWatchClient(cc).Watch(ctx)
	if err == nil {
		err = stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte(w.keys()), RangeEnd: prefixEnd(w.keys()), StartRevision: s.start, PrevKv: true}}})
	}
	if err != nil {
		s.end = err.Error()
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			resp, err := stream.Recv()
			if err != nil {
				w.mu.Lock()
				s.end = err.Error()
				w.mu.Unlock()
				return
			}
			w.mu.Lock()
			switch {
			case resp.Canceled:
				s.compacted = resp.CompactRevision
				s.end = "canceled: " + resp.CancelReason
			case resp.Created:
			case len(resp.Events) > 0:
				it := item{at: w.clock()}
				for _, e := range resp.Events {
					it.events = append(it.events, toEvent(e))
				}
				s.items = append(s.items, it)
				w.events += len(it.events)
			default:
				s.items = append(s.items, item{progress: resp.Header.Revision})
			}
			canceled := resp.Canceled
			w.mu.Unlock()
			if canceled {
				return
			}
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ended:
			return false
		case <-stop:
			return true
		case <-tick.C:
			stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
		}
	}
}

// keys is the prefix the watcher watches.
func (w *watcher) keys() string {
	if w.prefix == "" {
		return Prefix
	}
	return w.prefix
}

// partial: the watcher sees only some of the keys.
func (w *watcher) partial() bool { return w.keys() != Prefix }

// under: the events of evs on keys under prefix p.
func under(evs []wevent, p string) []wevent {
	var out []wevent
	for _, e := range evs {
		if e.key >= 0 && strings.HasPrefix(keyName(e.key), p) {
			out = append(out, e)
		}
	}
	return out
}

func toEvent(e *mvccpb.Event) wevent {
	ev := wevent{rev: e.Kv.ModRevision, key: keyIndex(string(e.Kv.Key)), put: e.Type == mvccpb.PUT}
	if ev.put {
		ev.kv = fromPB(e.Kv)
	}
	if e.PrevKv != nil {
		ev.prev = fromPB(e.PrevKv)
	}
	return ev
}

// watchCheck is what the watch validation found.
type watchCheck struct {
	violations []string
	// finalRev is the run's last revision.
	finalRev int64
	// checkpoints: the replayed store at every checkpointEvery-th revision (see stateAt).
	checkpoints map[int64]state
	// The store replayed from every event seen, if the events cover every revision.
	final    state
	complete bool
	events   int
	// union is every revision's events, as the watchers saw them; seenAt, when the first
	// watcher saw each.
	union  map[int64][]wevent
	seenAt map[int64]int64
	// leaseGone: the revisions that deleted every key then on one lease, and nothing else
	// (what its revocation or expiry would have done), and that lease.
	leaseGone map[int64]int64
	// expired: the leases found expired (their keys deleted at a revision only expiry explains).
	expired int
	// lists: the lists at a past revision checked; listsCompacted: of them, answered
	// "compacted", rightly.
	lists, listsCompacted int
}

func (c *watchCheck) fail(format string, args ...any) {
	if len(c.violations) < 50 {
		c.violations = append(c.violations, fmt.Sprintf(format, args...))
	}
}

// checkWatches validates every watcher's sessions against each other, against the KV
// history, and against a replay of the store: events in revision order, none duplicated, none
// missed between a session's start and what it has seen, none invented, each matching the
// store (value, prev_kv, create and mod revision, version, lease), progress notifications never
// ahead of events, a lease's keys gone in one revision when it is revoked.
//
// And each list at a past revision against the store replayed to that revision: the keys of
// every page, their values and revisions, the first page's count; "compacted" only after a
// compaction past it was asked for; never "future revision" (the client had seen it).
func checkWatches(ws []*watcher, finalRev int64, history []porcupine.Operation, lists []pagedList, compactions []compaction) *watchCheck {
	c := &watchCheck{finalRev: finalRev, seenAt: map[int64]int64{}, checkpoints: map[int64]state{},
		leaseGone: map[int64]int64{}}
	type partialSession struct {
		name  string
		keys  string
		start int64
		high  int64
		seen  map[int64][]wevent
	}
	var partials []partialSession
	union := map[int64][]wevent{}
	from := map[int64]string{}
	for _, w := range ws {
		for si, s := range w.sessions {
			name := fmt.Sprintf("watcher %d session %d (m%d, from %d)", w.id, si, s.member, s.start)
			last := int64(0)
			seen := map[int64][]wevent{}
			for _, it := range s.items {
				if it.progress > 0 {
					if it.progress < last {
						c.fail("%s: progress %d after an event at %d", name, it.progress, last)
					}
					last = max(last, it.progress)
					continue
				}
				for _, e := range it.events {
					if at, ok := c.seenAt[e.rev]; !ok || it.at < at {
						c.seenAt[e.rev] = it.at
					}
					c.events++
					if e.rev < s.start {
						c.fail("%s: event %s before the start", name, e)
					}
					if e.rev < last || (e.rev == last && len(seen[e.rev]) == 0) {
						c.fail("%s: event %s out of order (after %d)", name, e, last)
					}
					for _, o := range seen[e.rev] {
						if o.key == e.key {
							c.fail("%s: event %s twice", name, e)
						}
					}
					seen[e.rev] = append(seen[e.rev], e)
					last = e.rev
				}
			}
			if s.compacted > 0 && s.compacted <= s.start {
				c.fail("%s: compacted at %d, not after its start", name, s.compacted)
			}
			high := s.high()
			if si == len(w.sessions)-1 && high < finalRev {
				c.fail("%s: ended at %d, before the last revision %d", name, high, finalRev)
			}
			if w.partial() {
				partials = append(partials, partialSession{name, w.keys(), s.start, high, seen})
				continue
			}
			for r := max(s.start, 2); r <= high; r++ {
				if len(seen[r]) == 0 {
					c.fail("%s: missed revision %d (it has seen up to %d)", name, r, high)
					break
				}
			}
			for r, evs := range seen {
				if prior, ok := union[r]; ok {
					if !slices.Equal(prior, evs) {
						c.fail("%s: revision %d is %v, %s saw %v", name, r, evs, from[r], prior)
					}
					continue
				}
				union[r] = evs
				from[r] = name
			}
		}
	}
	// A watcher of some keys sees, of every revision from its start to where it has seen,
	// exactly the events the watchers of all keys saw on those keys.
	for _, p := range partials {
		for r := max(p.start, 2); r <= p.high; r++ {
			all, ok := union[r]
			if !ok {
				continue
			}
			if want := under(all, p.keys); !slices.Equal(want, p.seen[r]) {
				c.fail("%s: revision %d is %v, the watchers of every key saw %v", p.name, r, p.seen[r], want)
			}
		}
	}
	// Every write the history knows is at its revision; every put seen was made by a client.
	values := map[string]bool{}
	for _, op := range history {
		in, out := op.Input.(input), op.Output.(output)
		if in.kind == opPut || in.kind == opTxn {
			values[in.value] = true
		}
		if out.unknown || out.rev > finalRev {
			continue
		}
		evs, ok := union[out.rev]
		if !ok && (in.kind == opPut || (in.kind == opTxn && out.succeeded) || (in.kind == opDelete && out.deleted > 0)) {
			c.fail("acknowledged %s of k%d at %d: no watcher saw revision %d", kindNames[in.kind], in.key, out.rev, out.rev)
			continue
		}
		switch {
		case in.kind == opPut || (in.kind == opTxn && out.succeeded):
			if len(evs) != 1 || !evs[0].put || evs[0].key != in.key || evs[0].kv.value != in.value {
				c.fail("acknowledged %s k%d=%s at %d, watchers saw %v", kindNames[in.kind], in.key, in.value, out.rev, evs)
			}
		case in.kind == opDelete && out.deleted > 0:
			if len(evs) != 1 || evs[0].put || evs[0].key != in.key {
				c.fail("acknowledged delete of k%d at %d, watchers saw %v", in.key, out.rev, evs)
			}
		}
	}
	// Replay.
	revs := make([]int64, 0, len(union))
	for r := range union {
		revs = append(revs, r)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	s := state{rev: 1}
	c.complete = true
	listsAt := map[int64][]pagedList{}
	for _, l := range lists {
		listsAt[l.rev] = append(listsAt[l.rev], l)
	}
	for _, l := range listsAt[1] {
		c.checkList(l, s, compactions)
	}
	for _, r := range revs {
		if r != s.rev+1 {
			c.complete = false
			break
		}
		evs := union[r]
		before := s
		gone := map[int64]bool{}
		for _, e := range evs {
			if e.key < 0 {
				c.fail("event %s outside the keys written", e)
				continue
			}
			if e.prev != before.kvs[e.key] {
				c.fail("event %s: prev_kv is not %s", e, before.kvs[e.key])
			}
			if e.put {
				want := before.put(e.key, e.kv.value, e.kv.lease).kvs[e.key]
				if e.kv != want {
					c.fail("event %s: the key should be %s", e, want)
				}
				if !values[e.kv.value] {
					c.fail("event %s: no client put that value", e)
				}
				s.kvs[e.key] = e.kv
			} else {
				if before.kvs[e.key].mod == 0 {
					c.fail("event %s: deletes a key that is absent", e)
				}
				if l := before.kvs[e.key].lease; l != 0 && len(evs) > 1 {
					gone[l] = true
				}
				s.kvs[e.key] = kv{}
			}
		}
		for k, v := range s.kvs {
			if v.mod != 0 && gone[v.lease] {
				c.fail("revision %d deleted keys of lease %x but left k%d", r, v.lease, k)
			}
		}
		if l := leaseDeleted(evs, s); l != 0 {
			c.leaseGone[r] = l
		}
		s.rev = r
		if r%checkpointEvery == 0 {
			c.checkpoints[r] = s
		}
		for _, l := range listsAt[r] {
			c.checkList(l, s, compactions)
		}
	}
	if c.complete && s.rev != finalRev {
		c.complete = false
	}
	c.final = s
	c.union = union
	return c
}

// leaseDeleted is the lease whose keys evs, a revision's events, all deleted, leaving none on
// it in s, the store after them; 0 if they did anything else.
func leaseDeleted(evs []wevent, s state) int64 {
	if len(evs) == 0 || evs[0].put || evs[0].prev.lease == 0 {
		return 0
	}
	l := evs[0].prev.lease
	for _, e := range evs {
		if e.put || e.prev.lease != l {
			return 0
		}
	}
	for _, v := range s.kvs {
		if v.mod != 0 && v.lease == l {
			return 0
		}
	}
	return l
}

// checkpointEvery: how often the replay keeps the store, for stateAt.
const checkpointEvery = 512

// stateAt is the store the events replay to at revision r (r <= 1: the empty store); the
// events must cover every revision.
func (c *watchCheck) stateAt(r int64) state {
	base := r - r%checkpointEvery
	s, ok := c.checkpoints[base]
	if !ok {
		s = state{rev: 1}
	}
	for rr := s.rev + 1; rr <= r; rr++ {
		for _, e := range c.union[rr] {
			if e.key < 0 {
				continue
			}
			if e.put {
				s.kvs[e.key] = e.kv
			} else {
				s.kvs[e.key] = kv{}
			}
		}
		s.rev = rr
	}
	return s
}

// expiryClient is the client id porcupine shows lease expiries under.
const expiryClient = 1 << 20

// patch resolves writes of unknown outcome from the watchers' events, as etcd's robustness
// suite does, so that porcupine need not try every place such a write could go. It runs only
// when the events cover every revision.
//
// A put (or a transaction's put) whose value was seen is a put at that revision; one never
// seen never took effect (or, for a transaction, took its else branch, which changes nothing)
// and leaves the history.
//
// A deletion that no write with a known answer explains, of every key on one short lease,
// seen once the lease's TTL had run out after its last renewal (or grant), is that lease's
// expiry: an operation added to the history as a revocation at that revision, called when the
// lease was granted and returned when a watcher first saw it.
//
// A delete, or a revocation, of unknown outcome can only have made one of the deletions left,
// of its key (of keys on its lease), at a revision after every known answer returned before
// its call, and seen (by any answer at or past that revision, or a watcher) only after its
// call. The deletions left are matched to such writes, each to its own; a write matched is
// pinned to that revision, the others changed nothing and leave the history. A deletion no
// such write can take is an expiry seen too early (reported), or unexplained (porcupine
// reports it). No write is left of unknown outcome, so that porcupine can check the history in
// ranges of revisions (checkKV).
//
// Dropping or pinning a write wrongly can only make porcupine fail, never pass a bad history:
// every revision must still be explained by some operation. A write pinned to a revision
// returned, at the latest, when a watcher first saw that revision. No key may be attached to a
// lease at a revision after it was revoked or expired.
func patch(history []porcupine.Operation, c *watchCheck, leases map[int64]*leaseRec) []porcupine.Operation {
	if !c.complete {
		return history
	}
	byValue := map[string]wevent{}
	for _, evs := range c.union {
		for _, e := range evs {
			if e.put {
				byValue[e.kv.value] = e
			}
		}
	}
	// The revisions known writes made (a delete of nothing, a transaction's else branch and a
	// revocation may answer a revision another write made: they explain none), and every
	// known answer's return and revision.
	made := map[int64]bool{}
	type answer struct{ ret, rev int64 }
	var answers []answer
	for _, op := range history {
		in, o := op.Input.(input), op.Output.(output)
		if o.unknown {
			continue
		}
		answers = append(answers, answer{op.Return, o.rev})
		if in.kind == opPut || (in.kind == opTxn && o.succeeded) || (in.kind == opDelete && o.deleted > 0) {
			made[o.rev] = true
		}
	}
	// after(t): the highest revision answered before t.
	byRet := slices.Clone(answers)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
	for i := 1; i < len(byRet); i++ {
		byRet[i].rev = max(byRet[i].rev, byRet[i-1].rev)
	}
	after := func(t int64) int64 {
		i := sort.Search(len(byRet), func(i int) bool { return byRet[i].ret >= t })
		if i == 0 {
			return 1
		}
		return byRet[i-1].rev
	}
	// seen(r): the first return of an answer at revision r or later.
	byRev := slices.Clone(answers)
	sort.Slice(byRev, func(i, j int) bool { return byRev[i].rev < byRev[j].rev })
	for i := len(byRev) - 2; i >= 0; i-- {
		byRev[i].ret = min(byRev[i].ret, byRev[i+1].ret)
	}
	seen := func(r int64) int64 {
		i := sort.Search(len(byRev), func(i int) bool { return byRev[i].rev >= r })
		if i == len(byRev) {
			return never
		}
		return byRev[i].ret
	}
	// The deletions no known write explains.
	var lost []int64
	for r, evs := range c.union {
		if made[r] {
			continue
		}
		for _, e := range evs {
			if !e.put {
				lost = append(lost, r)
				break
			}
		}
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i] < lost[j] })
	could := func(in input, r int64) bool {
		evs := c.union[r]
		if in.kind == opDelete {
			return len(evs) == 1 && evs[0].key == in.key
		}
		// A revocation or expiry deletes every key on its lease, and nothing else.
		return c.leaseGone[r] == in.lease
	}
	// The revisions known revocations made, and when each lease ended. A revocation that
	// deleted nothing answers the revision it found, which may be one an expiry made just
	// before: only one whose revision deleted its keys made it.
	revoked := map[int64]bool{}
	ended := map[int64]int64{}
	end := func(l, r int64) {
		if e, ok := ended[l]; !ok || r < e {
			ended[l] = r
		}
	}
	for _, op := range history {
		in, o := op.Input.(input), op.Output.(output)
		if in.kind == opRevoke && !o.unknown {
			if _, deleted := c.union[o.rev]; deleted && could(in, o.rev) {
				revoked[o.rev] = true
			}
			end(in.lease, o.rev)
		}
	}
	// A deletion of every key on one short lease, seen once its TTL had run out after its last
	// renewal, is its expiry.
	var expiries []porcupine.Operation
	expiry := func(r int64, early bool) bool {
		l := c.union[r][0].prev.lease
		rec := leases[l]
		if rec == nil || !could(input{kind: opRevoke, lease: l}, r) {
			return false
		}
		earliest := rec.renewed + rec.ttl*int64(time.Second)
		if c.seenAt[r] < earliest {
			if !early {
				return false
			}
			c.fail("lease %x (TTL %ds) expired early: its keys were deleted at revision %d, seen %s before its TTL ran out after its last renewal",
				l, rec.ttl, r, time.Duration(earliest-c.seenAt[r]))
		}
		c.expired++
		end(l, r)
		expiries = append(expiries, porcupine.Operation{ClientId: expiryClient, Input: input{kind: opRevoke, lease: l},
			Call: rec.call, Output: output{rev: r}, Return: c.seenAt[r]})
		return true
	}
	var left []int64
	for _, r := range lost {
		if !revoked[r] && !expiry(r, false) {
			left = append(left, r)
		}
	}
	// The deletions left are matched to the deletes and revocations of unknown outcome that
	// could have made them (augmenting paths): each one matched is pinned to its revision,
	// the rest changed nothing and leave the history. Which of two that could have made a
	// deletion is pinned to it does not matter: either fits every known answer.
	cands := map[int64][]int{}
	for i, op := range history {
		in, o := op.Input.(input), op.Output.(output)
		if !o.unknown || (in.kind != opDelete && in.kind != opRevoke) {
			continue
		}
		lo := after(op.Call)
		for _, r := range left {
			if r > lo && seen(r) > op.Call && c.seenAt[r] > op.Call && could(in, r) {
				cands[r] = append(cands[r], i)
			}
		}
	}
	pinned := map[int]int64{}
	var augment func(r int64, tried map[int]bool) bool
	augment = func(r int64, tried map[int]bool) bool {
		for _, i := range cands[r] {
			if tried[i] {
				continue
			}
			tried[i] = true
			if prev, ok := pinned[i]; !ok || augment(prev, tried) {
				pinned[i] = r
				return true
			}
		}
		return false
	}
	for _, r := range left {
		if !augment(r, map[int]bool{}) {
			// An early expiry, or left unexplained: porcupine reports it.
			expiry(r, true)
		}
	}
	for r, evs := range c.union {
		for _, e := range evs {
			if e.put && e.kv.lease != 0 {
				if at, ok := ended[e.kv.lease]; ok && r > at {
					c.fail("event %s: attached to lease %x, which ended at revision %d", e, e.kv.lease, at)
				}
			}
		}
	}
	out := expiries
	for i, op := range history {
		in, o := op.Input.(input), op.Output.(output)
		if o.unknown {
			switch in.kind {
			case opPut, opTxn:
				e, ok := byValue[in.value]
				if !ok {
					continue
				}
				op.Output = output{rev: e.rev, kv: e.prev, succeeded: true}
				op.Return = c.seenAt[e.rev]
			case opDelete, opRevoke:
				r, ok := pinned[i]
				if !ok {
					continue
				}
				op.Output = output{rev: r, deleted: 1, kv: c.union[r][0].prev}
				op.Return = c.seenAt[r]
			}
		}
		out = append(out, op)
	}
	return out
}

// checkList checks a list at a past revision against the store at that revision.
func (c *watchCheck) checkList(l pagedList, s state, compactions []compaction) {
	c.lists++
	name := fmt.Sprintf("client %d's list at %d (pages of %d)", l.client, l.rev, l.limit)
	if l.err != "" {
		if strings.Contains(l.err, "compacted") {
			for _, cp := range compactions {
				if cp.call <= l.ret && l.rev < cp.rev {
					c.listsCompacted++
					return
				}
			}
			c.fail("%s: %q, with no compaction past it asked for", name, l.err)
			return
		}
		c.fail("%s: %q", name, l.err)
		return
	}
	keys, kvs, n := s.listing(0)
	if !slices.Equal(keys, l.keys) || !slices.Equal(kvs, l.kvs) || n != l.count {
		c.fail("%s: %v %v, count %d; the store then was %s", name, l.keys, l.kvs, l.count, s)
	}
}
