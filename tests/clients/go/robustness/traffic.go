package robustness

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// recorder keeps the operations of every client, timed on one monotonic clock.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// Lists at a past revision (checked against the store the watch events replay to, not by
	// porcupine: what they answer does not depend on when they run), and compactions.
	lists       []pagedList
	compactions []compaction
	// Counts, for the report.
	ok, failed, unknown int
	byKind              [len(kindNames)]int
	// The short leases granted (left to expire), by id, and when the last should be gone.
	leases    map[int64]*leaseRec
	leasesEnd time.Time
}

// leaseRec is a short lease as its client knows it: it cannot expire before `renewed` (the
// call of its grant, or the send of its last acknowledged keep-alive) plus its TTL.
type leaseRec struct {
	ttl           int64
	call, renewed int64
}

func (r *recorder) granted(id, ttl, call int64, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases[id] = &leaseRec{ttl: ttl, call: call, renewed: call}
	if until.After(r.leasesEnd) {
		r.leasesEnd = until
	}
}

// leasesGone: when every short lease granted should have expired (its keep-alives over, its
// TTL run out).
func (r *recorder) leasesGone() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leasesEnd
}

func (r *recorder) renewed(id, sent int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.leases[id]; l != nil {
		l.renewed = max(l.renewed, sent)
	}
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), leases: map[int64]*leaseRec{}}
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

// Never is the return time of a write whose outcome is unknown: it may take effect at any time
// after its call.
const never = int64(1) << 62

