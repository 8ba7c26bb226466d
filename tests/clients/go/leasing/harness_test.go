// The processes of the leasing proxy's linearizability test: a cluster of kvd members, kvd
// leasing proxies in front of it, and a TCP forwarder per proxy and member that the test can
// cut (a partition of that proxy from the cluster). Every process is SIGKILLed and every
// directory removed when the test ends.
package leasing

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

var nextPort atomic.Uint32

// freePort is a loopback port below the kernel's ephemeral range (so no outgoing connection
// takes it between here and the server's bind), checked free by binding it.
func freePort(t *testing.T) int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	span := uint32(low - 1024)
	seed := uint32(os.Getpid()) * 7919
	for i := uint32(0); i < span; i++ {
		port := 1024 + int((seed+nextPort.Add(1))%span)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatalf("no free loopback port below %d", low)
	return 0
}

// proc is one process the test owns.
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	p := &proc{t: t, name: name, bin: bin, args: args, log: filepath.Join(dir, name+".log")}
	p.start()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) start() {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	f.Close()
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
}

func (p *proc) signal(s syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(s)
	}
}

// kill SIGKILLs the process and reaps it.
func (p *proc) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func (p *proc) restart() {
	p.kill()
	p.start()
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// forwarder forwards TCP connections to `to` until cut: cutting drops every connection and
// holds new ones without a byte through (as a partition does) until healed.
type forwarder struct {
	addr  string
	to    string
	l     net.Listener
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	delay atomic.Int64 // nanoseconds added to each chunk forwarded
}

func forward(t *testing.T, to string) *forwarder {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{addr: l.Addr().String(), to: to, l: l, conns: map[net.Conn]struct{}{}}
	go f.accept()
	t.Cleanup(func() { l.Close(); f.setCut(true) })
	return f
}

func (f *forwarder) accept() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		cut := f.cut
		f.mu.Unlock()
		if cut {
			continue // held: nothing goes through, it is closed when healed
		}
		go f.pipe(c)
	}
}

func (f *forwarder) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", f.to, time.Second)
	if err != nil {
		f.drop(c)
		return
	}
	f.mu.Lock()
	if f.cut {
		f.mu.Unlock()
		up.Close()
		return
	}
	f.conns[up] = struct{}{}
	f.mu.Unlock()
	go f.copy(up, c)
	f.copy(c, up)
}

func (f *forwarder) copy(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(f.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	f.drop(src)
	f.drop(dst)
}

func (f *forwarder) drop(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// setCut cuts (true) or heals (false); both close what is open.
func (f *forwarder) setCut(cut bool) {
	f.mu.Lock()
	f.cut = cut
	conns := f.conns
	f.conns = map[net.Conn]struct{}{}
	f.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// member is one member of the cluster.
type member struct {
	name, client string
	p            *proc
}

// startCluster starts n kvd members (or etcd's, with bin etcd) and waits for a leader.
func startCluster(t *testing.T, dir, bin string, n int) []*member {
	type addrs struct{ client, peer string }
	as := make([]addrs, n)
	var initial []string
	for i := range as {
		as[i] = addrs{
			client: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			peer:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		}
		initial = append(initial, fmt.Sprintf("m%d=%s", i, as[i].peer))
	}
	var ms []*member
	for i, a := range as {
		name := fmt.Sprintf("m%d", i)
		args := []string{
			"--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", a.client, "--advertise-client-urls", a.client,
			"--listen-peer-urls", a.peer, "--initial-advertise-peer-urls", a.peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", "leasing-test", "--log-level", "info",
		}
		if strings.HasSuffix(bin, "kvd") {
			args = append(args, "--log-format", "text")
		}
		ms = append(ms, &member{name: name, client: a.client, p: startProc(t, dir, name, bin, args...)})
	}
	waitReady(t, ms[0].client, ms[0].p)
	return ms
}

// waitReady waits until a linearizable read through `endpoint` succeeds.
func waitReady(t *testing.T, endpoint string, p *proc) {
	c := adminClient(t, endpoint)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "ready")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v\n%s", endpoint, err, p.tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func adminClient(t *testing.T, endpoints ...string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// leader is the member that leads now.
func leader(t *testing.T, ms []*member) *member {
	for _, m := range ms {
		c := adminClient(t, m.client)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.Status(ctx, m.client)
		cancel()
		c.Close()
		if err == nil && s.Leader == s.Header.MemberId {
			return m
		}
	}
	return ms[0]
}

// proxy is a kvd leasing proxy with a forwarder to each member.
type proxy struct {
	addr string
	p    *proc
	fwd  []*forwarder
}

func startProxy(t *testing.T, dir, name, bin string, ms []*member, extra ...string) *proxy {
	var eps []string
	var fwd []*forwarder
	for _, m := range ms {
		f := forward(t, strings.TrimPrefix(m.client, "http://"))
		fwd = append(fwd, f)
		eps = append(eps, f.addr)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := append([]string{
		"grpc-proxy", "start", "--endpoints", strings.Join(eps, ","),
		"--listen-addr", addr, "--advertise-client-url", addr,
	}, extra...)
	if strings.HasSuffix(bin, "kvd") {
		args = append(args, "--log-format", "text", "--log-level", "info,leasing_proxy=debug")
	}
	px := &proxy{addr: addr, p: startProc(t, dir, name, bin, args...), fwd: fwd}
	waitReady(t, addr, px.p)
	return px
}

// cut partitions the proxy from every member (true), or heals it.
func (px *proxy) cut(on bool) {
	for _, f := range px.fwd {
		f.setCut(on)
	}
}

// metric reads one of the proxy's metrics (0 if absent).
func (px *proxy) metric(name string) int64 {
	conn, err := net.DialTimeout("tcp", px.addr, time.Second)
	if err != nil {
		return 0
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	r := bufio.NewReader(conn)
	body, _ := io.ReadAll(r)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(n)
		}
	}
	return 0
}
