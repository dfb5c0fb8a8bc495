package main

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spillway-go/spillway/bench/rlsload"
	"github.com/spillway-go/spillway/internal/genmd"
)

// ownWork picks the functions of the profile table: spillway's own code,
// the go-redis script call it makes, and the runtime's costs that the
// server's code causes (allocation, waiting, stack growth, goroutines,
// the clock). gRPC's and the network's share is the do-nothing server's
// too.
var ownWork = regexp.MustCompile(`^github\.com/spillway-go/spillway/|^github\.com/redis/go-redis/v9\.\(\*Script\)\.Run$|^runtime\.(mallocgc|selectgo|copystack|newproc|gcBgMarkWorker)$|^time\.Now$`)

// profileRows is the number of functions in each table.
const profileRows = 15

// pprofTop is one profile read by `go tool pprof -top -cum`: each
// function's cumulative CPU time and the profile's total.
type pprofTop struct {
	total time.Duration
	cum   map[string]time.Duration
}

var totalSamples = regexp.MustCompile(`Total samples = (\S+)`)

func readTop(path string) (*pprofTop, error) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=5000", path).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof %s: %w", path, err)
	}
	t := &pprofTop{cum: map[string]time.Duration{}}
	if m := totalSamples.FindSubmatch(out); m != nil {
		t.total, _ = time.ParseDuration(string(m[1]))
	}
	table := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if !table {
			table = len(f) >= 5 && f[0] == "flat" && f[4] == "cum%"
			continue
		}
		if len(f) < 6 {
			continue
		}
		cum, err := time.ParseDuration(f[3])
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(strings.Join(f[5:], " "), " (inline)")
		t.cum[name] = max(t.cum[name], cum)
	}
	if t.total <= 0 {
		return nil, fmt.Errorf("go tool pprof %s: no samples", path)
	}
	return t, nil
}

// profileMarkdown is the -profile-md table: for each descriptor count,
// the functions of ownWork with the most CPU per call in the profiles of
// the first round, before (base, when -base-src is given) and after
// (spillway), in µs per call and as a share of the server's CPU.
func profileMarkdown(counts []int, results map[key][]*rlsload.Result) (string, error) {
	servers := []string{"spillway"}
	heads := []string{"function", "this checkout: µs/call (share)"}
	if *baseSrc != "" {
		servers = []string{"base", "spillway"}
		heads = []string{"function", "before (" + srcCommit(*baseSrc) + "): µs/call (share)", "after (" + srcCommit(*spillwaySrc) + "): µs/call (share)"}
	}
	secs := float64(max(1, int((*duration / 2).Seconds()))) // takeProfile's length
	var sb strings.Builder
	fmt.Fprintf(&sb, "CPU profile of the server (the middle %v of each window of the run's first round: %d callers over %d connections, %d keys, %s): the functions of spillway, its go-redis script call and the runtime costs its code causes, by cumulative CPU per call (the profile's time over its calls; a function's time includes the functions it calls; of functions with the same time in every profile, a wrapper and what it calls, only the first is shown); *all* is the whole server, gRPC included.\n",
		time.Duration(secs)*time.Second, *callers, *conns, *keys, loop())
	for _, n := range counts {
		tops := make([]*pprofTop, len(servers))
		perCall := make([]float64, len(servers)) // µs of CPU per second of profile, over calls/s
		for i, name := range servers {
			rs := results[key{name, n}]
			if len(rs) == 0 {
				return "", fmt.Errorf("-profile-md: no results for %s at %d descriptors", name, n)
			}
			t, err := readTop(fmt.Sprintf("%s-%s-%d.pprof", *profile, name, n))
			if err != nil {
				return "", err
			}
			tops[i], perCall[i] = t, 1e6/(secs*rs[0].PerSecond())
		}
		var fns []string
		for _, t := range tops {
			for name := range t.cum {
				if ownWork.MatchString(name) && !slices.Contains(fns, name) {
					fns = append(fns, name)
				}
			}
		}
		most := func(fn string) float64 {
			m := 0.0
			for i, t := range tops {
				m = max(m, t.cum[fn].Seconds()*perCall[i])
			}
			return m
		}
		slices.SortFunc(fns, func(a, b string) int {
			if c := cmp.Compare(most(b), most(a)); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		// a wrapper and the one function it calls have the same time in
		// every profile: one row says it
		same := func(a, b string) bool {
			for _, t := range tops {
				if t.cum[a] != t.cum[b] {
					return false
				}
			}
			return true
		}
		var rowsFns []string
		for _, fn := range fns {
			if len(rowsFns) == profileRows {
				break
			}
			if !slices.ContainsFunc(rowsFns, func(r string) bool { return same(r, fn) }) {
				rowsFns = append(rowsFns, fn)
			}
		}
		fns = rowsFns
		cell := func(i int, d time.Duration) string {
			return fmt.Sprintf("%.1f (%.1f%%)", d.Seconds()*perCall[i], 100*d.Seconds()/tops[i].total.Seconds())
		}
		row := []string{"*all*"}
		for i, t := range tops {
			row = append(row, cell(i, t.total))
		}
		rows := [][]string{row}
		for _, fn := range fns {
			row := []string{"`" + strings.TrimPrefix(fn, "github.com/spillway-go/spillway/") + "`"}
			for i, t := range tops {
				row = append(row, cell(i, t.cum[fn]))
			}
			rows = append(rows, row)
		}
		fmt.Fprintf(&sb, "\n%d descriptor(s):\n\n%s", n, genmd.Table(heads, rows))
	}
	return sb.String(), nil
}

// srcCommit is the short commit of a checkout's HEAD ("+dirty" with
// uncommitted changes), as genmd.Commit says it of this one.
func srcCommit(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}