func (r *recorder) add(client int, in input, call int64, out output, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if out.unknown {
		ret = never
		r.unknown++
	} else {
		r.ok++
		r.byKind[in.kind]++
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

func (r *recorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// conns is a client's connections, one per member; it uses one until calls to it fail, then
// moves to the next.
type conns struct {
	kv    []pb.KVClient
	lease []pb.LeaseClient
	cc    []*grpc.ClientConn
	home  int
	fails int
}

func dial(addrs []string, home int) (*conns, error) {
	c := &conns{home: home % len(addrs)}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, err
		}
		c.cc = append(c.cc, cc)
		c.kv = append(c.kv, pb.NewKVClient(cc))
		c.lease = append(c.lease, pb.NewLeaseClient(cc))
	}
	return c, nil
}

func (c *conns) close() {
	for _, cc := range c.cc {
		cc.Close()
	}
}

func (c *conns) result(err error) {
	if err == nil {
		c.fails = 0
		return
	}
	if c.fails++; c.fails >= 2 {
		c.home = (c.home + 1) % len(c.kv)
		c.fails = 0
	}
}

// client is one of the traffic's clients: its connections, its leases, and what it last
// read of each key (the mod revision its transactions compare).
type client struct {
	id     int
	c      *conns
	rng    *rand.Rand
	leases []heldLease
	seen   [nKeys]int64
	n      int
	// The highest revision the client has been answered.
	lastRev int64
}

// heldLease is a lease a client attaches keys to: an hour long, or a short one kept alive
// for a while and then left to expire (dropped at `until`, when it should have); a short one
// takes the client's own key first, then shared ones.
type heldLease struct {
	id    int64
	until time.Time
	// used: the client's own key was put on it.
	used bool
}

// Short leases: TTLs of 2 to 5 s (etcd's and kvd's least is 1.5 election timeouts, 2 s here),
// kept alive for up to 6 s, then left to expire.
const (
	shortTTLMin, shortTTLSpan = 2, 4
	maxKeepAlive              = 6 * time.Second
)

// Mix is the share of each kind of operation in the traffic.
type Mix struct {
	Get, List, Put, Delete, Txn, LeasePut, Revoke float64
	// ListAt: a list at a past revision, in pages (as Kubernetes lists).
	ListAt float64
}

// EtcdMix is the etcd profile: reads and writes of every kind, with leases.
var EtcdMix = Mix{Get: 0.3, List: 0.1, Put: 0.2, Delete: 0.08, Txn: 0.2, LeasePut: 0.08, Revoke: 0.04, ListAt: 0.05}

// KubernetesMix is an API server's: mostly optimistic-concurrency updates and creates
// (transactions on the key's mod revision, 0 for a create), paginated lists at a revision,
// objects stored with leases (events), few plain puts and deletes.
var KubernetesMix = Mix{Get: 0.1, List: 0.04, Put: 0.04, Delete: 0.05, Txn: 0.45, LeasePut: 0.1, Revoke: 0.02, ListAt: 0.2}

func (cl *client) next(m Mix) input {
	x := cl.rng.Float64() * (m.Get + m.List + m.Put + m.Delete + m.Txn + m.LeasePut + m.Revoke + m.ListAt)
	if x >= m.Get+m.List+m.Put+m.Delete+m.Txn+m.LeasePut+m.Revoke {
		// A revision the client has seen, or one a little before it; one time in ten any
		// revision since the start (compacted away, once compactions have run).
		back := cl.rng.Int63n(50)
		if cl.rng.Intn(10) == 0 {
			back = cl.rng.Int63n(max(cl.lastRev, 1))
		}
		return input{kind: opListAt, cmpMod: max(cl.lastRev-back, 1), limit: 1 + int64(cl.rng.Intn(3))}
	}
	k := cl.rng.Intn(nShared)
	cl.n++
	value := fmt.Sprintf("c%d-%d", cl.id, cl.n)
	switch {
	case x < m.Get:
		return input{kind: opGet, key: k}
	case x < m.Get+m.List:
		return input{kind: opList, limit: int64(cl.rng.Intn(4))}
	case x < m.Get+m.List+m.Put:
		return input{kind: opPut, key: k, value: value}
	case x < m.Get+m.List+m.Put+m.Delete:
		return input{kind: opDelete, key: k}
	case x < m.Get+m.List+m.Put+m.Delete+m.Txn:
		return input{kind: opTxn, key: k, value: value, cmpMod: cl.seen[k]}
	case x < m.Get+m.List+m.Put+m.Delete+m.Txn+m.LeasePut:
		return input{kind: opPut, key: k, value: value, lease: -1}
	default:
		return input{kind: opRevoke, lease: -1}
	}
}

// do runs one operation and records it. A read that fails took no effect, nor did a write
// refused for a reason that says so; any other failed write is of unknown outcome.
func (cl *client) do(r *recorder, in input) {
	if in.lease == -1 {
		// A put with a lease: grant one first if the client holds none (grants are not
		// in the model: they change no key and no revision). Half are short, left to expire.
		cl.leases = slices.DeleteFunc(cl.leases, func(l heldLease) bool {
			return !l.until.IsZero() && time.Now().After(l.until)
		})
		if len(cl.leases) == 0 {
			if in.kind == opRevoke {
				return
			}
			ttl, hold := int64(3600), time.Duration(0)
			if cl.rng.Intn(2) == 0 {
				ttl = shortTTLMin + cl.rng.Int63n(shortTTLSpan)
				hold = time.Duration(cl.rng.Int63n(int64(maxKeepAlive)))
			}
			lc := cl.c.lease[cl.c.home]
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			call := r.now()
			g, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl})
			cancel()
			cl.c.result(err)
			if err != nil {
				return
			}
			held := heldLease{id: g.ID}
			if ttl < 3600 {
				held.until = time.Now().Add(hold + time.Duration(g.TTL)*time.Second)
				r.granted(g.ID, g.TTL, call, held.until)
				go keepAlive(r, lc, g.ID, g.TTL, hold)
			}
			cl.leases = append(cl.leases, held)
		}
		j := cl.rng.Intn(len(cl.leases))
		if in.kind == opRevoke {
			// Short leases are left to expire: revoke an hour-long one, if any.
			if j = slices.IndexFunc(cl.leases, func(l heldLease) bool { return l.until.IsZero() }); j < 0 {
				return
			}
		}
		in.lease = cl.leases[j].id
		if !cl.leases[j].until.IsZero() && !cl.leases[j].used {
			in.key = nShared + cl.id%(nKeys-nShared)
			cl.leases[j].used = true
		}
	}
	if in.kind == opListAt {
		cl.listAt(r, in.cmpMod, in.limit)
		return
	}
	timeout := 2 * time.Second
	if in.write() {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	kvc := cl.c.kv[cl.c.home]
	key := []byte(keyName(in.key))
	call := r.now()
	var out output
	var err error
	switch in.kind {
	case opGet:
		var resp *pb.RangeResponse
		if resp, err = kvc.Range(ctx, &pb.RangeRequest{Key: key}); err == nil {
			out.rev = resp.Header.Revision
			if len(resp.Kvs) > 0 {
				out.kv = fromPB(resp.Kvs[0])
			}
		}
	case opList:
		var resp *pb.RangeResponse
		if resp, err = kvc.Range(ctx, &pb.RangeRequest{Key: []byte(Prefix), RangeEnd: prefixEnd(Prefix), Limit: in.limit}); err == nil {
			out.rev, out.count, out.more = resp.Header.Revision, resp.Count, resp.More
			for _, x := range resp.Kvs {
				out.kvs = append(out.kvs, fromPB(x))
				out.keys = append(out.keys, keyIndex(string(x.Key)))
			}
		}
	case opPut:
		var resp *pb.PutResponse
		if resp, err = kvc.Put(ctx, &pb.PutRequest{Key: key, Value: []byte(in.value), Lease: in.lease, PrevKv: true}); err == nil {
			out.rev = resp.Header.Revision
			if resp.PrevKv != nil {
				out.kv = fromPB(resp.PrevKv)
			}
		}
	case opDelete:
		var resp *pb.DeleteRangeResponse
		if resp, err = kvc.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: key, PrevKv: true}); err == nil {
			out.rev, out.deleted = resp.Header.Revision, resp.Deleted
			if len(resp.PrevKvs) > 0 {
				out.kv = fromPB(resp.PrevKvs[0])
			}
		}
	case opTxn:
		var resp *pb.TxnResponse
		resp, err = kvc.Txn(ctx, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
				TargetUnion: &pb.Compare_ModRevision{ModRevision: in.cmpMod}}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: []byte(in.value), Lease: in.lease}}}},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key}}}},
		})
		if err == nil {
			out.rev, out.succeeded = resp.Header.Revision, resp.Succeeded
			if !resp.Succeeded && len(resp.Responses) == 1 {
				if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
					out.kv = fromPB(rr.Kvs[0])
				}
			}
		}
	case opRevoke:
		var resp *pb.LeaseRevokeResponse
		if resp, err = cl.c.lease[cl.c.home].LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: in.lease}); err == nil {
			out.rev = resp.Header.Revision
		}
		// Revoked, or of unknown outcome: either way the client lets go of it.
		cl.dropLease(in.lease)
	}
	ret := r.now()
	cl.c.result(err)
	cl.lastRev = max(cl.lastRev, out.rev)
	if err != nil {
		if !in.write() || noEffect(err) {
			if isLeaseGone(err) {
				cl.dropLease(in.lease)
			}
			r.mu.Lock()
			r.failed++
			r.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			return
		}
		out = output{unknown: true}
	}
	switch {
	case out.unknown:
	case in.kind == opGet || (in.kind == opTxn && !out.succeeded):
		cl.seen[in.key] = out.kv.mod
	case in.kind == opPut || in.kind == opTxn:
		cl.seen[in.key] = out.rev
	case in.kind == opDelete:
		cl.seen[in.key] = 0
	}
	r.add(cl.id, in, call, out, ret)
}

