package shedder_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/testclock"
	"github.com/spillway-go/spillway/shedder"
)

// copyFixture copies testdata/name into a temporary directory so a test can
// change the usage files.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	src := filepath.Join("testdata", name)
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newCgroup(t *testing.T, dir string, clk *testclock.Clock) *shedder.CgroupCPU {
	t.Helper()
	c, err := shedder.NewCgroupCPUWith(
		shedder.WithRoot(filepath.Join(dir, "fs")),
		shedder.WithProcFile(filepath.Join(dir, "proc_self_cgroup")),
		shedder.WithCgroupClock(clk.Now),
		shedder.WithHostCPUs(64),
	)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCgroupV2(t *testing.T) {
	dir := copyFixture(t, "cgroupv2")
	clk := newClock()
	c := newCgroup(t, dir, clk)
	if c.Version() != 2 {
		t.Fatalf("version %d, want 2", c.Version())
	}
	// ctr has 1.5 cores, its pod 3, the slice none: 1.5, not the host's 64.
	if l, err := c.Limit(); err != nil || l != 1.5 {
		t.Fatalf("limit %v, %v; want 1.5", l, err)
	}
	if u, err := c.Utilization(); err != nil || u != 0 {
		t.Fatalf("first reading %v, %v; want 0 (baseline)", u, err)
	}
	// 1.2 s of CPU in 1 s of wall time against 1.5 cores: 0.8.
	stat := filepath.Join(dir, "fs/kubepods.slice/pod1/ctr/cpu.stat")
	write(t, stat, "usage_usec 2200000\nuser_usec 1000000\nsystem_usec 1200000\n")
	clk.Advance(time.Second)
	if u, err := c.Utilization(); err != nil || math.Abs(u-0.8) > 1e-12 {
		t.Fatalf("utilization %v, %v; want 0.8", u, err)
	}
	// A parent's tighter quota wins: the pod is cut to 1 core.
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/cpu.max"), "100000 100000\n")
	write(t, stat, "usage_usec 3200000\n")
	clk.Advance(time.Second)
	if u, err := c.Utilization(); err != nil || u != 1 {
		t.Fatalf("utilization %v, %v; want 1 under the pod's 1-core quota", u, err)
	}
	// No quota anywhere: the host CPUs.
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/cpu.max"), "max 100000\n")
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/ctr/cpu.max"), "max 100000\n")
	if l, _ := c.Limit(); l != 64 {
		t.Fatalf("limit without quota %v, want 64 host CPUs", l)
	}
	// A quota written without a period uses the kernel's 100ms.
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/ctr/cpu.max"), "250000\n")
	if l, _ := c.Limit(); l != 2.5 {
		t.Fatalf("limit %v, want 2.5", l)
	}
	// Malformed files are errors, never panics or silent zeros.
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/ctr/cpu.max"), "lots 100000\n")
	if _, err := c.Utilization(); err == nil {
		t.Fatal("malformed cpu.max accepted")
	}
	write(t, filepath.Join(dir, "fs/kubepods.slice/pod1/ctr/cpu.max"), "max 100000\n")
	write(t, stat, "user_usec 1\n")
	if _, err := c.Utilization(); err == nil {
		t.Fatal("cpu.stat without usage_usec accepted")
	}
	// Time not moving returns the last reading.
	write(t, stat, "usage_usec 9200000\n")
	if u, err := c.Utilization(); err != nil || u != 1 {
		t.Fatalf("reading at the same instant %v, %v; want the last (1)", u, err)
	}
}

// Inside a container with a cgroup namespace the process's cgroup is the
// root of the mount.
func TestCgroupV2Namespace(t *testing.T) {
	dir := copyFixture(t, "cgroupv2ns")
	clk := newClock()
	c := newCgroup(t, dir, clk)
	if l, err := c.Limit(); err != nil || l != 2 {
		t.Fatalf("limit %v, %v; want 2", l, err)
	}
	c.Utilization()
	write(t, filepath.Join(dir, "fs/cpu.stat"), "usage_usec 5500000\n")
	clk.Advance(500 * time.Millisecond)
	if u, err := c.Utilization(); err != nil || u != 0.5 {
		t.Fatalf("utilization %v, %v; want 0.5", u, err)
	}
}

func TestCgroupV1(t *testing.T) {
	dir := copyFixture(t, "cgroupv1")
	clk := newClock()
	c := newCgroup(t, dir, clk)
	if c.Version() != 1 {
		t.Fatalf("version %d, want 1", c.Version())
	}
	if l, err := c.Limit(); err != nil || l != 0.5 {
		t.Fatalf("limit %v, %v; want 0.5", l, err)
	}
	c.Utilization()
	// 0.75 s of CPU (in ns) in 1 s against half a core: 1.5, overloaded.
	usage := filepath.Join(dir, "fs/cpu,cpuacct/docker/abc/cpuacct.usage")
	write(t, usage, "124206789000\n")
	clk.Advance(time.Second)
	if u, err := c.Utilization(); err != nil || u != 1.5 {
		t.Fatalf("utilization %v, %v; want 1.5", u, err)
	}
	// -1 is no quota; with none up the path, the host CPUs.
	write(t, filepath.Join(dir, "fs/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"), "-1\n")
	if l, _ := c.Limit(); l != 64 {
		t.Fatalf("limit %v, want 64", l)
	}
	// A parent's quota caps the child.
	write(t, filepath.Join(dir, "fs/cpu,cpuacct/docker/cpu.cfs_quota_us"), "400000\n")
	if l, _ := c.Limit(); l != 4 {
		t.Fatalf("limit %v, want 4 from the parent", l)
	}
	// A counter that went backwards (cgroup recreated) reads as idle.
	write(t, usage, "1000\n")
	clk.Advance(time.Second)
	if u, err := c.Utilization(); err != nil || u != 0 {
		t.Fatalf("utilization %v, %v; want 0 after a counter reset", u, err)
	}
	write(t, usage, "garbage\n")
	if _, err := c.Utilization(); err == nil {
		t.Fatal("malformed cpuacct.usage accepted")
	}
}

func TestCgroupMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := shedder.NewCgroupCPUWith(shedder.WithRoot(dir), shedder.WithProcFile(filepath.Join(dir, "nope")))
	if !errors.Is(err, shedder.ErrNoCgroup) {
		t.Fatalf("err %v, want ErrNoCgroup", err)
	}
	write(t, filepath.Join(dir, "proc"), "0::/\n")
	_, err = shedder.NewCgroupCPUWith(shedder.WithRoot(dir), shedder.WithProcFile(filepath.Join(dir, "proc")))
	if !errors.Is(err, shedder.ErrNoCgroup) {
		t.Fatalf("err %v, want ErrNoCgroup", err)
	}
}

