package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Debug counts what the harness prints for diagnosis (-debug): denials by
// priority and block, timings, the causes of degraded decisions. A nil
// *Debug counts nothing, so the counting costs nothing when it is off.
type Debug struct {
	mu sync.Mutex
	m  map[string]int64
}

// NewDebug returns an empty set of counters.
func NewDebug() *Debug { return &Debug{m: map[string]int64{}} }

// On reports whether d counts.
func (d *Debug) On() bool { return d != nil }

// Add adds delta to the counter key.
func (d *Debug) Add(key string, delta int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.m[key] += delta
	d.mu.Unlock()
}

// String returns the counters, one "key: value" a line, sorted by key.
func (d *Debug) String() string {
	if d == nil {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := make([]string, 0, len(d.m))
	for k := range d.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %d\n", k, d.m[k])
	}
	return b.String()
}
