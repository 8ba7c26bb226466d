package robustness

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kvd.test/clients/go/internal/harness"
)

// Config is one run.
type Config struct {
	Bin      string
	Members  int
	Duration time.Duration
	Clients  int
	Watchers int
	// Faults by name (see Faults); a run injects them one at a time, chosen at random.
	Faults []string
	Seed   int64
	Dir    string
	// Profile is the traffic: Etcd or Kubernetes.
	Profile Profile
	// CheckTimeout bounds porcupine.
	CheckTimeout time.Duration
}

// Report is what a run did and what its validation found.
type Report struct {
	Seed                        int64
	Operations, Unknown, Failed int
	Kinds                       string
	Faults                      []string
	Events, Sessions            int
	FinalRev                    int64
	Linearizable                porcupine.CheckResult
	// Unresolved: writes of unknown outcome left so after the watchers' events were read.
	Unresolved int
	Violations []string
	history    []porcupine.Operation
	// patched: the history with the writes of unknown outcome resolved (patch).
	patched     []porcupine.Operation
	lists       []pagedList
	compactions []compaction
	leases      map[int64]*leaseRec
	// Expired: short leases seen to expire (their keys deleted by no client's call).
	Expired int
	// Lists at a past revision checked, and of them answered "compacted".
	Lists, ListsCompacted int
	watchers              []*watcher
	// wc: what the watch check found (the store at every revision, for checkKV).
	wc           *watchCheck
	Elapsed      time.Duration
	checkTime    time.Duration
	checkWindows int
	members      int
	bin          string
	profile      string
}

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// Summary is the report in a few lines.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d members, %s profile, seed %d, %s: %d operations answered (%s), %d of unknown outcome, %d failed with no effect; final revision %d\n",
		filepath.Base(r.bin), r.members, r.profile, r.Seed, r.Elapsed.Round(time.Second), r.Operations, r.Kinds, r.Unknown, r.Failed, r.FinalRev)
	fmt.Fprintf(&b, "faults (%d): %s\n", len(r.Faults), strings.Join(r.Faults, ", "))
	fmt.Fprintf(&b, "lists at a past revision checked: %d (%d of them compacted away); short leases granted %d, seen to expire %d\n",
		r.Lists, r.ListsCompacted, len(r.leases), r.Expired)
	fmt.Fprintf(&b, "watch: %d events in %d sessions checked; linearizability: %s (%s, %d ranges of revisions, %d writes of unknown outcome left); violations: %d\n",
		r.Events, r.Sessions, r.Linearizable, r.checkTime.Round(time.Millisecond), r.checkWindows, r.Unresolved, len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  VIOLATION: %s\n", v)
	}
	return b.String()
}

// Failpoints are kvd's crash points the "failpoint" fault arms: around the save of raft's
// Ready to the WAL (etcd's raftBeforeSave/raftAfterSave) and its fsync, around applying
// committed entries, around saving and applying a snapshot and sending one, and inside the
// data file's commit (etcd's beforeCommit: before the data pages are synced, before the meta
// page is written).
var Failpoints = []string{
	"wal_before_save", "wal_after_save", "wal_fsync",
	"raft_before_apply", "raft_after_apply",
	"raft_snapshot_save", "raft_snapshot_apply",
	"raft_before_snapshot_send", "raft_after_snapshot_send",
	"pager::before_data_sync", "pager::before_meta_write",
}

