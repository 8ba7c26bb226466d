// The workload of the linearizability test, its recorded history and the model porcupine
// checks it against: a register per key (get, put, delete), partitioned by key.
//
// Clients use the raw gRPC KV client, not clientv3: clientv3 retries calls on its own, and a
// put retried after another client's write would look like two puts to the checker.
package leasing

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	opGet = iota
	opPut
	opDelete
)

type input struct {
	op    int
	key   string
	value string
}

type output struct {
	value   string
	exists  bool
	deleted int64
	// unknown: a write whose outcome is not known (it failed in flight): it may have
	// happened at any time after its call.
	unknown bool
}

type state struct {
	value  string
	exists bool
}

var model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range h {
			k := o.Input.(input).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], o)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() interface{} { return state{} },
	Step: func(s, in, out interface{}) (bool, interface{}) {
		st, i, o := s.(state), in.(input), out.(output)
		switch i.op {
		case opGet:
			return o.exists == st.exists && (!st.exists || o.value == st.value), st
		case opPut:
			return true, state{value: i.value, exists: true}
		default:
			if o.unknown {
				return true, state{}
			}
			want := int64(0)
			if st.exists {
				want = 1
			}
			return o.deleted == want, state{}
		}
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		switch {
		case i.op == opGet && !o.exists:
			return fmt.Sprintf("get(%s) -> none", i.key)
		case i.op == opGet:
			return fmt.Sprintf("get(%s) -> %s", i.key, o.value)
		case o.unknown && i.op == opPut:
			return fmt.Sprintf("put(%s, %s) -> ?", i.key, i.value)
		case i.op == opPut:
			return fmt.Sprintf("put(%s, %s)", i.key, i.value)
		case o.unknown:
			return fmt.Sprintf("delete(%s) -> ?", i.key)
		default:
			return fmt.Sprintf("delete(%s) -> %d", i.key, o.deleted)
		}
	},
	DescribeState: func(s interface{}) string {
		st := s.(state)
		if !st.exists {
			return "none"
		}
		return st.value
	},
}

// recorder keeps the operations of every client, timed on one monotonic clock.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// Counts, for the test's report.
	ok, failed, unknownWrites int
}

func newRecorder() *recorder { return &recorder{start: time.Now()} }

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) add(client int, in input, call int64, out output, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if out.unknown {
		// It may take effect at any time after its call: its return is after everything.
		ret = 1 << 62
		r.unknownWrites++
	} else {
		r.ok++
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// check runs porcupine over the history; on a failure it writes the visualization next to
// the test's logs and says where.
func (r *recorder) check(t *testing.T, dir, name string) porcupine.CheckResult {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 90*time.Second)
	t.Logf("%s: %d operations (%d answered, %d of unknown outcome; %d failed with no effect): %s",
		name, len(ops), r.ok, r.unknownWrites, r.failed, res)
	if res != porcupine.Ok {
		path := filepath.Join(dir, name+".html")
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			if keep := os.Getenv("KVD_LEASING_KEEP"); keep != "" {
				b, _ := os.ReadFile(path)
				os.WriteFile(filepath.Join(keep, name+".html"), b, 0o644)
			}
			t.Logf("%s: the history is drawn in %s", name, path)
		}
	}
	return res
}

// kvClient is a raw gRPC KV client of one endpoint (no retries).
func kvClient(t *testing.T, addr string) pb.KVClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewKVClient(conn)
}

// workload is what the clients do: random gets of `keys`, and puts and deletes of
// `writes` (a subset), through their endpoints, until `stop` closes.
type workload struct {
	keys      []string
	writes    []string
	readShare float64
	// Pause between a client's operations.
	pause time.Duration
}

// run drives one client through `kv` until stop closes, recording into r.
func (w workload) run(id int, kv pb.KVClient, r *recorder, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	rng := rand.New(rand.NewSource(int64(id)*7919 + time.Now().UnixNano()))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		x := rng.Float64()
		in := input{op: opGet, key: w.keys[rng.Intn(len(w.keys))]}
		key := w.writes[rng.Intn(len(w.writes))]
		switch {
		case x < w.readShare:
		case x < w.readShare+(1-w.readShare)*0.8:
			in = input{op: opPut, key: key, value: fmt.Sprintf("c%d-%d", id, n)}
		default:
			in = input{op: opDelete, key: key}
		}
		r.do(id, kv, in)
		if w.pause > 0 {
			time.Sleep(time.Duration(rng.Int63n(int64(w.pause))))
		}
	}
}

// do runs one operation and records it: a read that fails is left out (it took no effect);
// a write that fails is of unknown outcome.
func (r *recorder) do(id int, kv pb.KVClient, in input) {
	timeout := 2 * time.Second
	if in.op != opGet {
		// Long enough for a revocation from a holder that died to end with its lease.
		timeout = 8 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	call := r.now()
	var out output
	var err error
	switch in.op {
	case opGet:
		var resp *pb.RangeResponse
		resp, err = kv.Range(ctx, &pb.RangeRequest{Key: []byte(in.key)})
		if err == nil && len(resp.Kvs) > 0 {
			out = output{value: string(resp.Kvs[0].Value), exists: true}
		}
	case opPut:
		_, err = kv.Put(ctx, &pb.PutRequest{Key: []byte(in.key), Value: []byte(in.value)})
	default:
		var resp *pb.DeleteRangeResponse
		resp, err = kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(in.key)})
		if err == nil {
			out.deleted = resp.Deleted
		}
	}
	ret := r.now()
	if err != nil {
		// A read that failed took no effect; nor did a write whose connection was never made.
		if in.op == opGet || neverSent(err) {
			r.mu.Lock()
			r.failed++
			r.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			return
		}
		out = output{unknown: true}
	}
	r.add(id, in, call, out, ret)
}

// neverSent: the call failed before a connection to its endpoint was made.
func neverSent(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && strings.Contains(s.Message(), "connect: connection refused")
}
