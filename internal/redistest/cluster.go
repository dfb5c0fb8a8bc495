package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeTimeout is the cluster-node-timeout of the test Cluster: small, so a
// killed primary is failed over within a few seconds.
const NodeTimeout = 1000 * time.Millisecond

// CLIBinary returns the path of redis-cli, or an error that says how to
// install it. SPILLWAY_REDIS_CLI overrides the lookup.
func CLIBinary() (string, error) {
	if p := os.Getenv("SPILLWAY_REDIS_CLI"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", fmt.Errorf("redistest: redis-cli is not installed; the Cluster tests need it to join the nodes (run ./scripts/test.sh, which installs it, or apt-get install redis-tools, or set SPILLWAY_REDIS_CLI): %w", err)
	}
	return p, nil
}

// Cluster is a real Redis Cluster of three primaries and three replicas on
// loopback, each node its own redis-server process. It is safe for
// concurrent use.
type Cluster struct {
	// Nodes are the six servers, in start order. Which of them are
	// primaries changes on failover: ask Primaries or Owner.
	Nodes []*Server

	mu     sync.Mutex
	killed map[*Server]bool
}

// StartCluster starts six cluster-enabled redis-server processes on free
// loopback ports (each with its own cluster bus port), joins them with
// `redis-cli --cluster create … --cluster-replicas 1`, waits until every node
// reports cluster_state:ok with all 16384 slots assigned and every replica
// is in sync with its primary, and stops them all when the test ends.
//
// extra arguments are appended to every node's command line, e.g.
// "--cluster-require-full-coverage", "no" (with the default, yes, every
// node answers CLUSTERDOWN while any slot has no primary, including during
// a failover).
func StartCluster(t TB, extra ...string) *Cluster {
	t.Helper()
	c, err := startCluster(t.TempDir(), extra)
	if c != nil {
		t.Cleanup(c.Stop)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	return c
}

func startCluster(dir string, extra []string) (*Cluster, error) {
	bin, err := ServerBinary()
	if err != nil {
		return nil, err
	}
	cli, err := CLIBinary()
	if err != nil {
		return nil, err
	}
	c := &Cluster{killed: map[*Server]bool{}}
	for i := 0; i < 6; i++ {
		s, err := startClusterNode(bin, dir, extra)
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return c, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return c, fmt.Errorf("%w\nredis-cli said:\n%s", err, out)
	}
	return c, nil
}

// startClusterNode starts one node; the bus port is chosen explicitly
// (cluster-port) because port+10000 may be out of range or taken.
func startClusterNode(bin, dir string, extra []string) (*Server, error) {
	return startOnFreePort(bin, dir, "cluster", func(port int, sdir string) ([]string, error) {
		bus, err := FreePort()
		if err != nil {
			return nil, fmt.Errorf("redistest: no free port: %w", err)
		}
		if bus == port {
			// The listener that found port is closed again, so the next
			// look-up may return it: ask once more.
			if bus, err = FreePort(); err != nil {
				return nil, fmt.Errorf("redistest: no free port: %w", err)
			}
		}
		args := append(serverArgs(port, sdir),
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout/time.Millisecond)),
			// A replica always volunteers for failover, however long its
			// link was down: tests kill primaries on purpose.
			"--cluster-replica-validity-factor", "0",
			// Replicas sync at once instead of after the default 5 s.
			"--repl-diskless-sync-delay", "0",
		)
		return append(args, extra...), nil
	})
}

// Stop kills every node. It is safe to call twice.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}

// Addrs returns the addresses of all nodes, for a ClusterClient's seed list.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a[i] = s.Addr
	}
	return a
}

// ClientStateReload is the ClusterStateReloadInterval that Client sets.
// go-redis routes a slot to the primary it last saw until a MOVED reply or
// this interval (default 60 s) makes it reload the topology; a dead primary
// answers no MOVED, so without a short interval a client keeps dialling it
// for up to a minute after its replica was promoted.
const ClientStateReload = 500 * time.Millisecond

