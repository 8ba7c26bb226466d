package robustness

import (
	"context"
	"io"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"kvd.test/clients/go/internal/harness"
)

func bin(t *testing.T) string {
	b := os.Getenv("KVD_ROBUSTNESS_BIN")
	if b == "" {
		t.Skip("KVD_ROBUSTNESS_BIN is not set: run through crates/kvd/tests/go_client.rs")
	}
	return b
}

func seed() int64 {
	if s, err := strconv.ParseInt(os.Getenv("KVD_ROBUSTNESS_SEED"), 10, 64); err == nil {
		return s
	}
	return time.Now().UnixNano() % 1_000_000
}

// The short profile: three members, every fault kind, the etcd traffic, checked; then each
// validator is fed the same run's records with one fault injected into them, and must find it.
func TestShortProfileUnderFaults(t *testing.T) {
	rep := shortRun(t, Etcd, 90*time.Second)
	t.Run("validators", func(t *testing.T) { checkValidatorsFail(t, rep) })
}

// The same with the Kubernetes traffic: watchers of each resource from a recent revision,
// compaction every few seconds.
func TestKubernetesProfileUnderFaults(t *testing.T) {
	rep := shortRun(t, Kubernetes, 60*time.Second)
	if len(rep.compactions) < 5 {
		t.Fatalf("only %d compactions", len(rep.compactions))
	}
}

// shortRun runs `p` for d (or KVD_ROBUSTNESS_DURATION) on three members with every fault, and
// fails on a violation or a run that did too little to mean anything.
func shortRun(t *testing.T, p Profile, d time.Duration) *Report {
	b := bin(t)
	if s := os.Getenv("KVD_ROBUSTNESS_DURATION"); s != "" {
		if x, err := time.ParseDuration(s); err == nil {
			d = x
		}
	}
	var all []string
	for name := range Faults {
		all = append(all, name)
	}
	rep := Run(t, Config{
		Bin: b, Members: 3, Duration: d, Clients: 6, Watchers: 3, Faults: all,
		Seed: seed(), Dir: t.TempDir(), Profile: p,
	})
	t.Log(rep.Summary())
	if len(rep.Violations) > 0 {
		t.Fatalf("%d violations (seed %d: KVD_ROBUSTNESS_SEED=%d replays the fault schedule)", len(rep.Violations), rep.Seed, rep.Seed)
	}
	if rep.Operations < 1000 || rep.Events < 1000 || len(rep.Faults) < 5 {
		t.Fatalf("the run did too little to mean anything: %d operations, %d events, %d faults", rep.Operations, rep.Events, len(rep.Faults))
	}
	return rep
}

