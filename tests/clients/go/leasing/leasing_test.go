// Linearizability of kvd's leasing proxy, checked by porcupine over recorded histories: three
// kvd members, two leasing proxies in front of them, three clients through each proxy
// reading and writing a few keys they all share (so that keys change hands all the time), in
// runs with no fault and with faults on the proxies (SIGKILL, SIGSTOP, partitions from every
// member, each for longer and shorter than the session TTL) and on the members.
//
// Run by crates/kvd/tests/go_client.rs with KVD_LEASING_BIN set to the kvd binary.
package leasing

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"kvd.test/clients/go/internal/harness"
)

// The proxies' session TTL: short, so that faults past it fit in a short run.
const ttl = 3 * time.Second

func kvdBin(t *testing.T) string {
	b := os.Getenv("KVD_LEASING_BIN")
	if b == "" {
		t.Skip("KVD_LEASING_BIN is not set: run through crates/kvd/tests/go_client.rs")
	}
	return b
}

// The proxies take keys back soon after they gave them up, so that keys change hands often.
func proxyFlags() []string {
	return []string{
		"--experimental-leasing-prefix=_lease/",
		fmt.Sprintf("--leasing-ttl=%s", ttl),
		"--leasing-revoke-backoff=200ms",
	}
}

type scenario struct {
	name string
	// fault runs while the clients do; it returns once every fault it made is over.
	fault func(t *testing.T)
}

func TestLeasingProxiesAreLinearizableUnderFaults(t *testing.T) {
	kvd := kvdBin(t)
	dir := t.TempDir()
	ms := startCluster(t, dir, kvd, 3)
	a := startProxy(t, dir, "proxy-a", kvd, ms, proxyFlags()...)
	b := startProxy(t, dir, "proxy-b", kvd, ms, proxyFlags()...)
	pause := func(px *proxy, d time.Duration) func(*testing.T) {
		return func(*testing.T) {
			px.p.Signal(syscall.SIGSTOP)
			time.Sleep(d)
			px.p.Signal(syscall.SIGCONT)
		}
	}
	cut := func(px *proxy, d time.Duration) func(*testing.T) {
		return func(*testing.T) {
			px.cut(true)
			time.Sleep(d)
			px.cut(false)
		}
	}
	slow := func(px *proxy, d time.Duration) {
		for _, f := range px.fwd {
			f.Delay.Store(int64(d))
		}
	}
	scenarios := []scenario{
		{"no-fault", func(*testing.T) {}},
		// A slow link between one proxy and the cluster widens every window between a
		// write's commit and its answer reaching that proxy, while the other proxy's clients
		// read the cluster quickly.
		{"slow-link", func(*testing.T) {
			slow(a, 8*time.Millisecond)
			time.Sleep(4 * time.Second)
			slow(a, 0)
		}},
		{"kill-proxy", func(t *testing.T) {
			a.p.Kill()
			time.Sleep(time.Second)
			a.p.Start()
		}},
		{"pause-proxy-past-ttl", pause(a, ttl+2*time.Second)},
		{"pause-proxy-within-ttl", pause(b, ttl/2)},
		{"cut-proxy-past-ttl", cut(a, ttl+2*time.Second)},
		{"cut-proxy-within-ttl", cut(b, ttl/2)},
		{"kill-leader", func(t *testing.T) {
			m := ms.Members[max(ms.Leader(), 0)]
			m.P.Kill()
			time.Sleep(2 * time.Second)
			m.P.Start()
		}},
		{"cut-a-proxy-and-pause-the-other", func(t *testing.T) {
			a.cut(true)
			pause(b, ttl+time.Second)(t)
			a.cut(false)
		}},
	}
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			// Keys every client writes (they change hands between the proxies all the
			// time), and keys only one proxy's clients write (its own writes keep them
			// held, while the other proxy's clients read them from the cluster).
			key := func(kind string, k int) string { return fmt.Sprintf("s%d/%s%d", i, kind, k) }
			var shared, onlyA, onlyB []string
			for k := 0; k < 3; k++ {
				shared = append(shared, key("shared", k))
				onlyA = append(onlyA, key("a", k))
				onlyB = append(onlyB, key("b", k))
			}
			all := append(append(append([]string(nil), shared...), onlyA...), onlyB...)
			loads := []workload{
				{keys: all, writes: append(append([]string(nil), shared...), onlyA...), readShare: 0.85, pause: 5 * time.Millisecond},
				{keys: all, writes: append(append([]string(nil), shared...), onlyB...), readShare: 0.85, pause: 5 * time.Millisecond},
			}
			r := newRecorder()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			id := 0
			for p, px := range []*proxy{a, b} {
				for c := 0; c < 3; c++ {
					wg.Add(1)
					go loads[p].run(id, kvClient(t, px.addr), r, stop, &wg)
					id++
				}
			}
			both := func(m string) int64 { return a.metric(m) + b.metric(m) }
			hits := both("etcd_grpc_proxy_cache_hits_total")
			taken := both("kvd_leasing_acquisitions_total")
			revoked := both("kvd_leasing_revocations_received_total")
			time.Sleep(2 * time.Second)
			sc.fault(t)
			time.Sleep(4 * time.Second)
			close(stop)
			wg.Wait()
			// Every proxy answers again before the next scenario.
			harness.WaitReady(t, a.addr, a.p)
			harness.WaitReady(t, b.addr, b.p)
			// A restarted proxy counts from 0 again.
			since := func(m string, before int64) int64 { return max(both(m)-before, 0) }
			hits = since("etcd_grpc_proxy_cache_hits_total", hits)
			taken = since("kvd_leasing_acquisitions_total", taken)
			revoked = since("kvd_leasing_revocations_received_total", revoked)
			t.Logf("%s: %d reads answered from a cache, %d keys taken, %d revocations", sc.name, hits, taken, revoked)
			if res := r.check(t, dir, sc.name); res != porcupine.Ok {
				t.Errorf("%s: the history is not linearizable (%s)\nproxy-a:\n%s\nproxy-b:\n%s",
					sc.name, res, a.p.Tail(), b.p.Tail())
			}
			if sc.name == "no-fault" && (hits == 0 || revoked == 0) {
				t.Errorf("no-fault: %d hits and %d revocations: the run did not exercise the leasing protocol", hits, revoked)
			}
		})
	}
}