// Client returns a new go-redis ClusterClient seeded with every node, with
// ClusterStateReloadInterval = ClientStateReload, closed when the test ends.
// configure, if given, adjusts the options (timeouts, retries) before the
// client is built.
func (c *Cluster) Client(t TB, configure ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	opts := &redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: ClientStateReload}
	for _, f := range configure {
		f(opts)
	}
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Live returns the nodes that have not been killed through the Cluster.
func (c *Cluster) Live() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var live []*Server
	for _, s := range c.Nodes {
		if !c.killed[s] {
			live = append(live, s)
		}
	}
	return live
}

func (c *Cluster) byAddr(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// KeySlot asks a live node for the slot of key (CLUSTER KEYSLOT).
func (c *Cluster) KeySlot(ctx context.Context, key string) (int, error) {
	var lastErr error
	for _, s := range c.Live() {
		v, err := s.Do(ctx, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			lastErr = err
			continue
		}
		n, ok := v.(int64)
		if !ok {
			return 0, fmt.Errorf("redistest: CLUSTER KEYSLOT replied %T %v", v, v)
		}
		return int(n), nil
	}
	return 0, fmt.Errorf("redistest: no live node answered CLUSTER KEYSLOT: %w", lastErr)
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string
	primary, failed  bool
	myself           bool
	slots            [][2]int
}

func parseClusterNodes(text string) []clusterNode {
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNode{id: f[0], master: f[3]}
		n.addr, _, _ = strings.Cut(f[1], "@")
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.primary = true
			case "fail", "fail?", "noaddr":
				n.failed = true
			case "myself":
				n.myself = true
			}
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// topology returns the view of CLUSTER NODES from the first live node that
// answers.
func (c *Cluster) topology(ctx context.Context) ([]clusterNode, error) {
	var lastErr error
	for _, s := range c.Live() {
		v, err := s.Do(ctx, "CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		text, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("redistest: CLUSTER NODES replied %T", v)
		}
		return parseClusterNodes(text), nil
	}
	return nil, fmt.Errorf("redistest: no live node answered CLUSTER NODES: %w", lastErr)
}

// Owner returns the primary that serves slot, as a live node sees it.
func (c *Cluster) Owner(ctx context.Context, slot int) (*Server, error) {
	nodes, err := c.topology(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if !n.primary || n.failed {
			continue
		}
		for _, r := range n.slots {
			if slot >= r[0] && slot <= r[1] {
				if s := c.byAddr(n.addr); s != nil {
					return s, nil
				}
				return nil, fmt.Errorf("redistest: slot %d is served by unknown node %s", slot, n.addr)
			}
		}
	}
	return nil, fmt.Errorf("redistest: no healthy primary serves slot %d", slot)
}

// OwnerOfKey returns the primary that serves key's slot.
func (c *Cluster) OwnerOfKey(ctx context.Context, key string) (*Server, error) {
	slot, err := c.KeySlot(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.Owner(ctx, slot)
}

// Primaries returns the live primaries that serve slots.
func (c *Cluster) Primaries(ctx context.Context) ([]*Server, error) {
	nodes, err := c.topology(ctx)
	if err != nil {
		return nil, err
	}
	var ps []*Server
	for _, n := range nodes {
		if n.primary && !n.failed && len(n.slots) > 0 {
			if s := c.byAddr(n.addr); s != nil {
				ps = append(ps, s)
			}
		}
	}
	return ps, nil
}

// Kill kills node s with SIGKILL (its data is lost) and remembers it as
// dead, so that KeySlot, Owner and WaitHealthy ask the others.
func (c *Cluster) Kill(s *Server) {
	c.mu.Lock()
	c.killed[s] = true
	c.mu.Unlock()
	s.Kill()
}

// KillPrimary kills the primary that serves slot and returns it. Its
// replica is promoted after about NodeTimeout; WaitHealthy waits for that.
func (c *Cluster) KillPrimary(ctx context.Context, slot int) (*Server, error) {
	s, err := c.Owner(ctx, slot)
	if err != nil {
		return nil, err
	}
	c.Kill(s)
	return s, nil
}

// WaitHealthy waits until every live node reports cluster_state:ok with all
// 16384 slots assigned and served by live primaries, and every live replica
// of a live primary is in sync (master_link_status:up). After KillPrimary it
// returns once the replica has been promoted and the others agree.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	var last string
	for {
		ok, why := c.healthy(ctx)
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster not healthy: %s (%w)", last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) (bool, string) {
	live := c.Live()
	liveAddr := map[string]bool{}
	for _, s := range live {
		liveAddr[s.Addr] = true
	}
	for _, s := range live {
		v, err := s.Do(ctx, "CLUSTER", "INFO")
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER INFO: %v", s.Addr, err)
		}
		info, _ := v.(string)
		if !strings.Contains(info, "cluster_state:ok") {
			return false, s.Addr + ": cluster_state is not ok"
		}
		if !strings.Contains(info, "cluster_slots_assigned:16384") {
			return false, s.Addr + ": not all slots assigned"
		}
		if !strings.Contains(info, "cluster_slots_ok:16384") {
			return false, s.Addr + ": not all slots ok"
		}
		v, err = s.Do(ctx, "CLUSTER", "NODES")
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER NODES: %v", s.Addr, err)
		}
		text, _ := v.(string)
		served := 0
		for _, n := range parseClusterNodes(text) {
			if !n.primary || len(n.slots) == 0 {
				continue
			}
			if !liveAddr[n.addr] || n.failed {
				return false, fmt.Sprintf("%s: sees slots served by dead or failing %s", s.Addr, n.addr)
			}
			for _, r := range n.slots {
				served += r[1] - r[0] + 1
			}
		}
		if served != 16384 {
			return false, fmt.Sprintf("%s: sees %d slots served", s.Addr, served)
		}
		v, err = s.Do(ctx, "INFO", "replication")
		if err != nil {
			return false, fmt.Sprintf("%s: INFO replication: %v", s.Addr, err)
		}
		repl, _ := v.(string)
		if strings.Contains(repl, "role:slave") {
			host, port := field(repl, "master_host"), field(repl, "master_port")
			if liveAddr[host+":"+port] && !strings.Contains(repl, "master_link_status:up") {
				return false, s.Addr + ": replica not in sync with " + host + ":" + port
			}
		}
	}
	return true, ""
}