func (cl *client) dropLease(id int64) {
	cl.leases = slices.DeleteFunc(cl.leases, func(l heldLease) bool { return l.id == id })
}

// keepAlive renews lease id every third of its TTL for `hold`, then lets it go; each renewal
// acknowledged is recorded with the time its request was sent.
func keepAlive(r *recorder, lc pb.LeaseClient, id, ttl int64, hold time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	stream, err := lc.LeaseKeepAlive(ctx)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(ttl) * time.Second / 3):
		}
		sent := r.now()
		if stream.Send(&pb.LeaseKeepAliveRequest{ID: id}) != nil {
			return
		}
		resp, err := stream.Recv()
		if err != nil || resp.TTL <= 0 {
			return
		}
		r.renewed(id, sent)
	}
}

func fromPB(x *mvccpb.KeyValue) kv {
	return kv{value: string(x.Value), create: x.CreateRevision, mod: x.ModRevision, ver: x.Version, lease: x.Lease}
}

func prefixEnd(p string) []byte {
	b := []byte(p)
	b[len(b)-1]++
	return b
}

// noEffect: the call failed in a way that says it did nothing: never sent, or refused before
// it was proposed.
func noEffect(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	if isLeaseGone(err) {
		return true
	}
	// gRPC sends a call only on a connection whose server preface it has read: a call that
	// failed while its connection was being made (dialing, the handshake), or that timed out
	// waiting for one, was never sent. Not so "connection error: desc = \"error reading from
	// server…\"": gRPC ends the calls in flight on a connection that breaks with that.
	m := s.Message()
	switch s.Code() {
	case codes.Unavailable:
		return strings.Contains(m, "connection refused") || strings.Contains(m, "server preface") ||
			strings.Contains(m, "while dialing")
	case codes.ResourceExhausted:
		// Refused by the quota (NOSPACE): checked before the proposal, and again where
		// entries are applied.
		return strings.Contains(m, "database space exceeded")
	case codes.DeadlineExceeded:
		return strings.Contains(m, "while waiting for connections to become ready") ||
			(strings.HasPrefix(m, "latest balancer error") && !strings.Contains(m, "error reading from server"))
	}
	return false
}

