// The processes of the leasing proxy's linearizability test: a cluster of kvd members
// (internal/harness), kvd leasing proxies in front of it, and a TCP forwarder per proxy and
// member that the test can cut (a partition of that proxy from the cluster). Every process is
// SIGKILLed and every directory removed when the test ends.
package leasing

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvd.test/clients/go/internal/harness"
)

// startCluster starts n kvd members and waits for a leader.
func startCluster(t *testing.T, dir, bin string, n int) *harness.Cluster {
	return harness.StartCluster(t, dir, harness.Options{Bin: bin, Members: n, Token: "leasing-test"})
}

// proxy is a kvd leasing proxy with a forwarder to each member.
type proxy struct {
	addr string
	p    *harness.Proc
	fwd  []*harness.Forwarder
}

func startProxy(t *testing.T, dir, name, bin string, c *harness.Cluster, extra ...string) *proxy {
	var eps []string
	var fwd []*harness.Forwarder
	for _, m := range c.Members {
		f := harness.Forward(t, m.Addr())
		fwd = append(fwd, f)
		eps = append(eps, f.Addr)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	args := append([]string{
		"grpc-proxy", "start", "--endpoints", strings.Join(eps, ","),
		"--listen-addr", addr, "--advertise-client-url", addr,
	}, extra...)
	if harness.IsKvd(bin) {
		args = append(args, "--log-format", "text", "--log-level", "info,leasing_proxy=debug")
	}
	px := &proxy{addr: addr, p: harness.StartProc(t, dir, name, bin, args...), fwd: fwd}
	harness.WaitReady(t, addr, px.p)
	return px
}

// cut partitions the proxy from every member (true), or heals it.
func (px *proxy) cut(on bool) {
	for _, f := range px.fwd {
		f.SetCut(on)
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