func field(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// WaitReplicated waits until every replica connected to a live primary has
// acknowledged all of that primary's writes (its offset has reached the
// primary's master_repl_offset), so that a failover after it loses nothing
// written before it.
func (c *Cluster) WaitReplicated(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	for {
		behind := ""
		for _, s := range c.Live() {
			v, err := s.Do(ctx, "INFO", "replication")
			if err != nil {
				behind = fmt.Sprintf("%s: %v", s.Addr, err)
				break
			}
			info, _ := v.(string)
			if !strings.Contains(info, "role:master") {
				continue
			}
			want, _ := strconv.ParseInt(field(info, "master_repl_offset"), 10, 64)
			for i := 0; ; i++ {
				line := field(info, "slave"+strconv.Itoa(i))
				if line == "" {
					break
				}
				for _, kv := range strings.Split(line, ",") {
					if off, ok := strings.CutPrefix(kv, "offset="); ok {
						if n, _ := strconv.ParseInt(off, 10, 64); n < want {
							behind = fmt.Sprintf("%s: replica %d at offset %d of %d", s.Addr, i, n, want)
						}
					}
				}
			}
		}
		if behind == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: replicas not in sync: %s (%w)", behind, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Revive restarts a node killed with Kill or KillPrimary on the same port
// and directory, so it rejoins with its old identity (from nodes.conf) and
// becomes a replica of whichever node took over its slots; then it waits
// until the cluster is healthy again.
func (c *Cluster) Revive(ctx context.Context, s *Server) error {
	if err := s.Restart(); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.killed, s)
	c.mu.Unlock()
	return c.WaitHealthy(ctx)
}
