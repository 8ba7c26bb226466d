// kwatch is a Kubernetes-shaped watch workload: many watchers on a few prefixes (as the API
// server's resources: /registry/pods/, /registry/events/, …), each on a Watch stream of its
// own over a shared pool of connections, while writers put objects of -value bytes at a
// steady total -rate. Every watcher starts from the revision before the first write, so
// each must receive every put to its prefix: the tool checks, for every watcher, that its
// events come in strictly increasing revision order and are exactly the writes to its
// prefix (each once, none missed, none invented, key and value as written), and prints the
// delivery latency over all watchers: from the put's send to the watcher's receipt (the
// put's own commit time included; the put latency is printed beside it).
//
//	go run ./cmd/kwatch -endpoints 127.0.0.1:2379 -watchers 2000 -prefixes 4 -rate 500 -duration 20s
//
// It exits 1 if any watcher's events differ from the writes.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/fnv"
	"log"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Latencies are counted in buckets 1% apart, from 1 µs to 100 s.
const buckets = 1900

func bucket(d time.Duration) int {
	us := float64(d.Microseconds())
	if us < 1 {
		return 0
	}
	b := int(math.Log(us) / math.Log(1.01))
	if b >= buckets {
		return buckets - 1
	}
	return b
}

func bucketValue(b int) time.Duration {
	return time.Duration(math.Pow(1.01, float64(b)) * float64(time.Microsecond))
}

type histogram [buckets]int64

func (h *histogram) add(o *histogram) {
	for i := range h {
		h[i] += o[i]
	}
}

func (h *histogram) quantile(q float64) time.Duration {
	var n int64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(n)))
	var seen int64
	for i, c := range h {
		seen += c
		if seen >= want {
			return bucketValue(i + 1)
		}
	}
	return bucketValue(buckets)
}

// digest folds a sequence of events (revision, key, value) in order into one number, so a
// watcher's sequence and the writes' can be compared without keeping either.
type digest struct {
	n int64
	h uint64
}

func (d *digest) add(rev int64, key, value []byte) {
	f := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], d.h)
	binary.LittleEndian.PutUint64(b[8:], uint64(rev))
	f.Write(b[:])
	f.Write(key)
	f.Write(value)
	d.h = f.Sum64()
	d.n++
}

// A write as the writers recorded it.
type write struct {
	rev        int64
	key, value []byte
}