// Faults are the faults a run can inject, by name. Each returns what it did, once every
// change it made is undone.
var Faults = map[string]func(f *faulter) string{
	"kill": func(f *faulter) string {
		i := f.target()
		f.c.Members[i].P.Kill()
		f.sleep(500*time.Millisecond, 2*time.Second)
		f.c.Members[i].P.Start()
		return fmt.Sprintf("kill m%d", i)
	},
	// A member removed, its data deleted, and added back as a new member: it catches up from
	// the others.
	"replace": func(f *faulter) string {
		i := f.target()
		if err := f.c.Replace(i); err != nil {
			return fmt.Sprintf("replace m%d: %v", i, err)
		}
		return fmt.Sprintf("replace m%d", i)
	},
	// A member restarted with a failpoint armed, dying (abort) at its n-th pass there, as a
	// crash at that point of its code would; then started without. kvd built with
	// --features failpoints only.
	"failpoint": func(f *faulter) string {
		if !f.failpoints {
			return "failpoint: the binary has none"
		}
		i := f.target()
		fp := Failpoints[f.rng.Intn(len(Failpoints))]
		n := 1 + f.rng.Intn(200)
		p := f.c.Members[i].P
		p.Kill()
		p.SetEnv(fmt.Sprintf("FAILPOINTS=%s=%d*off->panic", fp, n))
		p.Start()
		hit := p.Wait(10 * time.Second)
		p.SetEnv()
		p.Kill()
		p.Start()
		if !hit {
			return fmt.Sprintf("failpoint %s (pass %d) on m%d: not reached in 10 s", fp, n, i)
		}
		return fmt.Sprintf("failpoint %s (pass %d) on m%d", fp, n, i)
	},
	// A member's space runs out: restarted with a quota below its data file's size, the
	// first write through it raises NOSPACE and the cluster refuses writes; then restarted
	// with none and the alarm cleared, as an operator would once the disk has room.
	"nospace": func(f *faulter) string {
		i := f.target()
		p := f.c.Members[i].P
		args := p.Args()
		p.Kill()
		p.SetArgs(append(append([]string(nil), args...), "--quota-backend-bytes=4096")...)
		p.Start()
		// A lease grant through it (which, granted, changes no key): the quota refuses it and
		// raises the alarm, as any write through the member would.
		raised := false
		if cl, err := harness.Client(time.Second, f.c.Members[i].Direct); err == nil {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !raised; {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := cl.Grant(ctx, 60)
				cancel()
				raised = err != nil && strings.Contains(err.Error(), "database space exceeded")
				if !raised {
					time.Sleep(200 * time.Millisecond)
				}
			}
			cl.Close()
		}
		p.Kill()
		p.SetArgs(args...)
		p.Start()
		cl, err := f.admin()
		if err != nil {
			return fmt.Sprintf("nospace m%d: %v", i, err)
		}
		defer cl.Close()
		err = harness.Retry(func(ctx context.Context) error { _, err := cl.AlarmDisarm(ctx, &clientv3.AlarmMember{}); return err })
		if err != nil {
			return fmt.Sprintf("nospace m%d: disarm: %v", i, err)
		}
		if !raised {
			return fmt.Sprintf("nospace m%d: the quota refused nothing in 10 s", i)
		}
		return fmt.Sprintf("nospace m%d", i)
	},
	"pause": func(f *faulter) string {
		i := f.target()
		f.c.Members[i].P.Signal(syscall.SIGSTOP)
		d := f.sleep(500*time.Millisecond, 3*time.Second)
		f.c.Members[i].P.Signal(syscall.SIGCONT)
		return fmt.Sprintf("pause m%d %s", i, d.Round(time.Millisecond))
	},
	"isolate": func(f *faulter) string {
		i := f.target()
		f.c.Isolate(i)
		d := f.sleep(time.Second, 4*time.Second)
		f.c.Rejoin(i)
		return fmt.Sprintf("isolate m%d %s", i, d.Round(time.Millisecond))
	},
	"oneway": func(f *faulter) string {
		i := f.target()
		for j := range f.c.Members {
			if j != i {
				f.c.Block(i, j)
			}
		}
		d := f.sleep(time.Second, 4*time.Second)
		for j := range f.c.Members {
			if j != i {
				f.c.Unblock(i, j)
			}
		}
		return fmt.Sprintf("drop m%d's messages %s", i, d.Round(time.Millisecond))
	},
	"client-cut": func(f *faulter) string {
		i := f.target()
		f.c.Members[i].ClientFwd.SetCut(true)
		d := f.sleep(500*time.Millisecond, 2*time.Second)
		f.c.Members[i].ClientFwd.SetCut(false)
		return fmt.Sprintf("cut m%d's clients %s", i, d.Round(time.Millisecond))
	},
	"transfer": func(f *faulter) string {
		l := f.c.Leader()
		to := f.rng.Intn(len(f.c.Members))
		if to == l {
			to = (to + 1) % len(f.c.Members)
		}
		if err := f.c.MoveLeader(to); err != nil {
			return fmt.Sprintf("move leader m%d -> m%d: %v", l, to, err)
		}
		return fmt.Sprintf("move leader m%d -> m%d", l, to)
	},
	"compact-defrag": func(f *faulter) string {
		i := f.rng.Intn(len(f.c.Members))
		cl, err := f.admin()
		if err != nil {
			return fmt.Sprintf("compact: %v", err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := cl.Get(ctx, "ready")
		if err != nil {
			return fmt.Sprintf("compact: %v", err)
		}
		// Far enough behind that watchers resuming after a fault are not compacted.
		rev := g.Header.Revision - 2000
		out := "defragment"
		if rev > 1 {
			call := f.rec.now()
			if _, err := cl.Compact(ctx, rev); err != nil && !strings.Contains(err.Error(), "compacted") {
				return fmt.Sprintf("compact %d: %v", rev, err)
			}
			f.rec.compacted(rev, call)
			out = fmt.Sprintf("compact %d, defragment", rev)
		}
		if _, err := cl.Defragment(ctx, f.c.Members[i].Client); err != nil {
			return fmt.Sprintf("%s m%d: %v", out, i, err)
		}
		return fmt.Sprintf("%s m%d", out, i)
	},
}

// The faults that need more than one member.
var clusterOnly = map[string]bool{"isolate": true, "oneway": true, "transfer": true, "replace": true, "pair": true}

func init() {
	// Two faults at once (a map entry can name Faults only once it exists).
	Faults["pair"] = pair
}

// faulter injects faults into one cluster.
type faulter struct {
	c   *harness.Cluster
	rng *rand.Rand
	rec *recorder
	// failpoints: the binary has kvd's failpoints compiled in.
	failpoints bool
	// fixed: the member a fault of a pair targets.
	fixed *int
}

// Pairable are the faults "pair" combines: two at once, on two members.
var Pairable = []string{"kill", "pause", "isolate", "oneway", "client-cut"}

// pair injects two faults at once on two different members (the leader one time in two),
// each with its own randomness; what both did.
func pair(f *faulter) string {
	n := len(f.c.Members)
	a, b := Pairable[f.rng.Intn(len(Pairable))], Pairable[f.rng.Intn(len(Pairable))]
	i := f.target()
	j := (i + 1 + f.rng.Intn(n-1)) % n
	var out [2]string
	var wg sync.WaitGroup
	for k, x := range []struct {
		name string
		at   int
	}{{a, i}, {b, j}} {
		sub := &faulter{c: f.c, rng: rand.New(rand.NewSource(f.rng.Int63())), rec: f.rec, fixed: &x.at}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[k] = Faults[x.name](sub)
		}()
	}
	wg.Wait()
	return out[0] + " + " + out[1]
}

// hasFailpoints: bin is kvd built with --features failpoints (its failpoints' names are in it).
func hasFailpoints(bin string) bool {
	b, err := os.ReadFile(bin)
	return err == nil && bytes.Contains(b, []byte("raft_before_snapshot_send"))
}

// target is the member a pair gave this fault, or else the leader half the time and
// another member otherwise.
func (f *faulter) target() int {
	if f.fixed != nil {
		return *f.fixed
	}
	if l := f.c.Leader(); l >= 0 && f.rng.Intn(2) == 0 {
		return l
	}
	return f.rng.Intn(len(f.c.Members))
}

func (f *faulter) sleep(lo, hi time.Duration) time.Duration {
	d := lo + time.Duration(f.rng.Int63n(int64(hi-lo)))
	time.Sleep(d)
	return d
}

func (f *faulter) admin() (*clientv3.Client, error) { return admin(f.c) }

// admin is a client of every member, bypassing the forwarders.
func admin(c *harness.Cluster) (*clientv3.Client, error) {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Direct)
	}
	return harness.Client(2*time.Second, eps...)
}

