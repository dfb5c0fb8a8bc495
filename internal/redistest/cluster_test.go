package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestClusterStartFailover(t *testing.T) {
	start := time.Now()
	c := StartCluster(t)
	t.Logf("cluster up in %v", time.Since(start))
	ctx := context.Background()

	ps, err := c.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("primaries = %d, want 3", len(ps))
	}

	cc := c.Client(t)
	// Keys with different hash tags land on different primaries.
	owners := map[string]bool{}
	for i := 0; i < 30; i++ {
		key := fmt.Sprintf("k:{%d}", i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
		o, err := c.OwnerOfKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		owners[o.Addr] = true
	}
	if len(owners) != 3 {
		t.Fatalf("30 keys landed on %d primaries, want 3", len(owners))
	}
	// CLUSTER KEYSLOT agrees with the hash tag rule.
	a, err := c.KeySlot(ctx, "x:{same}")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.KeySlot(ctx, "y:{same}")
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("slots of one tag differ: %d %d", a, b)
	}
	if a < 0 || a > 16383 {
		t.Fatalf("slot %d out of range", a)
	}

	if err := c.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	// Kill the primary of one key; its replica takes over and the same
	// client carries on without being rebuilt.
	slot, err := c.KeySlot(ctx, "k:{0}")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := c.KillPrimary(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover took %v", time.Since(killed))
	owner, err := c.Owner(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	if owner == dead {
		t.Fatalf("slot %d still served by the killed node %s", slot, dead.Addr)
	}
	if len(c.Live()) != 5 {
		t.Fatalf("live = %d, want 5", len(c.Live()))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := cc.Incr(ctx, "k:{0}").Result()
		if err == nil {
			// The write before the kill was replicated: 0 + 1.
			if n != 1 {
				t.Fatalf("after failover k:{0} = %d, want 1", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client did not recover after failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The killed node comes back as a replica of its successor.
	if err := c.Revive(ctx, dead); err != nil {
		t.Fatal(err)
	}
	if len(c.Live()) != 6 {
		t.Fatalf("live = %d, want 6", len(c.Live()))
	}
	ps, err = c.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p == dead {
			t.Fatal("revived node is a primary")
		}
	}
	if len(ps) != 3 {
		t.Fatalf("primaries after revival = %d, want 3", len(ps))
	}
}

func TestParseClusterNodes(t *testing.T) {
	text := "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected\n" +
		"e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-abc]\n" +
		"292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master,fail - 0 1426238318243 3 connected 10923-16383\n"
	nodes := parseClusterNodes(text)
	if len(nodes) != 3 {
		t.Fatalf("nodes = %d", len(nodes))
	}
	if nodes[0].primary || nodes[0].addr != "127.0.0.1:30004" || nodes[0].master != "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca" {
		t.Fatalf("replica parsed as %+v", nodes[0])
	}
	if !nodes[1].primary || !nodes[1].myself || len(nodes[1].slots) != 2 || nodes[1].slots[0] != [2]int{0, 5460} || nodes[1].slots[1] != [2]int{7000, 7000} {
		t.Fatalf("primary parsed as %+v", nodes[1])
	}
	if !nodes[2].failed || nodes[2].slots[0] != [2]int{10923, 16383} {
		t.Fatalf("failed primary parsed as %+v", nodes[2])
	}
}

func TestCLIBinaryMissing(t *testing.T) {
	t.Setenv("SPILLWAY_REDIS_CLI", "")
	t.Setenv("PATH", t.TempDir())
	_, err := CLIBinary()
	if err == nil {
		t.Fatal("CLIBinary found redis-cli on an empty PATH")
	}
	const want = "redistest: redis-cli is not installed; the Cluster tests need it to join the nodes"
	if !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %q, want prefix %q", err, want)
	}
	t.Setenv("SPILLWAY_REDIS_CLI", "/opt/redis/bin/redis-cli")
	if p, err := CLIBinary(); err != nil || p != "/opt/redis/bin/redis-cli" {
		t.Fatalf("CLIBinary with SPILLWAY_REDIS_CLI = %q, %v", p, err)
	}
}
