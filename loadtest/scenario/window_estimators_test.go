package scenario

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkWindowEstimators is a study, not a timing: what a bucketed
// window would have to remember to decide within 1% of the exact log on
// sources at 0.8–1.2× their limit. It replays the accuracy scenario's
// near-limit population (same seed, 100 sources, 30 simulated minutes)
// on an exact log and on estimators that are not in the library — the
// oldest sub-window's count rounded instead of floored, and sub-windows
// that also keep the offsets of their first and last admission
// (exactly, or in Q quanta of the sub-window) — each judged as
// compareWindows judges the library's: one step on the log's own
// history, and replayed independently.
//
//	cd loadtest && go test -run '^$' -bench WindowEstimators -benchtime 1x ./scenario/
func BenchmarkWindowEstimators(b *testing.B) {
	type row struct {
		limit   int64
		n, q    int64
		variant string
	}
	rows := []row{
		{100, 10, 0, "floor"}, {100, 10, 0, "round"}, {100, 10, 0, "first/last"},
		{100, 20, 0, "first/last"}, {100, 40, 0, "first/last"},
		{100, 50, 0, "floor"}, {100, 50, 0, "round"}, {100, 50, 0, "first/last"},
		{100, 50, 16, "first/last"}, {100, 50, 64, "first/last"}, {100, 50, 256, "first/last"},
		{1000, 10, 0, "floor"}, {1000, 50, 64, "first/last"}, {1000, 100, 0, "first/last"},
	}
	for b.Loop() {
		var sb strings.Builder
		fmt.Fprintf(&sb, "\n%-6s %-5s %-18s %9s %9s %9s %6s\n", "limit", "N", "oldest sub-window", "1-step", "1s.allow", "differ", "ratio")
		evs := map[int64][]traceEvent{}
		for _, r := range rows {
			ev, ok := evs[r.limit]
			if !ok {
				ev = poissonSources(1+7919, windowSources, 0.8, 1.2, r.limit, windowPeriod, 30*time.Minute)
				evs[r.limit] = ev
			}
			mk := func() *studyWindow {
				return newStudyWindow(windowPeriod.Microseconds(), r.limit, r.n, r.q, r.variant)
			}
			step, stepAllow, differ := studyReplay(ev, windowSources, windowPeriod.Microseconds(), r.limit, mk)
			name := r.variant
			if r.q > 0 {
				name = fmt.Sprintf("%s Q=%d", r.variant, r.q)
			}
			fmt.Fprintf(&sb, "%-6d %-5d %-18s %8.3f%% %8.3f%% %8.3f%% %6.2f\n", r.limit, r.n, name,
				100*step, 100*stepAllow, 100*differ, differ/max(step, 1e-9))
		}
		fmt.Print(sb.String()) // a table longer than b.Log shows
	}
}

// studyReplay returns the one-step error (and its wrongly-allowed part)
// and the independent replay's share of differing decisions.
func studyReplay(ev []traceEvent, sources int, period, limit int64, mk func() *studyWindow) (step, stepAllow, differ float64) {
	const epoch = 1_700_000_000_000_000 // compareWindows' clock
	logA, logB := make([][]int64, sources), make([][]int64, sources)
	estA, estB := make([]*studyWindow, sources), make([]*studyWindow, sources)
	for i := range sources {
		estA[i], estB[i] = mk(), mk()
	}
	fits := func(q []int64, t int64) ([]int64, bool) {
		i := 0
		for i < len(q) && q[i] <= t-period {
			i++
		}
		return q[i:], int64(len(q)-i) < limit
	}
	var s, sa, d int64
	for _, e := range ev {
		t, k := epoch+e.at, e.src
		var lf bool
		logA[k], lf = fits(logA[k], t)
		if ef := estA[k].estimate(t) < limit; ef != lf {
			s++
			if ef {
				sa++
			}
		}
		if lf {
			logA[k] = append(logA[k], t)
			estA[k].add(t)
		}
		logB[k], lf = fits(logB[k], t)
		ef := estB[k].estimate(t) < limit
		if ef != lf {
			d++
		}
		if lf {
			logB[k] = append(logB[k], t)
		}
		if ef {
			estB[k].add(t)
		}
	}
	n := float64(max(len(ev), 1))
	return float64(s) / n, float64(sa) / n, float64(d) / n
}

// studyWindow: N sub-windows of W µs, sub-window j = [j·W, (j+1)·W),
// each with its count and the offsets (µs, or quanta of W/q) of its first
// and last admission; the newest at index 0, h its sub-window.
type studyWindow struct {
	N, W, q int64
	variant string
	h       int64
	c, f, l []int64
}

func newStudyWindow(period, limit, n, q int64, variant string) *studyWindow {
	return &studyWindow{N: n, W: period / n, q: q, variant: variant,
		c: make([]int64, n+1), f: make([]int64, n+1), l: make([]int64, n+1)}
}

func (w *studyWindow) shift(k int64) {
	s := k - w.h
	if s <= 0 {
		return
	}
	for _, a := range [][]int64{w.c, w.f, w.l} {
		if s >= int64(len(a)) {
			clear(a)
		} else {
			copy(a[s:], a[:int64(len(a))-s])
			clear(a[:s])
		}
	}
	w.h = k
}

// estimate is the count the window believes is in (t − P, t].
func (w *studyWindow) estimate(t int64) int64 {
	k := t / w.W
	e := t - k*w.W
	w.shift(k)
	var full int64
	for _, c := range w.c[:w.N] {
		full += c
	}
	c, W := w.c[w.N], w.W
	switch w.variant {
	case "floor": // the library's Interpolated
		return full + c*(W-e)/W
	case "round":
		return full + (c*(W-e)+W/2)/W
	}
	// first/last: the entries at offsets > e are inside; the first and the
	// last are known, the c − 2 between them taken as evenly spread. In
	// quanta, positions in half quanta: an offset in quantum x at 2x+1.
	f, l := w.f[w.N], w.l[w.N]
	if w.q > 0 {
		e, f, l = e*2*w.q/W, 2*f+1, 2*l+1
	}
	switch {
	case c == 0 || e >= l:
		return full
	case e < f || f == l:
		return full + c
	}
	return full + 1 + ((c-2)*(l-e)+(l-f)/2)/(l-f)
}

func (w *studyWindow) add(t int64) {
	k := t / w.W
	w.shift(k)
	off := t - k*w.W
	if w.q > 0 {
		off = off * w.q / w.W
	}
	if w.c[0] == 0 {
		w.f[0] = off
	}
	w.l[0] = off
	w.c[0]++
}
