// etcd 3.7's RangeStream through Go's clientv3 v3.7.1 (`GetStream`), against etcd 3.7.1 and
// kvd side by side. The Rust test crates/kvd/tests/etcd37.rs starts both (fresh, one member
// each) and a kvd leasing proxy in front of kvd, and runs `go test` here with ETCD_ENDPOINT,
// KVD_ENDPOINT and KVD_PROXY_ENDPOINT set.
package clients37

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

func endpoint(t *testing.T, name string) string {
	ep := os.Getenv(name)
	if ep == "" {
		t.Skipf("%s is not set: run through crates/kvd/tests/etcd37.rs", name)
	}
	return ep
}

func dial(t *testing.T, ep, user, password string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{ep},
		DialTimeout: 5 * time.Second,
		Username:    user,
		Password:    password,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// The revisions load noted: after the first writes, the compaction, and the end.
type revs struct{ early, compacted, end int64 }

// load writes the same history to a fresh server: small keys, overwritten and deleted ones,
// a leased key, 40 values of 400 KB (chunks over twice etcd's target size), a compaction.
func load(t *testing.T, c *clientv3.Client) revs {
	x := ctx(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Grant(x, 600)
	if err != nil {
		t.Fatal(err)
	}
	must(c.Put(x, "s/leased", "v", clientv3.WithLease(l.ID)))
	for i := range 200 {
		must(c.Put(x, fmt.Sprintf("k/%03d", i), fmt.Sprintf("v-%d", i)))
	}
	var r revs
	resp, err := c.Get(x, "one")
	if err != nil {
		t.Fatal(err)
	}
	r.early = resp.Header.Revision
	for i := range 50 {
		must(c.Put(x, fmt.Sprintf("k/%03d", i), fmt.Sprintf("w-%d", i)))
	}
	must(c.Delete(x, "k/150", clientv3.WithRange("k/160")))
	big := strings.Repeat("x", 400*1024)
	for i := range 40 {
		must(c.Put(x, fmt.Sprintf("b/%03d", i), fmt.Sprintf("%d%s", i, big)))
	}
	resp, err = c.Get(x, "one")
	if err != nil {
		t.Fatal(err)
	}
	r.compacted = resp.Header.Revision
	must(c.Compact(x, r.compacted-30))
	for i := 200; i < 220; i++ {
		must(c.Put(x, fmt.Sprintf("k/%03d", i), fmt.Sprintf("v-%d", i)))
	}
	must(c.Put(x, "one", "1"))
	resp, err = c.Get(x, "one")
	if err != nil {
		t.Fatal(err)
	}
	r.end = resp.Header.Revision
	return r
}

// answer is a RangeStream call as a client sees it: the merged response (its ids cleared,
// leases reduced to whether there is one), the keys in each chunk, or the error.
type answer struct {
	resp   *pb.RangeResponse
	chunks []int
	err    string
}

func normalize(resp *pb.RangeResponse) *pb.RangeResponse {
	if resp == nil {
		return nil
	}
	out := &pb.RangeResponse{More: resp.More, Count: resp.Count}
	if resp.Header != nil {
		out.Header = &pb.ResponseHeader{Revision: resp.Header.Revision}
	}
	for _, kv := range resp.Kvs {
		n := proto.Clone(kv).(*mvccpb.KeyValue)
		if n.Lease != 0 {
			n.Lease = 1
		}
		out.Kvs = append(out.Kvs, n)
	}
	return out
}

func stream(t *testing.T, c *clientv3.Client, key string, opts ...clientv3.OpOption) answer {
	x := ctx(t)
	ch, err := c.GetStream(x, key, opts...)
	if err != nil {
		return answer{err: err.Error()}
	}
	merged := &pb.RangeResponse{}
	var chunks []int
	for r := range ch {
		if err := r.Err(); err != nil {
			return answer{err: err.Error(), chunks: chunks}
		}
		chunks = append(chunks, len(r.Kvs))
		merged.Kvs = append(merged.Kvs, r.Kvs...)
		if r.Header != nil {
			merged.Header, merged.More, merged.Count = r.Header, r.More, r.Count
		}
	}
	return answer{resp: normalize(merged), chunks: chunks}
}

func get(t *testing.T, c *clientv3.Client, key string, opts ...clientv3.OpOption) answer {
	resp, err := c.Get(ctx(t), key, opts...)
	if err != nil {
		return answer{err: err.Error()}
	}
	return answer{resp: normalize((*pb.RangeResponse)(resp))}
}

type rangeCase struct {
	name string
	key  string
	opts []clientv3.OpOption
	// Whether Range answers it as RangeStream does (RangeStream refuses sorts and filters).
	rangeToo bool
}

func cases(r revs) []rangeCase {
	c := func(name, key string, rangeToo bool, opts ...clientv3.OpOption) rangeCase {
		return rangeCase{name, key, opts, rangeToo}
	}
	cs := []rangeCase{
		c("prefix", "k/", true, clientv3.WithPrefix()),
		c("keys-only", "k/", true, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		c("keys-only limit 7", "k/", true, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(7)),
		c("count-only", "k/", true, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		c("count-only limit 3", "k/", true, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithLimit(3)),
		c("at an older revision", "k/", true, clientv3.WithPrefix(), clientv3.WithRev(r.compacted-20)),
		c("at a compacted revision", "k/", true, clientv3.WithPrefix(), clientv3.WithRev(r.compacted-31)),
		c("at a future revision", "k/", true, clientv3.WithPrefix(), clientv3.WithRev(r.end+100)),
		c("serializable", "k/", true, clientv3.WithPrefix(), clientv3.WithSerializable()),
		c("a range", "k/010", true, clientv3.WithRange("k/020")),
		c("from a key", "k/190", true, clientv3.WithFromKey()),
		c("every key", "", true, clientv3.WithFromKey()),
		c("one key", "one", true),
		c("a missing key", "nope", true),
		c("a leased key", "s/leased", true),
		c("a leased key, keys only", "s/leased", true, clientv3.WithKeysOnly()),
		c("big values", "b/", true, clientv3.WithPrefix()),
		c("big values, keys only", "b/", true, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		c("big values, limit 3", "b/", true, clientv3.WithPrefix(), clientv3.WithLimit(3)),
		c("sorted by key, ascending", "k/", true, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)),
		c("target value, no order", "k/", false, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortNone), clientv3.WithLimit(30)),
		c("sorted descending", "k/", false, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)),
		c("sorted by mod revision", "k/", false, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend)),
		c("a mod revision filter", "k/", false, clientv3.WithPrefix(), clientv3.WithMinModRev(r.early)),
		c("a create revision filter", "k/", false, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(r.early)),
		c("an empty key", "", false),
	}
	for _, n := range []int64{1, 5, 10, 11, 25, 219, 1000} {
		cs = append(cs, c(fmt.Sprintf("limit %d", n), "k/", true, clientv3.WithPrefix(), clientv3.WithLimit(n)))
	}
	return cs
}

func same(t *testing.T, what string, want, got answer, chunks bool) {
	t.Helper()
	if want.err != got.err || !proto.Equal(want.resp, got.resp) {
		t.Errorf("%s:\n want %s\n  got %s", what, show(want), show(got))
	}
	if chunks && !reflect.DeepEqual(want.chunks, got.chunks) {
		t.Errorf("%s: chunks of %v keys, want %v", what, got.chunks, want.chunks)
	}
}

func show(a answer) string {
	if a.err != "" {
		return "error " + a.err
	}
	keys := make([]string, 0, len(a.resp.Kvs))
	for _, kv := range a.resp.Kvs {
		keys = append(keys, fmt.Sprintf("%s@%d/%d/v%d/l%d/%dB", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, len(kv.Value)))
	}
	return fmt.Sprintf("header %v more %v count %d, %d kvs %v", a.resp.Header, a.resp.More, a.resp.Count, len(keys), keys)
}

// Every option set answers as etcd 3.7.1 answers it: the same keys, values, revisions,
// counts, errors, and the same chunks; and as kvd's own Range answers it.
func TestRangeStreamAnswersAsEtcd(t *testing.T) {
	etcd := dial(t, endpoint(t, "ETCD_ENDPOINT"), "", "")
	kvd := dial(t, endpoint(t, "KVD_ENDPOINT"), "", "")
	re, rk := load(t, etcd), load(t, kvd)
	if re != rk {
		t.Fatalf("the same writes left etcd at %+v, kvd at %+v", re, rk)
	}
	var proxy *clientv3.Client
	if ep := os.Getenv("KVD_PROXY_ENDPOINT"); ep != "" {
		proxy = dial(t, ep, "", "")
	}
	for _, tc := range cases(rk) {
		want := stream(t, etcd, tc.key, tc.opts...)
		got := stream(t, kvd, tc.key, tc.opts...)
		same(t, tc.name+" (etcd, kvd)", want, got, true)
		t.Logf("%s: chunks %v, error %q", tc.name, got.chunks, got.err)
		if tc.rangeToo && got.err == "" {
			same(t, tc.name+" (kvd's Range, its RangeStream)", get(t, kvd, tc.key, tc.opts...), got, false)
		}
		if proxy != nil {
			same(t, tc.name+" (kvd, its proxy)", got, stream(t, proxy, tc.key, tc.opts...), false)
		}
	}
	// Many chunks of small keys: at least one doubled past the first ten.
	if a := stream(t, kvd, "k/", clientv3.WithPrefix()); len(a.chunks) < 3 || a.chunks[0] != 10 || a.chunks[1] != 20 {
		t.Errorf("chunks of k/: %v", a.chunks)
	}
}

// A read-only user: RangeStream checks the range as Range does. AuthStatus answers a caller
// without credentials (etcd 3.7).
func TestRangeStreamChecksPermissions(t *testing.T) {
	var errs [2][2]string
	var status [2]string
	for i, ep := range []string{endpoint(t, "ETCD_ENDPOINT"), endpoint(t, "KVD_ENDPOINT")} {
		root := dial(t, ep, "", "")
		x := ctx(t)
		steps := []func() error{
			func() error { _, err := root.UserAdd(x, "root", "rootpw"); return err },
			func() error { _, err := root.UserGrantRole(x, "root", "root"); return err },
			func() error { _, err := root.RoleAdd(x, "kreader"); return err },
			func() error {
				_, err := root.RoleGrantPermission(x, "kreader", "k/", clientv3.GetPrefixRangeEnd("k/"), clientv3.PermissionType(clientv3.PermRead))
				return err
			},
			func() error { _, err := root.UserAdd(x, "reader", "pw"); return err },
			func() error { _, err := root.UserGrantRole(x, "reader", "kreader"); return err },
			func() error { _, err := root.AuthEnable(x); return err },
		}
		for _, s := range steps {
			if err := s(); err != nil {
				t.Fatal(err)
			}
		}
		reader := dial(t, ep, "reader", "pw")
		ok := stream(t, reader, "k/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if ok.err != "" || len(ok.resp.Kvs) == 0 {
			t.Errorf("%s: the reader's own range: %s", ep, show(ok))
		}
		errs[i][0] = stream(t, reader, "b/", clientv3.WithPrefix()).err
		errs[i][1] = stream(t, reader, "k/", clientv3.WithFromKey()).err
		anon := dial(t, ep, "", "")
		if st, err := anon.AuthStatus(x); err != nil {
			status[i] = err.Error()
		} else {
			status[i] = fmt.Sprintf("enabled %v, revision %d", st.Enabled, st.AuthRevision)
		}
		admin := dial(t, ep, "root", "rootpw")
		if _, err := admin.AuthDisable(x); err != nil {
			t.Fatal(err)
		}
	}
	if errs[0] != errs[1] || errs[1][0] == "" || errs[1][1] == "" {
		t.Errorf("refusals: etcd %q, kvd %q", errs[0], errs[1])
	}
	if status[0] != status[1] || !strings.HasPrefix(status[1], "enabled true") {
		t.Errorf("AuthStatus without credentials: etcd %q, kvd %q", status[0], status[1])
	}
}
