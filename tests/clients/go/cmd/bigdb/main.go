// bigdb drives a server toward a large, fragmented database and times puts on it: the
// large-database proof's load generator (tests/tools/large-db.sh runs it against kvd and etcd).
//
//	bigdb fill -endpoint 127.0.0.1:2379 -target-bytes 20000000000 -keys 1200000
//
// puts -value-byte values under random keys among -keys, as fast as -clients allow, compacting
// every -compact-every to the revision the previous compaction round saw (so the key space is
// overwritten and compacted as it fills, leaving a large fragmented free list), until the
// server's reported database size reaches -target-bytes.
//
//	bigdb load -endpoint 127.0.0.1:2379 -rate 5000 -clients 100 -duration 20s [-defrag-at 10s]
//
// puts at a steady total -rate from -clients (each waits for its answer before taking the next
// slot, as etcd's benchmark does; latency is from the send), compacting as above, and prints
// count, rate, p50, p99 and max latency. With -defrag-at it asks for an online
// defragmentation at that offset, keeps the load on until the defragmentation has answered,
// and prints the puts sent before it and those sent while it ran apart.
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
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type common struct {
	endpoint     string
	clients      int
	conns        int
	keys         int
	value        int
	compactEvery time.Duration
}

func (c *common) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoint, "endpoint", "127.0.0.1:2379", "host:port")
	fs.IntVar(&c.clients, "clients", 100, "concurrent clients")
	fs.IntVar(&c.conns, "conns", 10, "gRPC connections they share")
	fs.IntVar(&c.keys, "keys", 100000, "size of the key space the puts overwrite")
	fs.IntVar(&c.value, "value-bytes", 16384, "bytes per value")
	fs.DurationVar(&c.compactEvery, "compact-every", 5*time.Second, "compaction interval (0: none)")
}

type cluster struct {
	kv    []pb.KVClient
	maint pb.MaintenanceClient
	value []byte
	keys  int
	rev   atomic.Int64 // the highest revision an answer carried
}

func dial(c *common) *cluster {
	cl := &cluster{value: make([]byte, c.value), keys: c.keys}
	rand.New(rand.NewSource(1)).Read(cl.value)
	for i := 0; i < c.conns; i++ {
		conn, err := grpc.NewClient(c.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(c.value+4096)))
		if err != nil {
			log.Fatal(err)
		}
		cl.kv = append(cl.kv, pb.NewKVClient(conn))
		if cl.maint == nil {
			cl.maint = pb.NewMaintenanceClient(conn)
		}
	}
	return cl
}

// put puts one random key and returns its latency.
func (cl *cluster) put(ctx context.Context, client int, rng *rand.Rand) (time.Duration, error) {
	key := fmt.Sprintf("bigdb/%09d", rng.Intn(cl.keys))
	start := time.Now()
	r, err := cl.kv[client%len(cl.kv)].Put(ctx, &pb.PutRequest{Key: []byte(key), Value: cl.value})
	d := time.Since(start)
	if err == nil {
		for {
			seen := cl.rev.Load()
			if r.Header.Revision <= seen || cl.rev.CompareAndSwap(seen, r.Header.Revision) {
				break
			}
		}
	}
	return d, err
}

// compactor compacts every interval to the revision seen one interval before, until ctx ends.
func (cl *cluster) compactor(ctx context.Context, every time.Duration) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if last > 0 {
			if _, err := cl.kv[0].Compact(ctx, &pb.CompactionRequest{Revision: last}); err != nil && ctx.Err() == nil {
				log.Printf("compact %d: %v", last, err)
			}
		}
		last = cl.rev.Load()
	}
}

func (cl *cluster) dbSize(ctx context.Context) int64 {
	s, err := cl.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		log.Fatalf("status: %v", err)
	}
	return s.DbSize
}