// checkValidatorsFail feeds the validators a clean run's records with a stale read, a
// dropped, a duplicated watch event, a lost write and leases renewed after they expired put
// into them.
func checkValidatorsFail(t *testing.T, rep *Report) {
	hist := rep.history
	// A stale read: a get called after a put of its key returned, answered with the value
	// and revision from before that put.
	stale := -1
	for i, op := range rep.patched {
		in, out := op.Input.(input), op.Output.(output)
		if in.kind != opGet || out.unknown || out.kv.mod < 2 {
			continue
		}
		for _, w := range rep.patched {
			wi, wo := w.Input.(input), w.Output.(output)
			if wi.kind == opPut && !wo.unknown && wi.key == in.key && wo.rev == out.kv.mod && w.Return < op.Call {
				stale = i
				h := append([]porcupine.Operation(nil), rep.patched...)
				o := out
				o.kv, o.rev = wo.kv, wo.rev-1
				h[i].Output = o
				if res := checkKV(h, rep.wc, time.Minute).result; res != porcupine.Illegal {
					t.Errorf("porcupine passed a stale read (%s): %s", res, model.DescribeOperation(in, o))
				}
				break
			}
		}
		if stale >= 0 {
			break
		}
	}
	if stale < 0 {
		t.Errorf("no read in the run to make stale")
	}
	// A read at its own revision answered with a value no write made: porcupine finds it in
	// the range of revisions it is checked in.
	wrong := false
	for i, op := range rep.patched {
		in, out := op.Input.(input), op.Output.(output)
		if in.kind != opGet || out.unknown || out.kv.mod == 0 || i < len(rep.patched)/2 {
			continue
		}
		h := append([]porcupine.Operation(nil), rep.patched...)
		out.kv.value += "-changed"
		h[i].Output = out
		kc := checkKV(h, rep.wc, time.Minute)
		if kc.result != porcupine.Illegal || kc.why != "" || kc.bad == nil {
			t.Errorf("porcupine passed a read of a value never written (%s, %d ranges): %s", kc.result, kc.windows, model.DescribeOperation(in, out))
		}
		wrong = true
		break
	}
	if !wrong {
		t.Errorf("no read in the run to answer wrongly")
	}
	// Watch events dropped, duplicated; a write lost.
	mutate := func(name, want string, f func(ws []*watcher) bool) {
		ws := copyWatchers(rep.watchers)
		if !f(ws) {
			t.Errorf("%s: nothing in the run to change", name)
			return
		}
		c := checkWatches(ws, rep.FinalRev, hist, rep.lists, rep.compactions)
		found := false
		for _, v := range c.violations {
			found = found || strings.Contains(v, want)
		}
		if !found {
			t.Errorf("%s: the watch check did not say %q: %v", name, want, c.violations)
		}
	}
	// A list at a past revision answered with a value from another revision.
	if i := wrongList(rep.lists); i < 0 {
		t.Errorf("no list at a past revision with a key in the run")
	} else {
		lists := append([]pagedList(nil), rep.lists...)
		l := lists[i]
		l.kvs = append([]kv(nil), l.kvs...)
		l.kvs[0].value += "-changed"
		lists[i] = l
		c := checkWatches(copyWatchers(rep.watchers), rep.FinalRev, hist, lists, rep.compactions)
		found := false
		for _, v := range c.violations {
			found = found || strings.Contains(v, "the store then was")
		}
		if !found {
			t.Errorf("a changed list at a past revision passed: %v", c.violations)
		}
	}
	// Every lease that expired, taken as renewed an hour after its grant: each expired early,
	// but for one whose keys a revocation of unknown outcome could have deleted: the check
	// then pins the deletion on that revocation, as it should.
	if rep.Expired == 0 {
		t.Errorf("no lease expired in the run")
	} else {
		doubtful := map[int64]bool{}
		for _, op := range hist {
			if in, o := op.Input.(input), op.Output.(output); in.kind == opRevoke && o.unknown {
				doubtful[in.lease] = true
			}
		}
		want := 0
		for _, op := range rep.patched {
			if op.ClientId == expiryClient && !doubtful[op.Input.(input).lease] {
				want++
			}
		}
		leases := map[int64]*leaseRec{}
		for id, l := range rep.leases {
			c := *l
			c.renewed = c.call + int64(time.Hour)
			leases[id] = &c
		}
		c := checkWatches(copyWatchers(rep.watchers), rep.FinalRev, hist, rep.lists, rep.compactions)
		patch(hist, c, leases)
		early := 0
		for _, v := range c.violations {
			if strings.Contains(v, "expired early") {
				early++
			}
		}
		if early < min(want, 50) || early > rep.Expired {
			t.Errorf("%d leases expired (%d of them with no revocation of unknown outcome), %d reported early: %v", rep.Expired, want, early, c.violations)
		}
	}
	mutate("drop", "missed revision", func(ws []*watcher) bool {
		s := ws[0].sessions[len(ws[0].sessions)-1]
		for i := len(s.items) / 2; i < len(s.items); i++ {
			if len(s.items[i].events) > 0 {
				s.items = append(s.items[:i], s.items[i+1:]...)
				return true
			}
		}
		return false
	})
	mutate("duplicate", "twice", func(ws []*watcher) bool {
		s := ws[1].sessions[len(ws[1].sessions)-1]
		for i := len(s.items) / 2; i < len(s.items); i++ {
			if len(s.items[i].events) > 0 {
				s.items = append(s.items[:i+1], s.items[i:]...)
				return true
			}
		}
		return false
	})
	mutate("lost write", "no watcher saw", func(ws []*watcher) bool {
		var rev int64
		for _, op := range hist {
			in, out := op.Input.(input), op.Output.(output)
			if in.kind == opPut && !out.unknown {
				rev = out.rev
			}
		}
		for _, w := range ws {
			for _, s := range w.sessions {
				for i := range s.items {
					var keep []wevent
					for _, e := range s.items[i].events {
						if e.rev != rev {
							keep = append(keep, e)
						}
					}
					s.items[i].events = keep
				}
			}
		}
		return rev > 0
	})
}

