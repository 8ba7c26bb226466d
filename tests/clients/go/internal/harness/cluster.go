package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Options of a cluster.
type Options struct {
	// Bin is the kvd or etcd binary.
	Bin     string
	Members int
	// ForwardClients puts a Forwarder in front of each member's client port (the URL clients
	// are given and the member advertises); ForwardPeers one in front of each peer port (the
	// URL the members know each other by), so that members can be partitioned.
	ForwardClients, ForwardPeers bool
	Token                        string
	// Extra flags for every member.
	Extra []string
}

// Member is one member of a cluster.
type Member struct {
	Name string
	// ID is the member's id, in hex as etcd prints it (known once the cluster is up).
	ID string
	// Client is the URL clients use (its forwarder's, if it has one); Direct the member's own.
	Client, Direct string
	Dir            string
	P              *Proc
	ClientFwd      *Forwarder
	PeerFwd        *Forwarder
}

// Addr is Client without its scheme, for gRPC dialers.
func (m *Member) Addr() string { return strings.TrimPrefix(m.Client, "http://") }

// Cluster is a running cluster.
type Cluster struct {
	tb      TB
	Members []*Member
	mu      sync.Mutex
	// blocked[i][j] > 0: connections member i opens to member j are held (a count: faults
	// that overlap each undo only their own).
	blocked map[[2]int]int
}

// IsKvd: the binary is kvd (not etcd).
func IsKvd(bin string) bool { return strings.HasSuffix(filepath.Base(bin), "kvd") }

// StartCluster starts the members in dir and waits until the first answers a linearizable
// read.
func StartCluster(tb TB, dir string, o Options) *Cluster {
	tb.Helper()
	if o.Token == "" {
		o.Token = "harness"
	}
	c := &Cluster{tb: tb, blocked: map[[2]int]int{}}
	type addrs struct{ client, peer, advClient, advPeer string }
	as := make([]addrs, o.Members)
	var initial []string
	for i := range as {
		a := addrs{
			client: fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
			peer:   fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		}
		a.advClient, a.advPeer = a.client, a.peer
		m := &Member{Name: fmt.Sprintf("m%d", i), Direct: "http://" + a.client, Dir: filepath.Join(dir, fmt.Sprintf("m%d", i))}
		if o.ForwardClients {
			m.ClientFwd = Forward(tb, a.client)
			a.advClient = m.ClientFwd.Addr
		}
		if o.ForwardPeers {
			m.PeerFwd = ForwardPeer(tb, a.peer)
			a.advPeer = m.PeerFwd.Addr
		}
		m.Client = "http://" + a.advClient
		as[i] = a
		initial = append(initial, fmt.Sprintf("%s=http://%s", m.Name, a.advPeer))
		c.Members = append(c.Members, m)
	}
	for i, m := range c.Members {
		a := as[i]
		args := []string{
			"--name", m.Name, "--data-dir", m.Dir,
			"--listen-client-urls", "http://" + a.client, "--advertise-client-urls", m.Client,
			"--listen-peer-urls", "http://" + a.peer, "--initial-advertise-peer-urls", "http://" + a.advPeer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", o.Token, "--log-level", "info",
		}
		if IsKvd(o.Bin) {
			args = append(args, "--log-format", "text")
		}
		args = append(args, o.Extra...)
		m.P = StartProc(tb, dir, m.Name, o.Bin, args...)
	}
	WaitReady(tb, c.Members[0].Client, c.Members[0].P)
	cl := AdminClient(tb, c.Members[0].Client)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := cl.MemberList(ctx)
	if err != nil {
		tb.Fatalf("member list: %v", err)
	}
	for _, pm := range list.Members {
		for _, m := range c.Members {
			if pm.Name == m.Name {
				m.ID = strconv.FormatUint(pm.ID, 16)
			}
		}
	}
	c.apply()
	return c
}

func (c *Cluster) isBlocked(from string, to int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.Members {
		if m.ID == from {
			return c.blocked[[2]int{i, to}] > 0
		}
	}
	// A request that names no sender is held only if `to` is cut off from every member.
	for i := range c.Members {
		if i != to && c.blocked[[2]int{i, to}] == 0 {
			return false
		}
	}
	return len(c.Members) > 1
}

// apply has every peer forwarder hold what the blocked pairs say (now that the ids are known).
func (c *Cluster) apply() {
	for j, m := range c.Members {
		if m.PeerFwd != nil {
			m.PeerFwd.SetBlock(func(from string) bool { return c.isBlocked(from, j) })
		}
	}
}

// Block holds the connections member `from` opens to member `to` (kvd's raft messages from
// `from` to `to`; for etcd, whatever travels on the connections `from` dials).
func (c *Cluster) Block(from, to int) {
	c.mu.Lock()
	c.blocked[[2]int{from, to}]++
	c.mu.Unlock()
	c.apply()
}

// Unblock undoes one Block(from, to).
func (c *Cluster) Unblock(from, to int) {
	c.mu.Lock()
	if c.blocked[[2]int{from, to}] > 0 {
		c.blocked[[2]int{from, to}]--
	}
	c.mu.Unlock()
	c.apply()
}

// Isolate partitions member i from every other member, both ways.
func (c *Cluster) Isolate(i int) { c.isolate(i, 1) }

// Rejoin undoes one Isolate(i).
func (c *Cluster) Rejoin(i int) { c.isolate(i, -1) }