func fill(args []string) {
	fs := flag.NewFlagSet("fill", flag.ExitOnError)
	var c common
	c.flags(fs)
	target := fs.Int64("target-bytes", 1<<30, "stop once the database is this large")
	fs.Parse(args)
	cl := dial(&c)
	ctx, cancel := context.WithCancel(context.Background())
	go cl.compactor(ctx, c.compactEvery)
	var puts, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < c.clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
			for ctx.Err() == nil {
				if _, err := cl.put(ctx, i, rng); err != nil {
					if ctx.Err() == nil && failed.Add(1) == 1 {
						log.Printf("put: %v", err)
					}
					continue
				}
				puts.Add(1)
			}
		}(i)
	}
	lastReport := start
	for {
		time.Sleep(time.Second)
		size := cl.dbSize(context.Background())
		if size >= *target {
			fmt.Printf("fill puts=%d seconds=%.0f db-bytes=%d errors=%d\n", puts.Load(), time.Since(start).Seconds(), size, failed.Load())
			break
		}
		if time.Since(lastReport) >= 30*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(os.Stderr, "fill: %.0f s, %d puts, db %d MB\n", time.Since(start).Seconds(), puts.Load(), size>>20)
		}
	}
	cancel()
	wg.Wait()
}

type sample struct {
	sent time.Time
	took time.Duration
}

func load(args []string) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	var c common
	c.flags(fs)
	rate := fs.Int("rate", 5000, "puts per second, over all clients")
	duration := fs.Duration("duration", 20*time.Second, "how long to put")
	defragAt := fs.Duration("defrag-at", 0, "ask for a defragmentation this long into the run (0: none)")
	fs.Parse(args)
	cl := dial(&c)
	// Prime the revision so the compactor has one from the start.
	if _, err := cl.put(context.Background(), 0, rand.New(rand.NewSource(0))); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go cl.compactor(ctx, c.compactEvery)

	// Slots at the steady rate; a client takes the next slot when its last put has answered.
	slots := make(chan struct{}, c.clients)
	start := time.Now()
	var defragDone atomic.Bool
	defragDone.Store(*defragAt == 0)
	var defragFrom, defragTo time.Time
	var defragErr error
	if *defragAt > 0 {
		go func() {
			time.Sleep(*defragAt)
			defragFrom = time.Now()
			_, defragErr = cl.maint.Defragment(context.Background(), &pb.DefragmentRequest{})
			defragTo = time.Now()
			defragDone.Store(true)
		}()
	}
	go func() {
		defer close(slots)
		interval := time.Second / time.Duration(*rate)
		next := start
		for {
			now := time.Now()
			if now.Sub(start) >= *duration && defragDone.Load() {
				return
			}
			for ; !next.After(now); next = next.Add(interval) {
				select {
				case slots <- struct{}{}:
				default: // every client is busy: the slot is lost, as a closed-loop client's would be
				}
			}
			time.Sleep(time.Until(next))
		}
	}()
	var mu sync.Mutex
	var all []sample
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < c.clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(i)))
			var mine []sample
			for range slots {
				sent := time.Now()
				d, err := cl.put(ctx, i, rng)
				if err != nil {
					if failed.Add(1) == 1 {
						log.Printf("put: %v", err)
					}
					continue
				}
				mine = append(mine, sample{sent, d})
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel()
	report("all", all, elapsed)
	if *defragAt > 0 {
		if defragErr != nil {
			log.Fatalf("defragment: %v", defragErr)
		}
		var before, during []sample
		for _, s := range all {
			switch {
			case s.sent.Before(defragFrom):
				before = append(before, s)
			case s.sent.Before(defragTo):
				during = append(during, s)
			}
		}
		report("before-defrag", before, defragFrom.Sub(start))
		report("during-defrag", during, defragTo.Sub(defragFrom))
		fmt.Printf("defrag seconds=%.2f\n", defragTo.Sub(defragFrom).Seconds())
	}
	fmt.Printf("db-bytes=%d\nerrors=%d\n", cl.dbSize(context.Background()), failed.Load())
}

// report prints one line: what, count, per second, p50, p99 and max (ms).
func report(what string, ss []sample, over time.Duration) {
	if len(ss) == 0 {
		fmt.Printf("%s count=0\n", what)
		return
	}
	ds := make([]time.Duration, len(ss))
	for i, s := range ss {
		ds[i] = s.took
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))] }
	fmt.Printf("%s count=%d rps=%.0f p50=%.2f p99=%.2f max=%.2f\n",
		what, len(ds), float64(len(ds))/over.Seconds(), ms(q(0.5)), ms(q(0.99)), ms(ds[len(ds)-1]))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bigdb fill|load [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "fill":
		fill(os.Args[2:])
	case "load":
		load(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: bigdb fill|load [flags]")
		os.Exit(2)
	}
}