// healthy waits until every member answers a linearizable read, for at most d.
func (f *faulter) healthy(d time.Duration) error {
	deadline := time.Now().Add(d)
	for _, m := range f.c.Members {
		cl, err := harness.Client(time.Second, m.Direct)
		if err != nil {
			return err
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = cl.Get(ctx, "ready")
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				return fmt.Errorf("%s: %v", m.Name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		cl.Close()
	}
	return nil
}

// Run starts a cluster, runs traffic and faults for the configured time, and validates what
// it recorded.
func Run(tb harness.TB, cfg Config) *Report {
	if cfg.CheckTimeout == 0 {
		cfg.CheckTimeout = 5 * time.Minute
	}
	if cfg.Profile.Name == "" {
		cfg.Profile = Etcd
	}
	rep := &Report{Seed: cfg.Seed, members: cfg.Members, bin: cfg.Bin, profile: cfg.Profile.Name}
	began := time.Now()
	c := harness.StartCluster(tb, cfg.Dir, harness.Options{
		Bin: cfg.Bin, Members: cfg.Members, ForwardClients: true, ForwardPeers: true, Token: fmt.Sprintf("robustness-%d", cfg.Seed),
		// The leader compares the members' hashes all along: a false alarm (or a true one)
		// raises CORRUPT, which checkEnd reports.
		Extra: []string{"--corrupt-check-time=" + CorruptCheckTime.String()},
	})
	f := &faulter{c: c, rng: rand.New(rand.NewSource(cfg.Seed)), failpoints: hasFailpoints(cfg.Bin)}
	if err := f.healthy(30 * time.Second); err != nil {
		tb.Fatalf("the cluster did not start: %v", err)
	}
	var addrs []string
	for _, m := range c.Members {
		addrs = append(addrs, m.Addr())
	}
	r := newRecorder()
	f.rec = r
	stopTraffic, stopWatch := make(chan struct{}), make(chan struct{})
	var ws []*watcher
	var wwg sync.WaitGroup
	for i := 0; i < cfg.Watchers; i++ {
		w := &watcher{id: i, clock: r.now}
		ws = append(ws, w)
		wwg.Add(1)
		go w.run(addrs, stopWatch, &wwg)
	}
	if cfg.Profile.Kubernetes {
		// A watcher of each resource, from a recent revision (as a reflector watches from the
		// revision of its list), beside those of every key; and the compactor.
		for i, res := range Resources {
			w := &watcher{id: cfg.Watchers + i, clock: r.now, prefix: res}
			ws = append(ws, w)
			wwg.Add(1)
			go func() {
				time.Sleep(2 * time.Second)
				w.from = max(leaderRevision(c)-20, 1)
				w.run(addrs, stopWatch, &wwg)
			}()
		}
		wwg.Add(1)
		go compactor(c, r, ws[:cfg.Watchers], stopTraffic, &wwg)
	}
	wait, err := traffic(r, addrs, cfg.Clients, cfg.Profile.Mix, cfg.Seed, stopTraffic)
	if err != nil {
		tb.Fatalf("traffic: %v", err)
	}
	var faults []string
	for _, name := range cfg.Faults {
		if (cfg.Members > 1 || !clusterOnly[name]) && (name != "failpoint" || f.failpoints) {
			faults = append(faults, name)
		}
	}
	sort.Strings(faults)
	time.Sleep(time.Second)
	for len(faults) > 0 && time.Since(began) < cfg.Duration {
		name := faults[f.rng.Intn(len(faults))]
		did := Faults[name](f)
		rep.Faults = append(rep.Faults, did)
		tb.Logf("%s: %s", time.Since(began).Round(time.Millisecond), did)
		if err := f.healthy(30 * time.Second); err != nil {
			rep.violate("after %q the cluster did not recover within 30 s: %v", did, err)
			break
		}
		f.sleep(500*time.Millisecond, 1500*time.Millisecond)
	}
	if rem := cfg.Duration - time.Since(began); len(faults) == 0 && rem > 0 {
		time.Sleep(rem)
	}
	close(stopTraffic)
	wait()
	tb.Logf("%s: traffic stopped", time.Since(began).Round(time.Millisecond))
	// The short leases expire by themselves: the last revision is after the last of them (a
	// leader revokes expired leases within a second or so).
	if d := time.Until(r.leasesGone()); d > -3*time.Second {
		time.Sleep(d + 3*time.Second)
	}

	// The end: every member at the last revision, every watcher caught up to it.
	if err := f.healthy(30 * time.Second); err != nil {
		rep.violate("at the end the cluster did not answer within 30 s: %v", err)
	}
	rep.FinalRev = finalRevision(c)
	for i, m := range c.Members {
		if exited, how := m.P.Exited(); exited {
			rep.violate("m%d %s on its own:\n%s", i, how, m.P.Tail())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, w := range ws {
		for !w.caughtUp(rep.FinalRev) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if !w.caughtUp(rep.FinalRev) {
			rep.violate("watcher %d (%s) did not reach revision %d within 30 s (it has seen %d)", w.id, w.keys(), rep.FinalRev, w.seenTo())
		}
	}
	close(stopWatch)
	wwg.Wait()
	tb.Logf("%s: watchers stopped at revision %d; checking", time.Since(began).Round(time.Millisecond), rep.FinalRev)

	rep.history = r.history()
	r.mu.Lock()
	rep.lists, rep.compactions = r.lists, r.compactions
	// A copy: keep-alives may still be running (a renewal missed here only makes the check
	// of early expiry less strict).
	rep.leases = map[int64]*leaseRec{}
	for id, l := range r.leases {
		c := *l
		rep.leases[id] = &c
	}
	r.mu.Unlock()
	rep.watchers = ws
	rep.Operations, rep.Unknown, rep.Failed, rep.Kinds = r.ok, r.unknown, r.failed, r.kindCounts()
	rep.Elapsed = time.Since(began)
	rep.validate(cfg, c)
	return rep
}

// finalRevision is the cluster's revision once every member has applied it.
func finalRevision(c *harness.Cluster) int64 {
	rev := leaderRevision(c)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		behind := false
		for _, s := range c.Status() {
			if s == nil || s.Header.Revision < rev {
				behind = true
			}
		}
		if !behind {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return rev
}

// validate checks the recorded histories and the members' final state.
func (rep *Report) validate(cfg Config, c *harness.Cluster) {
	wc := checkWatches(rep.watchers, rep.FinalRev, rep.history, rep.lists, rep.compactions)
	rep.wc = wc
	rep.Events = wc.events
	rep.Lists, rep.ListsCompacted = wc.lists, wc.listsCompacted
	for _, w := range rep.watchers {
		rep.Sessions += len(w.sessions)
	}
	for _, v := range wc.violations {
		rep.violate("watch: %s", v)
	}
	if !wc.complete {
		rep.violate("watch: the events seen do not cover every revision to %d", rep.FinalRev)
	}
	t0 := time.Now()
	before := len(wc.violations)
	hist := patch(rep.history, wc, rep.leases)
	rep.patched = hist
	for _, v := range wc.violations[before:] {
		rep.violate("leases: %s", v)
	}
	rep.Expired = wc.expired
	for _, op := range hist {
		if op.Output.(output).unknown {
			rep.Unresolved++
		}
	}
	kc := checkKV(hist, wc, cfg.CheckTimeout)
	res := kc.result
	rep.checkTime, rep.checkWindows = time.Since(t0), kc.windows
	rep.Linearizable = res
	if res != porcupine.Ok {
		path := filepath.Join(cfg.Dir, "history.html")
		switch {
		case kc.why != "":
			rep.violate("the KV history is not linearizable: %s", kc.why)
		case res == porcupine.Illegal:
			// The verbose check (which keeps what the drawing needs) is far slower: it runs
			// only to draw the piece found wrong.
			rep.violate("the KV history is Illegal (porcupine; the range of revisions found so drawn in %s)", path)
			_, info := porcupine.CheckOperationsVerbose(kc.badModel, kc.bad, cfg.CheckTimeout)
			porcupine.VisualizePath(kc.badModel, info, path)
		default:
			rep.violate("the KV history is %s (porcupine ran out of time)", res)
		}
		// The events every revision brought, beside the drawing.
		var b strings.Builder
		revs := make([]int64, 0, len(wc.union))
		for r := range wc.union {
			revs = append(revs, r)
		}
		sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
		for _, r := range revs {
			fmt.Fprintf(&b, "%d %v\n", r, wc.union[r])
		}
		os.WriteFile(filepath.Join(cfg.Dir, "events.txt"), []byte(b.String()), 0o644)
	}
	rep.checkEnd(c, wc)
}

// CorruptCheckTime is the members' --corrupt-check-time.
const CorruptCheckTime = 3 * time.Second

// Profile is a kind of traffic.
type Profile struct {
	Name string
	Mix  Mix
	// Kubernetes: watchers of each resource from a recent revision, and compaction every few
	// seconds.
	Kubernetes bool
}

var (
	// Etcd is etcd's users: reads and writes of every kind, with leases.
	Etcd = Profile{Name: "etcd", Mix: EtcdMix}
	// Kubernetes is an API server's: optimistic-concurrency updates (transactions on a key's
	// mod revision), paginated lists at a revision, objects stored with leases, watches of
	// each resource from a revision, compaction every few seconds.
	Kubernetes = Profile{Name: "kubernetes", Mix: KubernetesMix, Kubernetes: true}
	// Profiles by name.
	Profiles = map[string]Profile{Etcd.Name: Etcd, Kubernetes.Name: Kubernetes}
)

// CompactEvery is the Kubernetes profile's compaction period.
const CompactEvery = 3 * time.Second

// compactor compacts every CompactEvery to the revision it saw the time before, as Kubernetes'
// compactor does (every 5 minutes there) — but never past what every watcher of all keys has
// seen, so that their events cover every revision for the checks.
func compactor(c *harness.Cluster, r *recorder, all []*watcher, stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	var prev int64
	for {
		select {
		case <-stop:
			return
		case <-time.After(CompactEvery):
		}
		now := leaderRevision(c)
		rev := prev
		for _, w := range all {
			rev = min(rev, w.seenTo())
		}
		prev = now
		if rev <= 1 {
			continue
		}
		cl, err := admin(c)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		call := r.now()
		_, err = cl.Compact(ctx, rev)
		cancel()
		cl.Close()
		// A compaction that failed may still have been applied: recorded either way (the
		// record only lets lists at older revisions answer "compacted").
		if err == nil || !strings.Contains(err.Error(), "compacted") {
			r.compacted(rev, call)
		}
	}
}

// leaderRevision is the leader's revision (0 if no leader answers within 5 s).
func leaderRevision(c *harness.Cluster) int64 {
	for i := 0; i < 50; i++ {
		for _, s := range c.Status() {
			if s != nil && s.Leader == s.Header.MemberId {
				return s.Header.Revision
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0
}

// checkEnd compares the members: no alarm raised, the same hash of the store at the final
// revision, and the same keys as the watchers' replay.
func (rep *Report) checkEnd(c *harness.Cluster, wc *watchCheck) {
	if alarms, err := c.Alarms(0); err != nil {
		rep.violate("the alarms: %v", err)
	} else if len(alarms) > 0 {
		rep.violate("alarms raised: %s", alarms)
	}
	var first *pb.HashKVResponse
	for i := range c.Members {
		h, err := c.HashKV(i, rep.FinalRev)
		if err != nil {
			rep.violate("HashKV of m%d at %d: %v", i, rep.FinalRev, err)
			continue
		}
		if first == nil {
			first = h
		} else if h.Hash != first.Hash || h.CompactRevision != first.CompactRevision {
			rep.violate("m%d's HashKV at %d is %d (compacted at %d), m0's %d (at %d)", i, rep.FinalRev, h.Hash, h.CompactRevision, first.Hash, first.CompactRevision)
		}
		cl, err := harness.Client(time.Second, c.Members[i].Direct)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cl.Get(ctx, Prefix, clientv3.WithPrefix(), clientv3.WithSerializable(), clientv3.WithRev(rep.FinalRev))
		cancel()
		cl.Close()
		if err != nil {
			rep.violate("m%d's keys at %d: %v", i, rep.FinalRev, err)
			continue
		}
		var got state
		got.rev = rep.FinalRev
		for _, x := range resp.Kvs {
			if k := keyIndex(string(x.Key)); k >= 0 {
				got.kvs[k] = fromPB(x)
			}
		}
		if wc.complete && got != wc.final {
			rep.violate("m%d holds %s; the events replay to %s", i, got, wc.final)
		}
	}
}