func copyWatchers(ws []*watcher) []*watcher {
	var out []*watcher
	for _, w := range ws {
		c := &watcher{id: w.id}
		for _, s := range w.sessions {
			cs := *s
			cs.items = nil
			for _, it := range s.items {
				cs.items = append(cs.items, item{events: append([]wevent(nil), it.events...), progress: it.progress, at: it.at})
			}
			c.sessions = append(c.sessions, &cs)
		}
		out = append(out, c)
	}
	return out
}

// The peer forwarders know which member opened each connection, and a member isolated
// through them loses the cluster: the others elect a leader without it, it answers no
// linearizable read, and once healed it serves again.
func TestIsolationPartitionsAMember(t *testing.T) {
	c := harness.StartCluster(t, t.TempDir(), harness.Options{Bin: bin(t), Members: 3, ForwardClients: true, ForwardPeers: true})
	f := &faulter{c: c, rng: rand.New(rand.NewSource(1))}
	if err := f.healthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	l := c.Leader()
	if l < 0 {
		t.Fatal("no leader")
	}
	// The leader sends to every follower (followers send nothing to each other).
	for i, m := range c.Members {
		if senders := m.PeerFwd.Senders(); i != l && senders[c.Members[l].ID] == 0 {
			t.Errorf("m%d's peer forwarder has no connection it knows to be from the leader m%d: %v", i, l, senders)
		}
	}
	c.Isolate(l)
	deadline := time.Now().Add(20 * time.Second)
	for {
		nl := -1
		for i, s := range c.Status() {
			if i != l && s != nil && s.Leader == s.Header.MemberId {
				nl = i
			}
		}
		if nl >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader with m%d isolated", l)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cl := harness.AdminClient(t, c.Members[l].Direct)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := cl.Get(ctx, "k")
	cancel()
	if err == nil {
		t.Fatalf("isolated m%d answered a linearizable read", l)
	}
	c.Heal()
	if err := f.healthy(30 * time.Second); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}

// A watch that requires a leader (clientv3's WithRequireLeader, as Kubernetes watches) ends
// with etcd's "no leader" when its member is cut off from the cluster, and a new one is
// refused there, so that the client goes to another member instead of waiting on a member that
// sees no writes. Run against etcd too (KVD_ROBUSTNESS_BIN=…/etcd): both end the stream.
func TestWatchRequiringALeaderEndsOnAnIsolatedMember(t *testing.T) {
	c := harness.StartCluster(t, t.TempDir(), harness.Options{Bin: bin(t), Members: 3, ForwardPeers: true})
	f := &faulter{c: c, rng: rand.New(rand.NewSource(1))}
	if err := f.healthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	l := c.Leader()
	m := (l + 1) % 3
	cc, err := grpc.NewClient(c.Members[m].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	watch := func() (pb.Watch_WatchClient, error) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "hasleader", "true")
		s, err := pb.NewWatchClient(cc).Watch(ctx)
		if err != nil {
			return nil, err
		}
		// A stream the member refused at once may end before the request goes: grpc-go's Send
		// then says io.EOF, and the refusal is Recv's to tell.
		err = s.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("k")}}})
		if err != nil && err != io.EOF {
			return nil, err
		}
		_, err = s.Recv() // created, or the refusal
		return s, err
	}
	s, err := watch()
	if err != nil {
		t.Fatalf("watch with a leader: %v", err)
	}
	c.Isolate(m)
	defer c.Heal()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != "etcdserver: no leader" {
			t.Fatalf("the stream ended with %v, not etcd's no leader", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the watch on isolated m%d did not end within 30 s", m)
	}
	if _, err := watch(); err == nil {
		t.Fatalf("a watch requiring a leader was opened on isolated m%d", m)
	} else if st, _ := status.FromError(err); st.Message() != "etcdserver: no leader" {
		t.Fatalf("a new watch on isolated m%d failed with %v, not etcd's no leader", m, err)
	}
}

// wrongList is the index of a list with a key in it (-1 if none).
func wrongList(ls []pagedList) int {
	for i, l := range ls {
		if l.err == "" && len(l.kvs) > 0 {
			return i
		}
	}
	return -1
}