// A watcher's outcome.
type seen struct {
	digest
	lastRev  int64
	progress atomic.Int64 // lastRev, for the main goroutine to read while it runs
	disorder int64        // events at or below the previous event's revision
	err      string
	lat      histogram
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated host:port list; watchers and writers spread over them")
	watchers := flag.Int("watchers", 2000, "watchers, spread evenly over the prefixes")
	prefixes := flag.Int("prefixes", 4, "prefixes watched (and written)")
	conns := flag.Int("conns", 20, "connections the watchers share")
	writers := flag.Int("writers", 20, "concurrent writers (one connection each)")
	rate := flag.Float64("rate", 500, "puts per second, in all")
	keys := flag.Int("keys", 1000, "objects per prefix")
	valueSize := flag.Int("value", 1024, "bytes per value")
	duration := flag.Duration("duration", 20*time.Second, "how long the writers write")
	settle := flag.Duration("settle", 60*time.Second, "how long watchers may take, after the last write, to receive it")
	inject := flag.String("inject", "", "the checker's self-test: watcher 0 drops (drop), repeats (dup) or swaps (swap) its tenth event, and the run must fail")
	flag.Parse()
	if *prefixes < 1 || *watchers < *prefixes || *writers < 1 || *rate <= 0 || *valueSize < 16 {
		log.Fatal("need -prefixes ≥ 1, -watchers ≥ -prefixes, -writers ≥ 1, -rate > 0, -value ≥ 16")
	}
	injectFault := &fault{kind: *inject}
	switch *inject {
	case "", "drop", "dup", "swap":
	default:
		log.Fatalf("-inject %q: drop, dup or swap", *inject)
	}
	eps := strings.Split(*endpoints, ",")
	dial := func(i int) *grpc.ClientConn {
		c, err := grpc.NewClient(eps[i%len(eps)], grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	prefix := func(p int) string { return fmt.Sprintf("/registry/kind%d/", p) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Every watcher starts after the revision the writes start from.
	writeConns := make([]*grpc.ClientConn, *writers)
	for i := range writeConns {
		writeConns[i] = dial(i)
	}
	r, err := pb.NewKVClient(writeConns[0]).Range(ctx, &pb.RangeRequest{Key: []byte("kwatch-probe")})
	if err != nil {
		log.Fatalf("the first endpoint: %v", err)
	}
	startRev := r.Header.Revision + 1

	watchConns := make([]*grpc.ClientConn, *conns)
	for i := range watchConns {
		watchConns[i] = dial(i)
	}
	results := make([]seen, *watchers)
	var ready, done sync.WaitGroup
	for w := 0; w < *watchers; w++ {
		ready.Add(1)
		done.Add(1)
		go func(w int) {
			defer done.Done()
			res := &results[w]
			p := w % *prefixes
			pre := []byte(prefix(p))
			stream, err := pb.NewWatchClient(watchConns[w%len(watchConns)]).Watch(ctx)
			if err == nil {
				err = stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
					CreateRequest: &pb.WatchCreateRequest{Key: pre, RangeEnd: prefixEnd(pre), StartRevision: startRev},
				}})
			}
			if err != nil {
				res.err = err.Error()
				ready.Done()
				return
			}
			created := false
			for {
				resp, err := stream.Recv()
				now := time.Now()
				if err != nil {
					res.err = err.Error()
					if !created {
						ready.Done()
					}
					return
				}
				if resp.Created && !created {
					created = true
					ready.Done()
				}
				if resp.Canceled || resp.CompactRevision != 0 {
					res.err = fmt.Sprintf("cancelled: %q (compacted at %d)", resp.CancelReason, resp.CompactRevision)
					return
				}
				events := resp.Events
				if w == 0 && *inject != "" {
					events = injectFault.apply(events)
				}
				for _, ev := range events {
					kv := ev.Kv
					if kv.ModRevision <= res.lastRev {
						res.disorder++
					}
					res.lastRev = kv.ModRevision
					res.add(kv.ModRevision, kv.Key, kv.Value)
					if len(kv.Value) >= 8 {
						sent := int64(binary.LittleEndian.Uint64(kv.Value[:8]))
						res.lat[bucket(now.Sub(time.Unix(0, sent)))]++
					}
				}
				res.progress.Store(res.lastRev)
			}
		}(w)
	}
	ready.Wait()

	// The writers: each puts at its share of the rate, on a schedule (a late put goes at
	// once, so the rate holds as long as the server keeps up).
	var mu sync.Mutex
	written := make([][]write, *prefixes)
	var putLat histogram
	var failed atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	interval := time.Duration(float64(time.Second) * float64(*writers) / *rate)
	for i := 0; i < *writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			kv := pb.NewKVClient(writeConns[i])
			rnd := rand.New(rand.NewSource(int64(i)))
			mine := make([][]write, *prefixes)
			var lat histogram
			next := begin.Add(interval * time.Duration(i) / time.Duration(*writers))
			for next.Before(begin.Add(*duration)) {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				p := rnd.Intn(*prefixes)
				key := []byte(fmt.Sprintf("%sns%02d/obj%06d", prefix(p), rnd.Intn(10), rnd.Intn(*keys)))
				value := make([]byte, *valueSize)
				rnd.Read(value[8:])
				sent := time.Now()
				binary.LittleEndian.PutUint64(value[:8], uint64(sent.UnixNano()))
				resp, err := kv.Put(ctx, &pb.PutRequest{Key: key, Value: value})
				if err != nil {
					// Its outcome is unknown: the check below can only be exact without it.
					failed.Add(1)
					log.Printf("put %s: %v", key, err)
					continue
				}
				lat[bucket(time.Since(sent))]++
				mine[p] = append(mine[p], write{resp.Header.Revision, key, value})
			}
			mu.Lock()
			for p := range mine {
				written[p] = append(written[p], mine[p]...)
			}
			putLat.add(&lat)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(begin)
	if failed.Load() > 0 {
		log.Fatalf("%d puts failed: the events cannot be checked exactly", failed.Load())
	}

	expected := make([]digest, *prefixes)
	lastRev := make([]int64, *prefixes)
	total := 0
	for p := range written {
		sort.Slice(written[p], func(a, b int) bool { return written[p][a].rev < written[p][b].rev })
		for _, w := range written[p] {
			expected[p].add(w.rev, w.key, w.value)
			lastRev[p] = w.rev
		}
		total += len(written[p])
	}
	// Every watcher reaches its prefix's last write, or is cut off after -settle.
	cutoff := time.Now().Add(*settle)
	for w := 0; w < *watchers && time.Now().Before(cutoff); {
		if results[w].progress.Load() >= lastRev[w%*prefixes] {
			w++
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	done.Wait()

	var lat histogram
	bad := 0
	var delivered, want int64
	for w := range results {
		res := &results[w]
		p := w % *prefixes
		delivered += res.n
		want += int64(len(written[p]))
		lat.add(&res.lat)
		switch {
		case res.disorder > 0:
			log.Printf("watcher %d (%s): %d events out of revision order", w, prefix(p), res.disorder)
		case res.digest != expected[p]:
			log.Printf("watcher %d (%s): %d events, %d written, or different ones (last revision %d; err %q)",
				w, prefix(p), res.n, len(written[p]), res.lastRev, res.err)
		default:
			continue
		}
		bad++
	}
	fmt.Printf("watchers=%d prefixes=%d puts=%d put-rate=%.0f events-expected=%d delivered=%d bad-watchers=%d "+
		"latency-ms p50=%.2f p90=%.2f p99=%.2f p999=%.2f max=%.2f put-ms p50=%.2f p99=%.2f\n",
		*watchers, *prefixes, total, float64(total)/elapsed.Seconds(), want, delivered, bad, ms(lat.quantile(0.5)), ms(lat.quantile(0.9)), ms(lat.quantile(0.99)),
		ms(lat.quantile(0.999)), ms(lat.quantile(1)), ms(putLat.quantile(0.5)), ms(putLat.quantile(0.99)))
	if bad > 0 {
		os.Exit(1)
	}
}

// fault is the checker's self-test: it drops, repeats or swaps (with the next) a watcher's
// tenth event.
type fault struct {
	kind string
	n    int
	held *mvccpb.Event
}

func (f *fault) apply(events []*mvccpb.Event) []*mvccpb.Event {
	var out []*mvccpb.Event
	for _, ev := range events {
		f.n++
		switch {
		case f.n == 10 && f.kind == "drop":
		case f.n == 10 && f.kind == "dup":
			out = append(out, ev, ev)
		case f.n == 10 && f.kind == "swap":
			f.held = ev
		case f.n == 11 && f.held != nil:
			out = append(out, ev, f.held)
		default:
			out = append(out, ev)
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// prefixEnd is the range end covering every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
