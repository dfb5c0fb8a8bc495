package main

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
	total time.Duration // planned load time of the whole scenario
	done  time.Duration // finished configurations
	last  string
}

// NewProgress returns a progress bar for total planned load time on w
// (nil: silent).
func NewProgress(w io.Writer, total time.Duration) *Progress {
	p := &Progress{w: w, total: total}
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
	frac := 0.0
	if p.total > 0 {
		frac = min(1, float64(p.done+elapsed)/float64(p.total))
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("█", n) + strings.Repeat("░", width-n)
	line := fmt.Sprintf("%s %3.0f%% %-28s %s", bar, frac*100, label, phase)
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\033[K", line)
		return
	}
	key := label + "/" + phase
	if key != p.last {
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

// Close ends the bar's line.
func (p *Progress) Close() {
	if p == nil || p.w == nil {
		return
	}
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