// A CgroupCPU plugs into a Worker as a Source.
func TestWorkerWithCgroupSource(t *testing.T) {
	dir := copyFixture(t, "cgroupv2ns")
	clk := newClock()
	c := newCgroup(t, dir, clk)
	w, err := shedder.NewWorker(100, shedder.WorkerSettings{Clock: clk.Now, Sources: []shedder.Source{c}})
	if err != nil {
		t.Fatal(err)
	}
	driveTick := func() {
		clk.Advance(100 * time.Millisecond)
		_, done, _ := w.Admit(t.Context(), criticalPlus())
		done(0)
	}
	driveTick()                                                         // baseline
	write(t, filepath.Join(dir, "fs/cpu.stat"), "usage_usec 5190000\n") // 0.19 s in 0.1 s on 2 cores: 0.95
	driveTick()
	if u := w.Utilization(); math.Abs(u-0.95) > 1e-9 {
		t.Fatalf("worker utilization %v, want 0.95 from the cgroup", u)
	}
	if l := w.Level(); l != 0.25 {
		t.Fatalf("level %v, want one step up", l)
	}
}

// Whatever cpu.max and cpu.stat hold, reading them returns a limit > 0 and a
// non-negative utilization, or an error; never a panic.
func FuzzCgroupV2Files(f *testing.F) {
	f.Add("150000 100000\n", "usage_usec 1000\n")
	f.Add("max\n", "usage_usec 0\n")
	f.Add("0 0", "usage_usec -5")
	f.Add("99999999999999999999 1", "usage_usec 99999999999999999999")
	f.Fuzz(func(t *testing.T, cpuMax, cpuStat string) {
		dir := t.TempDir()
		write(t, filepath.Join(dir, "proc"), "0::/\n")
		write(t, filepath.Join(dir, "cgroup.controllers"), "cpu\n")
		write(t, filepath.Join(dir, "cpu.max"), cpuMax)
		write(t, filepath.Join(dir, "cpu.stat"), "usage_usec 1\n")
		clk := newClock()
		c, err := shedder.NewCgroupCPUWith(shedder.WithRoot(dir), shedder.WithProcFile(filepath.Join(dir, "proc")), shedder.WithCgroupClock(clk.Now))
		if err != nil {
			t.Fatal(err)
		}
		if l, err := c.Limit(); err == nil && !(l > 0) {
			t.Fatalf("cpu.max %q: limit %v", cpuMax, l)
		}
		c.Utilization()
		write(t, filepath.Join(dir, "cpu.stat"), cpuStat)
		clk.Advance(time.Second)
		if u, err := c.Utilization(); err == nil && (u < 0 || math.IsNaN(u)) {
			t.Fatalf("cpu.max %q, cpu.stat %q: utilization %v", cpuMax, cpuStat, u)
		}
	})
}
