package scenario

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress is a one-line progress bar on stderr. It is hand-written (a
// dozen lines) rather than a dependency: it needs to show the scenario,
// configuration and phase next to the bar, and nothing else. On a
// terminal it redraws in place; elsewhere (CI logs, tests) it prints one
// line per phase instead.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	total time.Duration // planned load time of everything the run does
	done  time.Duration // finished configurations
	last  string
	start time.Time // wall clock at the start
	label string    // last configuration shown
}

// NewProgress returns a progress bar for total planned load time on w
// (nil: silent).
func NewProgress(w io.Writer, total time.Duration) *Progress {
	p := &Progress{w: w, total: total, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// Update shows elapsed time into the current configuration.
func (p *Progress) Update(label, phase string, elapsed time.Duration) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = label
	p.draw(label, phase, p.done+elapsed, false)
}

// draw shows the bar for load time at out of the total; called with p.mu
// held. The time left is the load time left, scaled by how much longer
// than its load time the run has taken so far (start-up, draining).
func (p *Progress) draw(label, phase string, at time.Duration, final bool) {
	frac := 1.0
	if p.total > 0 {
		frac = min(1, float64(at)/float64(p.total))
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("█", n) + strings.Repeat("░", width-n)
	wall := time.Since(p.start)
	eta := ""
	switch {
	case final:
		eta = "done in " + wall.Round(time.Second).String()
	case at > 0:
		left := time.Duration(float64(p.total-at) * float64(wall) / float64(at))
		eta = "~" + left.Round(time.Second).String() + " left"
	}
	line := fmt.Sprintf("%s %3.0f%% %-14s %-30s %s", bar, frac*100, eta, label, phase)
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\033[K", line)
		return
	}
	key := label + "/" + phase
	if key != p.last || final {
		p.last = key
		fmt.Fprintln(p.w, line)
	}
}

// Finish marks a configuration of length d as done.
func (p *Progress) Finish(d time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done += d
	p.mu.Unlock()
}

// Close draws the bar at 100% and ends its line.
func (p *Progress) Close() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw(p.label, "", p.done, true)
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// Log prints a line above the bar.
func (p *Progress) Log(format string, args ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}
