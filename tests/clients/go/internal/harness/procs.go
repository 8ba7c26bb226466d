// Package harness starts and stops the processes of the Go tests that run real clusters:
// kvd (or etcd) members on loopback ports, and TCP forwarders in front of them that a test can
// cut, slow or (for peer connections) partition between chosen members. Every process is
// SIGKILLed and every listener closed by the cleanups it registers.
//
// It takes a TB (a *testing.T, or the robustness command's runner) rather than *testing.T so
// that long runs outside `go test` use the same code.
package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// TB is what the harness needs of a test: *testing.T has it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
}

var nextPort atomic.Uint32

// FreePort is a loopback port below the kernel's ephemeral range (so no outgoing connection
// takes it between here and the server's bind), checked free by binding it.
func FreePort(tb TB) int {
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
	tb.Fatalf("no free loopback port below %d", low)
	return 0
}

// Proc is one process the test owns.
type Proc struct {
	tb   TB
	Name string
	bin  string
	args []string
	Log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	env  []string
}

// StartProc starts bin with args, its output appended to dir/name.log; the process is killed
// when the test ends.
func StartProc(tb TB, dir, name, bin string, args ...string) *Proc {
	p := &Proc{tb: tb, Name: name, bin: bin, args: args, Log: filepath.Join(dir, name+".log")}
	p.Start()
	tb.Cleanup(p.Kill)
	return p
}

// Start starts the process (again, after Kill).
func (p *Proc) Start() {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.tb.Fatalf("%v", err)
	}
	cmd := exec.Command(p.bin, p.Args()...)
	cmd.Stdout, cmd.Stderr = f, f
	p.mu.Lock()
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	p.mu.Unlock()
	if err := cmd.Start(); err != nil {
		p.tb.Fatalf("start %s: %v", p.Name, err)
	}
	f.Close()
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
}

// Signal sends s to the process if it runs.
func (p *Proc) Signal(s syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(s)
	}
}

// Kill SIGKILLs the process and reaps it.
func (p *Proc) Kill() {
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

// Exited: the process ended on its own; its exit status.
func (p *Proc) Exited() (bool, string) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return false, ""
	}
	// Signal 0 fails once the process is gone (a zombie still takes it, so look at /proc).
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return true, "gone"
	}
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return true, "exited"
	}
	return false, ""
}

// SetArgs changes the arguments of the next Start.
func (p *Proc) SetArgs(args ...string) {
	p.mu.Lock()
	p.args = args
	p.mu.Unlock()
}

// SetEnv sets variables (NAME=value) for the next Starts beside the test's own environment;
// none, nothing more.
func (p *Proc) SetEnv(vars ...string) {
	p.mu.Lock()
	p.env = vars
	p.mu.Unlock()
}

// Wait waits up to d for the process to end on its own; whether it did (then it is reaped).
func (p *Proc) Wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if gone, _ := p.Exited(); gone {
			p.Kill()
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// Args are the arguments of the next Start.
func (p *Proc) Args() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.args...)
}

// Restart kills and starts the process.
func (p *Proc) Restart() {
	p.Kill()
	p.Start()
}

// Tail is the end of the process's log, for failure messages.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
