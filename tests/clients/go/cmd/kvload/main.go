// kvload drives single-key gRPC KV calls at an endpoint from many clients and prints the
// latency of its reads and writes: reads of random keys among -keys (linearizable, unless
// -serializable), and a share of -writes puts of random keys among them. With -leased, every
// key it puts (and so every key it reads) is attached to a lease: a leasing proxy never holds
// such a key, so each of its reads is a cache miss that the cluster answers.
//
//	go run ./cmd/kvload -endpoint 127.0.0.1:23790 -keys 1000 -writes 0.1 -duration 10s
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"os"
	"sort"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "host:port")
	clients := flag.Int("clients", 10, "concurrent clients")
	conns := flag.Int("conns", 10, "gRPC connections they share")
	keys := flag.Int("keys", 1, "distinct keys")
	writes := flag.Float64("writes", 0, "share of operations that are puts")
	duration := flag.Duration("duration", 10*time.Second, "how long to run")
	leased := flag.Bool("leased", false, "attach every key to a lease (a leasing proxy never holds them)")
	serializable := flag.Bool("serializable", false, "serializable reads")
	prefill := flag.Bool("prefill", true, "put every key once before the run")
	prefix := flag.String("prefix", "kvload/", "the keys' prefix")
	flag.Parse()

	var cs []pb.KVClient
	var lease pb.LeaseClient
	for i := 0; i < *conns; i++ {
		conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Fatal(err)
		}
		cs = append(cs, pb.NewKVClient(conn))
		if lease == nil {
			lease = pb.NewLeaseClient(conn)
		}
	}
	ctx := context.Background()
	var leaseID int64
	if *leased {
		r, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 3600})
		if err != nil {
			log.Fatal(err)
		}
		leaseID = r.ID
	}
	key := func(i int) []byte { return []byte(fmt.Sprintf("%s%06d", *prefix, i)) }
	if *prefill {
		// Every key put once, by all the clients at once.
		var fill sync.WaitGroup
		for c := 0; c < *clients; c++ {
			fill.Add(1)
			go func(c int) {
				defer fill.Done()
				for i := c; i < *keys; i += *clients {
					if _, err := cs[c%len(cs)].Put(ctx, &pb.PutRequest{Key: key(i), Value: []byte("v"), Lease: leaseID}); err != nil {
						log.Fatal(err)
					}
				}
			}(c)
		}
		fill.Wait()
	}
	var mu sync.Mutex
	var reads, puts []time.Duration
	errors := 0
	stop := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			kv := cs[c%len(cs)]
			rng := rand.New(rand.NewSource(int64(c) + time.Now().UnixNano()))
			var r, w []time.Duration
			bad := 0
			for time.Now().Before(stop) {
				k := key(rng.Intn(*keys))
				start := time.Now()
				var err error
				write := rng.Float64() < *writes
				if write {
					_, err = kv.Put(ctx, &pb.PutRequest{Key: k, Value: []byte("v"), Lease: leaseID})
				} else {
					_, err = kv.Range(ctx, &pb.RangeRequest{Key: k, Serializable: *serializable})
				}
				d := time.Since(start)
				switch {
				case err != nil:
					bad++
				case write:
					w = append(w, d)
				default:
					r = append(r, d)
				}
			}
			mu.Lock()
			reads, puts, errors = append(reads, r...), append(puts, w...), errors+bad
			mu.Unlock()
		}(c)
	}
	wg.Wait()
	report("reads", reads, *duration)
	report("writes", puts, *duration)
	if errors > 0 {
		fmt.Printf("errors %d\n", errors)
		os.Exit(1)
	}
}

// report prints one line: what, count, per second, mean, p50, p90, p99 (ms).
func report(what string, ds []time.Duration, over time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))] }
	fmt.Printf("%s count=%d rps=%.0f mean=%.3f p50=%.3f p90=%.3f p99=%.3f\n",
		what, len(ds), float64(len(ds))/over.Seconds(), ms(sum/time.Duration(len(ds))), ms(q(0.5)), ms(q(0.9)), ms(q(0.99)))
}
