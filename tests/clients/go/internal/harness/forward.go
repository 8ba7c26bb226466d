package harness

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Forwarder forwards TCP connections to a member. Cutting it drops every connection and holds
// new ones without a byte through (as a partition does) until healed. A peer forwarder (one
// made with ForwardPeer) also learns which member dialed each connection, from the first
// request on it, and holds the connections of the senders its Block function names.
type Forwarder struct {
	Addr string
	to   string
	l    net.Listener
	mu   sync.Mutex
	cut  bool
	// The open connections, each with the upstream it is joined to (nil while held).
	links map[*link]struct{}
	// Delay is added to each chunk forwarded, in nanoseconds.
	Delay atomic.Int64
	peer  bool
	block func(from string) bool
}

type link struct {
	c, up net.Conn
	from  string // the sender, once known ("?" if the request names none)
	held  bool
}

// Forward starts a forwarder to `to` on a free loopback port.
func Forward(tb TB, to string) *Forwarder {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", FreePort(tb)))
	if err != nil {
		tb.Fatalf("%v", err)
	}
	f := &Forwarder{Addr: l.Addr().String(), to: to, l: l, links: map[*link]struct{}{}}
	go f.accept()
	tb.Cleanup(func() { l.Close(); f.SetCut(true) })
	return f
}

// ForwardPeer is Forward for a member's peer port: it identifies senders (kvd's framed raft
// streams name the sender in their opening, its gRPC peer calls carry the sender's member id
// in every request, etcd's HTTP requests in the X-Server-From header), so that SetBlock can
// partition chosen members from this one.
func ForwardPeer(tb TB, to string) *Forwarder {
	f := Forward(tb, to)
	f.mu.Lock()
	f.peer = true
	f.mu.Unlock()
	return f
}

func (f *Forwarder) accept() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		l := &link{c: c}
		f.mu.Lock()
		f.links[l] = struct{}{}
		cut := f.cut
		f.mu.Unlock()
		if cut {
			go f.hold(l)
			continue
		}
		go f.pipe(l)
	}
}

// hold reads and drops what the held connection sends, until it or the forwarder closes it.
func (f *Forwarder) hold(l *link) {
	f.mu.Lock()
	l.held = true
	up := l.up
	l.up = nil
	f.mu.Unlock()
	if up != nil {
		up.Close()
	}
	io.Copy(io.Discard, l.c)
	f.drop(l)
}

func (f *Forwarder) pipe(l *link) {
	up, err := net.DialTimeout("tcp", f.to, time.Second)
	if err != nil {
		f.drop(l)
		return
	}
	f.mu.Lock()
	if f.cut || l.held {
		f.mu.Unlock()
		up.Close()
		return
	}
	l.up = up
	peer := f.peer
	f.mu.Unlock()
	go f.copy(l, l.c, up, false)
	f.copy(l, up, l.c, peer)
}

// copy forwards src to dst; with sniff, it first holds back the bytes of the first request
// until the sender is known, and holds the link if the sender is blocked.
func (f *Forwarder) copy(l *link, dst, src net.Conn, sniff bool) {
	buf := make([]byte, 64<<10)
	var pending []byte
	sent := 0
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(f.Delay.Load()); d > 0 {
				time.Sleep(d)
			}
			out := buf[:n]
			if sniff {
				pending = append(pending, buf[:n]...)
				safe, from, decided := sender(pending)
				if decided {
					sniff = false
					f.mu.Lock()
					l.from = from
					blocked := f.block != nil && f.block(from)
					f.mu.Unlock()
					if blocked {
						f.hold(l)
						return
					}
					safe = len(pending)
				}
				out = pending[sent:safe]
				sent = safe
				if !sniff {
					pending = nil
				}
			}
			if len(out) > 0 {
				if _, werr := dst.Write(out); werr != nil {
					break
				}
			}
		}
		if err != nil {
			break
		}
	}
	f.mu.Lock()
	held := l.held
	f.mu.Unlock()
	if !held {
		f.drop(l)
	}
}

func (f *Forwarder) drop(l *link) {
	f.mu.Lock()
	delete(f.links, l)
	up := l.up
	f.mu.Unlock()
	l.c.Close()
	if up != nil {
		up.Close()
	}
}

// SetCut cuts (true) or heals (false); both close what is open.
func (f *Forwarder) SetCut(cut bool) {
	f.mu.Lock()
	f.cut = cut
	links := f.links
	f.links = map[*link]struct{}{}
	f.mu.Unlock()
	for l := range links {
		f.drop(l)
	}
}

