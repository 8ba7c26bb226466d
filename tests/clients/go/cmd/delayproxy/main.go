// delayproxy forwards TCP connections from -listen to -to, delaying every chunk by -delay in
// each direction (a round trip takes 2×delay more), as a network link of that latency would:
// chunks are queued with the time they arrived and sent when their time comes, so a busy
// connection is delayed, not slowed to one chunk per delay.
//
//	go run ./cmd/delayproxy -listen 127.0.0.1:12379 -to 127.0.0.1:2379 -delay 5ms
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"time"
)

type chunk struct {
	due  time.Time
	data []byte
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	to := flag.String("to", "", "address to forward to")
	delay := flag.Duration("delay", 0, "delay added in each direction")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("forwarding %s -> %s with %s each way", l.Addr(), *to, *delay)
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			up, err := net.Dial("tcp", *to)
			if err != nil {
				c.Close()
				return
			}
			setNoDelay(c)
			setNoDelay(up)
			go pipe(up, c, *delay)
			pipe(c, up, *delay)
		}()
	}
}

func setNoDelay(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		t.SetNoDelay(true)
	}
}

// pipe copies src to dst, each chunk `delay` after it was read.
func pipe(dst, src net.Conn, delay time.Duration) {
	defer dst.Close()
	defer src.Close()
	if delay == 0 {
		io.Copy(dst, src)
		return
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(delay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}