// The checker is seen to fail on a stale read: a proxy holds a key, is cut off from the
// cluster, and a client writes the key straight to the cluster (bypassing the leasing
// protocol, which the proxy's guarantee does not cover); the proxy then answers from its
// cache with the old value, and porcupine must say so.
func TestTheCheckerCatchesAStaleReadFromAProxy(t *testing.T) {
	kvd := kvdBin(t)
	dir := t.TempDir()
	ms := startCluster(t, dir, kvd, 1)
	px := startProxy(t, dir, "proxy", kvd, ms, "--experimental-leasing-prefix=_lease/", "--leasing-ttl=20s")
	viaProxy := kvClient(t, px.addr)
	direct := kvClient(t, ms.Members[0].Addr())
	r := newRecorder()
	r.do(0, viaProxy, input{op: opPut, key: "k", value: "v1"})
	r.do(0, viaProxy, input{op: opGet, key: "k"})
	// Held once its leasing key is in the cluster.
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, err := direct.Range(context.Background(), &pb.RangeRequest{Key: []byte("_lease/k")})
		if err == nil && len(held.Kvs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not take the key:\n%s", px.p.Tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	px.cut(true)
	r.do(1, direct, input{op: opPut, key: "k", value: "v2"})
	r.do(0, viaProxy, input{op: opGet, key: "k"})
	px.cut(false)
	last := r.ops[len(r.ops)-1]
	if o := last.Output.(output); len(r.ops) != 4 || !o.exists || o.value != "v1" {
		t.Fatalf("the proxy did not answer from its cache: %+v\n%s", r.ops, px.p.Tail())
	}
	if res := r.check(t, dir, "stale"); res != porcupine.Illegal {
		t.Fatalf("the checker passed a history with a stale read: %s", res)
	}
}