func (c *Cluster) isolate(i, by int) {
	c.mu.Lock()
	for j := range c.Members {
		if j != i {
			for _, p := range [][2]int{{i, j}, {j, i}} {
				c.blocked[p] = max(c.blocked[p]+by, 0)
			}
		}
	}
	c.mu.Unlock()
	c.apply()
}

// Heal ends every partition.
func (c *Cluster) Heal() {
	c.mu.Lock()
	c.blocked = map[[2]int]int{}
	c.mu.Unlock()
	c.apply()
}

// Status is each running member's status (nil where it did not answer within a second).
func (c *Cluster) Status() []*clientv3.StatusResponse {
	out := make([]*clientv3.StatusResponse, len(c.Members))
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := Client(time.Second, m.Direct)
			if err != nil {
				return
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if s, err := cl.Status(ctx, m.Direct); err == nil {
				out[i] = s
			}
		}()
	}
	wg.Wait()
	return out
}

// Leader is the index of the member that leads now in the eyes of a majority's answers, or
// -1.
func (c *Cluster) Leader() int {
	for i, s := range c.Status() {
		if s != nil && s.Leader == s.Header.MemberId {
			return i
		}
	}
	return -1
}

// MoveLeader asks the leader to hand leadership to member `to`.
func (c *Cluster) MoveLeader(to int) error {
	l := c.Leader()
	if l < 0 {
		return fmt.Errorf("no leader")
	}
	id, _ := strconv.ParseUint(c.Members[to].ID, 16, 64)
	cl, err := Client(time.Second, c.Members[l].Direct)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cl.MoveLeader(ctx, id)
	return err
}

// HashKV is member i's hash of its keys at rev.
func (c *Cluster) HashKV(i int, rev int64) (*pb.HashKVResponse, error) {
	cl, err := Client(time.Second, c.Members[i].Direct)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := cl.HashKV(ctx, c.Members[i].Direct, rev)
	if err != nil {
		return nil, err
	}
	return (*pb.HashKVResponse)(r), nil
}

// Alarms are the alarms raised in the cluster, as member i lists them.
func (c *Cluster) Alarms(i int) ([]*pb.AlarmMember, error) {
	cl, err := Client(time.Second, c.Members[i].Direct)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cl.AlarmList(ctx)
	if err != nil {
		return nil, err
	}
	return r.Alarms, nil
}

// Replace removes member i from the cluster, deletes its data, adds it back under the same
// name and URLs (a new member id) and starts it with `--initial-cluster-state existing`: it
// catches up from the others (by snapshot, if the log was compacted). As etcd's robustness
// suite replaces a member.
func (c *Cluster) Replace(i int) error {
	m := c.Members[i]
	cl, err := Client(2*time.Second, c.directs(i)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	id, err := strconv.ParseUint(m.ID, 16, 64)
	if err != nil {
		return fmt.Errorf("m%d's id %q: %v", i, m.ID, err)
	}
	m.P.Kill()
	if err := Retry(func(ctx context.Context) error { _, err := cl.MemberRemove(ctx, id); return err }); err != nil {
		m.P.Start()
		return fmt.Errorf("remove m%d: %v", i, err)
	}
	if err := os.RemoveAll(m.Dir); err != nil {
		return err
	}
	args := m.P.Args()
	peer := flagValue(args, "--initial-advertise-peer-urls")
	var added *clientv3.MemberAddResponse
	// The strict reconfiguration check refuses an add until the leader has been connected to
	// every voter for a while: try for 30 s.
	err = Retry(func(ctx context.Context) error {
		var err error
		added, err = cl.MemberAdd(ctx, []string{peer})
		return err
	})
	if err != nil {
		return fmt.Errorf("add m%d back: %v", i, err)
	}
	var initial []string
	for _, am := range added.Members {
		name := am.Name
		if am.ID == added.Member.ID {
			name = m.Name
		}
		for _, u := range am.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	args = setFlag(args, "--initial-cluster", strings.Join(initial, ","))
	args = setFlag(args, "--initial-cluster-state", "existing")
	m.P.SetArgs(args...)
	c.mu.Lock()
	m.ID = strconv.FormatUint(added.Member.ID, 16)
	c.mu.Unlock()
	m.P.Start()
	return nil
}

// directs are the members' own client URLs but i's.
func (c *Cluster) directs(i int) []string {
	var eps []string
	for j, m := range c.Members {
		if j != i {
			eps = append(eps, m.Direct)
		}
	}
	return eps
}

// Retry calls f (with a 5-second context) until it succeeds, for at most 30 s.
func Retry(f func(ctx context.Context) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// setFlag sets `name value` in args, replacing it if there.
func setFlag(args []string, name, value string) []string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			args[i+1] = value
			return args
		}
	}
	return append(args, name, value)
}

// WaitReady waits until a linearizable read through `endpoint` succeeds.
func WaitReady(tb TB, endpoint string, p *Proc) {
	tb.Helper()
	c := AdminClient(tb, endpoint)
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "ready")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not ready: %v\n%s", endpoint, err, p.Tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Client is a clientv3 client of the endpoints that logs nothing: under faults clientv3 logs
// every retry, thousands of lines that bury a run's report.
func Client(dial time.Duration, endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dial, Logger: zap.NewNop()})
}

// AdminClient is a clientv3 client of the endpoints, closed when the test ends.
func AdminClient(tb TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	c, err := Client(2*time.Second, endpoints...)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
