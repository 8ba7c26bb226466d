// Go's clientv3 (etcd v3.6.5) and its concurrency package against a running kvd. The Rust test
// crates/kvd/tests/go_client.rs starts kvd and runs `go test` here with KVD_ENDPOINTS set, and
// again over mutual TLS (KVD_CACERT, KVD_CERT, KVD_KEY) as a user (KVD_USER, KVD_PASSWORD),
// with a user who may not touch the test's keys (KVD_OTHER_USER, user:password).
package clients

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func client(t *testing.T) *clientv3.Client {
	return clientAs(t, os.Getenv("KVD_USER"), os.Getenv("KVD_PASSWORD"))
}

// config: KVD_ENDPOINTS as user (none if ""), over TLS if KVD_CACERT is set.
func config(t *testing.T, user, password string) clientv3.Config {
	eps := os.Getenv("KVD_ENDPOINTS")
	if eps == "" {
		t.Skip("KVD_ENDPOINTS is not set: run through crates/kvd/tests/go_client.rs")
	}
	cfg := clientv3.Config{
		Endpoints:   strings.Split(eps, ","),
		DialTimeout: 5 * time.Second,
		Username:    user,
		Password:    password,
	}
	if ca := os.Getenv("KVD_CACERT"); ca != "" {
		info := transport.TLSInfo{
			TrustedCAFile: ca,
			CertFile:      os.Getenv("KVD_CERT"),
			KeyFile:       os.Getenv("KVD_KEY"),
		}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLS = tlsCfg
	}
	return cfg
}

func clientAs(t *testing.T, user, password string) *clientv3.Client {
	c, err := clientv3.New(config(t, user, password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// With auth on: etcd's typed errors for a wrong password and for a user without the
// permission, while the test's own user writes.
func TestAuthTypedErrors(t *testing.T) {
	other := os.Getenv("KVD_OTHER_USER")
	if other == "" {
		t.Skip("KVD_OTHER_USER is not set: auth is off in this run")
	}
	x := ctx(t)
	name, password, _ := strings.Cut(other, ":")
	if c, err := clientv3.New(config(t, name, password+"-wrong")); !errors.Is(err, rpctypes.ErrAuthFailed) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("wrong password: %v", err)
	}
	c := clientAs(t, name, password)
	if _, err := c.Put(x, "goauth/k", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("put without the permission: %v", err)
	}
	if _, err := c.Get(x, "goauth/k"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("get without the permission: %v", err)
	}
	if _, err := client(t).Put(x, "goauth/k", "v"); err != nil {
		t.Fatal(err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestKVTxnAndErrors(t *testing.T) {
	c, x := client(t), ctx(t)
	put, err := c.Put(x, "go/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(x, "go/b", "2"); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(x, "go/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil || len(got.Kvs) != 2 || string(got.Kvs[0].Key) != "go/b" {
		t.Fatalf("get: %v %v", got, err)
	}
	txn, err := c.Txn(x).
		If(clientv3.Compare(clientv3.ModRevision("go/a"), "=", put.Header.Revision)).
		Then(clientv3.OpPut("go/a", "3"), clientv3.OpGet("go/a")).
		Else(clientv3.OpDelete("go/a")).
		Commit()
	if err != nil || !txn.Succeeded || string(txn.Responses[1].GetResponseRange().Kvs[0].Value) != "3" {
		t.Fatalf("txn: %v %v", txn, err)
	}
	// etcd's typed errors come back as the same Go errors.
	if _, err := c.Get(x, "go/a", clientv3.WithRev(put.Header.Revision+1000)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("future revision: %v", err)
	}
	if _, err := c.Put(x, "", "v"); !errors.Is(err, rpctypes.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := c.Put(x, "go/l", "v", clientv3.WithLease(12345)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("unknown lease: %v", err)
	}
}

func TestWatchAndLease(t *testing.T) {
	c, x := client(t), ctx(t)
	wctx, stop := context.WithCancel(x)
	defer stop()
	wch := c.Watch(wctx, "go/w/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	lease, err := c.Grant(x, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(x, "go/w/k", "v1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(x, "go/w/k", "v2", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ka, err := c.KeepAliveOnce(x, lease.ID)
	if err != nil || ka.TTL != 5 {
		t.Fatalf("keepalive: %v %v", ka, err)
	}
	ttl, err := c.TimeToLive(x, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || len(ttl.Keys) != 1 || ttl.GrantedTTL != 5 {
		t.Fatalf("timetolive: %v %v", ttl, err)
	}
	if _, err := c.Revoke(x, lease.ID); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for len(seen) < 3 {
		select {
		case resp := <-wch:
			for _, ev := range resp.Events {
				prev := ""
				if ev.PrevKv != nil {
					prev = string(ev.PrevKv.Value)
				}
				seen = append(seen, fmt.Sprintf("%s %s %s prev=%s", ev.Type, ev.Kv.Key, ev.Kv.Value, prev))
			}
		case <-x.Done():
			t.Fatalf("watch: only %v", seen)
		}
	}
	want := []string{"PUT go/w/k v1 prev=", "PUT go/w/k v2 prev=v1", "DELETE go/w/k  prev=v2"}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("watch events %q, want %q", seen, want)
		}
	}
}

func TestLeaseExpires(t *testing.T) {
	c, x := client(t), ctx(t)
	lease, err := c.Grant(x, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(x, "go/exp", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := c.Get(x, "go/exp")
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Kvs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the key of an expired lease is still there")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestMutexExcludes(t *testing.T) {
	c, x := client(t), ctx(t)
	var mu sync.Mutex
	inside, max := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := concurrency.NewSession(c, concurrency.WithTTL(5))
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			m := concurrency.NewMutex(s, "go/lock")
			for j := 0; j < 3; j++ {
				if err := m.Lock(x); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				if inside > max {
					max = inside
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				if err := m.Unlock(x); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if max != 1 {
		t.Fatalf("%d holders at once", max)
	}
}

func TestElection(t *testing.T) {
	c, x := client(t), ctx(t)
	s1, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	e1 := concurrency.NewElection(s1, "go/election")
	e2 := concurrency.NewElection(s2, "go/election")
	if err := e1.Campaign(x, "one"); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(x, "two") }()
	time.Sleep(300 * time.Millisecond)
	if l, err := e1.Leader(x); err != nil || string(l.Kvs[0].Value) != "one" {
		t.Fatalf("leader: %v %v", l, err)
	}
	// The first leader's session ends: the second wins.
	s1.Close()
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if l, err := e2.Leader(x); err != nil || string(l.Kvs[0].Value) != "two" {
		t.Fatalf("leader after resign: %v %v", l, err)
	}
}

func TestSTMTransfersConserveTheTotal(t *testing.T) {
	c, x := client(t), ctx(t)
	for _, k := range []string{"go/acct/a", "go/acct/b"} {
		if _, err := c.Put(x, k, "100"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			from, to := "go/acct/a", "go/acct/b"
			if i%2 == 1 {
				from, to = to, from
			}
			_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
				var a, b int
				fmt.Sscan(s.Get(from), &a)
				fmt.Sscan(s.Get(to), &b)
				s.Put(from, fmt.Sprint(a-i))
				s.Put(to, fmt.Sprint(b+i))
				return nil
			}, concurrency.WithAbortContext(x))
			if err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	got, err := c.Get(x, "go/acct/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, kv := range got.Kvs {
		var v int
		fmt.Sscan(string(kv.Value), &v)
		total += v
	}
	if total != 200 {
		t.Fatalf("total %d after transfers, want 200", total)
	}
}