func isLeaseGone(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.NotFound && strings.Contains(s.Message(), "lease not found")
}

// traffic runs `clients` clients over `addrs` until stop closes.
func traffic(r *recorder, addrs []string, clients int, mix Mix, seed int64, stop <-chan struct{}) (func(), error) {
	var wg sync.WaitGroup
	var all []*conns
	for i := 0; i < clients; i++ {
		c, err := dial(addrs, i)
		if err != nil {
			return nil, err
		}
		all = append(all, c)
		cl := &client{id: i, c: c, rng: rand.New(rand.NewSource(seed*1000 + int64(i)))}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cl.do(r, cl.next(mix))
			}
		}()
	}
	return func() {
		wg.Wait()
		for _, c := range all {
			c.close()
		}
	}, nil
}

// kindCounts is the report's line of answered operations by kind.
func (r *recorder) kindCounts() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for k, n := range r.byKind {
		if opKind(k) == opEnd {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d", kindNames[k], n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// pagedList is a list of Prefix at revision rev, in pages of `limit`.
type pagedList struct {
	client int
	rev    int64
	limit  int64
	kvs    []kv
	keys   []int
	// count and more of the first page.
	count int64
	err   string
	ret   int64
}

// compaction is a compaction at rev, called at `call`.
type compaction struct{ rev, call int64 }

func (r *recorder) compacted(rev, call int64) {
	r.mu.Lock()
	r.compactions = append(r.compactions, compaction{rev: rev, call: call})
	r.mu.Unlock()
}

// listAt lists Prefix at revision rev in pages, as Kubernetes' paginated lists do: every page
// at the same revision, each from the key after the last.
func (cl *client) listAt(r *recorder, rev, limit int64) {
	l := pagedList{client: cl.id, rev: rev, limit: limit}
	key := []byte(Prefix)
	for page := 0; ; page++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := cl.c.kv[cl.c.home].Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: prefixEnd(Prefix), Revision: rev, Limit: limit})
		cancel()
		cl.c.result(err)
		if err != nil {
			if s, _ := status.FromError(err); !strings.Contains(s.Message(), "revision") {
				return // not answered: no effect, nothing to check
			}
			l.err = status.Convert(err).Message()
			break
		}
		if page == 0 {
			l.count = resp.Count
		}
		for _, x := range resp.Kvs {
			l.kvs = append(l.kvs, fromPB(x))
			l.keys = append(l.keys, keyIndex(string(x.Key)))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = append(append([]byte(nil), resp.Kvs[len(resp.Kvs)-1].Key...), 0)
	}
	r.mu.Lock()
	l.ret = r.now()
	r.lists = append(r.lists, l)
	r.byKind[opListAt]++
	r.mu.Unlock()
}
