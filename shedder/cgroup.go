package shedder

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cgroupCPU is the Source of NewCgroupCPU.
type cgroupCPU struct {
	cfg     cgroupConfig
	version int
	// v2: quota files are cpu.max from quotaDir up to quotaTop; usage is
	// usagePath. v1: the same with cpu.cfs_quota_us / cpu.cfs_period_us.
	quotaDir, quotaTop string
	usagePath          string

	mu        sync.Mutex
	have      bool
	lastUsage time.Duration
	lastAt    time.Time
	last      float64
}

// errNoCgroup is returned by NewCgroupCPU when no cgroup CPU accounting is
// found (not Linux, or no cgroup filesystem).
var errNoCgroup = errors.New("shedder: no cgroup CPU accounting found")

// NewCgroupCPU finds this process's cgroup (from /proc/self/cgroup, under
// /sys/fs/cgroup) and returns a Source (for WorkerSettings.Sources) that
// reads its CPU utilization against the cgroup's CPU quota rather than the
// host's CPU count: a container limited to 2 CPUs on a 64-core host is
// saturated at 2 cores of usage, not at 64 (the bug of shedders that read
// host CPUs). The first reading is 0; each later one is the CPU used since
// the previous one over the time passed times the limit.
//
// It understands cgroup v2 (cpu.max and the usage_usec line of cpu.stat)
// and cgroup v1 (cpu.cfs_quota_us / cpu.cfs_period_us and
// cpuacct.usage). The quota is the smallest one on the path from the
// process's cgroup up to the root of the hierarchy, since a parent's quota
// caps its children; with no quota anywhere the limit is the number of
// CPUs the process may run on (runtime.NumCPU). Quotas are re-read on every
// reading, so a resized container is followed. The Source is safe for
// concurrent use.
//
// It fails when there is no cgroup CPU accounting to read (not Linux, or
// no cgroup filesystem): run the Worker without it then.
func NewCgroupCPU() (Source, error) {
	c, err := newCgroupCPU(cgroupConfig{root: "/sys/fs/cgroup", procFile: "/proc/self/cgroup", now: time.Now, hostCPUs: runtime.NumCPU()})
	if err != nil {
		return nil, err // not a nil *cgroupCPU in a non-nil Source
	}
	return c, nil
}

// newCgroupCPU is NewCgroupCPU reading cfg's files (tests point it at
// fixture trees) with cfg's clock and host CPUs.
func newCgroupCPU(cfg cgroupConfig) (*cgroupCPU, error) {
	if cfg.now == nil {
		return nil, fmt.Errorf("shedder: cgroup clock is nil")
	}
	if cfg.hostCPUs < 1 {
		return nil, fmt.Errorf("shedder: cgroup host CPUs %d must be positive", cfg.hostCPUs)
	}
	c := &cgroupCPU{cfg: cfg}
	paths, err := parseProcCgroup(cfg.procFile)
	if err != nil {
		return nil, err
	}
	if exists(filepath.Join(cfg.root, "cgroup.controllers")) {
		c.version = 2
		dir := within(cfg.root, paths["2"])
		c.quotaDir, c.quotaTop = dir, cfg.root
		c.usagePath = filepath.Join(dir, "cpu.stat")
	} else {
		c.version = 1
		cpuMount := firstDir(cfg.root, "cpu", "cpu,cpuacct", "cpuacct,cpu")
		acctMount := firstDir(cfg.root, "cpuacct", "cpu,cpuacct", "cpuacct,cpu")
		if cpuMount == "" || acctMount == "" {
			return nil, fmt.Errorf("%w under %s", errNoCgroup, cfg.root)
		}
		c.quotaDir, c.quotaTop = within(cpuMount, paths["cpu"]), cpuMount
		c.usagePath = filepath.Join(within(acctMount, paths["cpuacct"]), "cpuacct.usage")
	}
	if _, err := c.readUsage(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoCgroup, err)
	}
	return c, nil
}

// Version returns the cgroup version read, 1 or 2.
func (c *cgroupCPU) Version() int { return c.version }

// Limit returns the CPU limit in cores: the tightest quota on the cgroup
// path, or the host CPUs when none is set.
func (c *cgroupCPU) Limit() (float64, error) {
	limit := math.Inf(1)
	for dir := c.quotaDir; ; dir = filepath.Dir(dir) {
		q, ok, err := c.readQuota(dir)
		if err != nil {
			return 0, err
		}
		if ok {
			limit = min(limit, q)
		}
		if dir == c.quotaTop || len(dir) <= len(c.quotaTop) {
			break
		}
	}
	if math.IsInf(limit, 1) {
		return float64(c.cfg.hostCPUs), nil
	}
	return limit, nil
}