// SetBlock holds, from now on, every connection whose sender `block` names (a peer forwarder
// only; nil blocks none). Connections it newly blocks, and every held one when it unblocks, are
// closed, so that their senders dial again.
func (f *Forwarder) SetBlock(block func(from string) bool) {
	f.mu.Lock()
	f.block = block
	var close []*link
	for l := range f.links {
		if l.from == "" {
			continue
		}
		now := block != nil && block(l.from)
		if now != l.held {
			close = append(close, l)
		}
	}
	for _, l := range close {
		delete(f.links, l)
	}
	f.mu.Unlock()
	for _, l := range close {
		f.drop(l)
	}
}

// Senders counts the open connections by their sender, for tests of the forwarder itself.
func (f *Forwarder) Senders() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for l := range f.links {
		if !l.held {
			out[l.from]++
		}
	}
	return out
}

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// kvd's framed raft stream opens with this, then its cluster id, its member id and the
// target's (8 bytes each, little-endian).
const framedMagic = "\x00kvdraft"

// sender reads the member that opened a peer connection from its first bytes: how many of
// them can go through before that is known, the sender's id in hex ("?" if the request names
// none), and whether it is decided. A connection that has sent no message yet is undecided.
func sender(b []byte) (safe int, from string, decided bool) {
	const most = 256 << 10
	if n := min(len(b), len(framedMagic)); n > 0 && string(b[:n]) == framedMagic[:n] {
		if len(b) < len(framedMagic)+24 {
			return 0, "?", false
		}
		from := binary.LittleEndian.Uint64(b[len(framedMagic)+8:])
		return 0, strconv.FormatUint(from, 16), true
	}
	if len(b) < len(h2Preface) {
		if !bytes.HasPrefix([]byte(h2Preface), b) && bytes.Contains(b, []byte("\r\n\r\n")) {
			return 0, httpSender(b), true
		}
		return 0, "?", len(b) > most
	}
	if !bytes.HasPrefix(b, []byte(h2Preface)) {
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			return 0, httpSender(b[:i]), true
		}
		return 0, "?", len(b) > most
	}
	// HTTP/2 frames: everything before the first gRPC message that names its sender goes
	// through; kvd's Batch, SnapshotChunk and Hello name it in field 2.
	off := len(h2Preface)
	for off+9 <= len(b) {
		size := int(b[off])<<16 | int(b[off+1])<<8 | int(b[off+2])
		kind, flags := b[off+3], b[off+4]
		if off+9+size > len(b) {
			break
		}
		if kind == 0 { // DATA
			payload := b[off+9 : off+9+size]
			if flags&0x8 != 0 && len(payload) > 0 { // PADDED
				pad := int(payload[0])
				payload = payload[1:]
				if pad <= len(payload) {
					payload = payload[:len(payload)-pad]
				}
			}
			if len(payload) >= 5 {
				if id, ok := protoField2(payload[5:]); ok {
					return off, strconv.FormatUint(id, 16), true
				}
			}
			// A message that names no sender (a stream's empty opening, a unary call's
			// end, the Members call) carries no raft message: it goes through, and the
			// connection's next messages may name their sender.
		}
		off += 9 + size
	}
	return off, "?", len(b) > most
}

func httpSender(head []byte) string {
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("X-Server-From")) {
			return string(bytes.TrimSpace(v))
		}
	}
	return "?"
}

// protoField2 is the varint field 2 of a protobuf message, if it has one.
func protoField2(m []byte) (uint64, bool) {
	for len(m) > 0 {
		tag, n := binary.Uvarint(m)
		if n <= 0 {
			return 0, false
		}
		m = m[n:]
		switch tag & 7 {
		case 0:
			v, n := binary.Uvarint(m)
			if n <= 0 {
				return 0, false
			}
			if tag>>3 == 2 {
				return v, true
			}
			m = m[n:]
		case 1:
			if len(m) < 8 {
				return 0, false
			}
			m = m[8:]
		case 2:
			size, n := binary.Uvarint(m)
			if n <= 0 || uint64(len(m)-n) < size {
				return 0, false
			}
			m = m[n+int(size):]
		case 5:
			if len(m) < 4 {
				return 0, false
			}
			m = m[4:]
		default:
			return 0, false
		}
	}
	return 0, false
}