// Utilization returns the CPU used since the previous call divided by the
// limit over the same wall time: 1 means the quota is used up. The first
// call only takes a baseline and returns 0.
func (c *cgroupCPU) Utilization() (float64, error) {
	usage, err := c.readUsage()
	if err != nil {
		return 0, err
	}
	limit, err := c.Limit()
	if err != nil {
		return 0, err
	}
	now := c.cfg.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		c.have, c.lastUsage, c.lastAt = true, usage, now
		return 0, nil
	}
	wall := now.Sub(c.lastAt)
	if wall <= 0 {
		return c.last, nil
	}
	used := usage - c.lastUsage
	if used < 0 { // the cgroup was recreated: start again
		used = 0
	}
	c.lastUsage, c.lastAt = usage, now
	c.last = float64(used) / (float64(wall) * limit)
	return c.last, nil
}

// readQuota returns the quota of one cgroup directory in cores, and false
// when it sets none.
func (c *cgroupCPU) readQuota(dir string) (float64, bool, error) {
	if c.version == 2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if errors.Is(err, os.ErrNotExist) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("shedder: read cpu.max: %w", err)
		}
		f := strings.Fields(string(b))
		if len(f) == 0 || len(f) > 2 {
			return 0, false, fmt.Errorf("shedder: %s: malformed cpu.max %q", dir, b)
		}
		if f[0] == "max" {
			return 0, false, nil
		}
		period := int64(100000) // the kernel's default when only the quota is written
		if len(f) == 2 {
			if period, err = strconv.ParseInt(f[1], 10, 64); err != nil || period <= 0 {
				return 0, false, fmt.Errorf("shedder: %s: malformed cpu.max period %q", dir, f[1])
			}
		}
		quota, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || quota <= 0 {
			return 0, false, fmt.Errorf("shedder: %s: malformed cpu.max quota %q", dir, f[0])
		}
		return float64(quota) / float64(period), true, nil
	}
	qb, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shedder: read cpu.cfs_quota_us: %w", err)
	}
	quota, err := strconv.ParseInt(strings.TrimSpace(string(qb)), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("shedder: %s: malformed cpu.cfs_quota_us %q", dir, qb)
	}
	if quota < 0 { // -1: no quota
		return 0, false, nil
	}
	pb, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
	if err != nil {
		return 0, false, fmt.Errorf("shedder: read cpu.cfs_period_us: %w", err)
	}
	period, err := strconv.ParseInt(strings.TrimSpace(string(pb)), 10, 64)
	if err != nil || period <= 0 || quota == 0 {
		return 0, false, fmt.Errorf("shedder: %s: malformed cfs quota %d / period %q", dir, quota, pb)
	}
	return float64(quota) / float64(period), true, nil
}

// readUsage returns the cgroup's cumulative CPU time.
func (c *cgroupCPU) readUsage() (time.Duration, error) {
	b, err := os.ReadFile(c.usagePath)
	if err != nil {
		return 0, fmt.Errorf("shedder: read cgroup usage: %w", err)
	}
	if c.version == 1 {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || ns < 0 {
			return 0, fmt.Errorf("shedder: %s: malformed cpuacct.usage %q", c.usagePath, b)
		}
		return time.Duration(ns), nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "usage_usec" {
			us, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || us < 0 || us > math.MaxInt64/1000 {
				return 0, fmt.Errorf("shedder: %s: malformed usage_usec %q", c.usagePath, f[1])
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("shedder: %s has no usage_usec line", c.usagePath)
}

// parseProcCgroup reads /proc/self/cgroup: "hierarchy-id:controllers:path"
// lines. The v2 line ("0::/path") is returned under "2", each v1
// controller under its name.
func parseProcCgroup(file string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoCgroup, err)
	}
	paths := make(map[string]string)
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			paths["2"] = parts[2]
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			paths[ctl] = parts[2]
		}
	}
	return paths, nil
}

// within returns mount joined with the cgroup path when that directory
// exists, else mount itself: inside a container with a cgroup namespace the
// process's own cgroup is mounted at the root, while /proc/self/cgroup may
// still name the host path.
func within(mount, path string) string {
	if path != "" && path != "/" {
		dir := filepath.Join(mount, filepath.FromSlash(path))
		if exists(dir) {
			return dir
		}
	}
	return mount
}

func firstDir(root string, names ...string) string {
	for _, n := range names {
		if d := filepath.Join(root, n); exists(d) {
			return d
		}
	}
	return ""
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

type cgroupConfig struct {
	root     string
	procFile string
	now      func() time.Time
	hostCPUs int
}
