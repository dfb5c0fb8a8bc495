package tiers

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

const watchV1 = `limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 3/hour
  - id: api
    endpoint: /api/*
    by: ip
    bucket: 5/hour
`

// watchV2 keeps login, halves api (a new policy: fresh counters) and adds
// search.
const watchV2 = `limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 3/hour
  - id: api
    endpoint: /api/*
    by: ip
    bucket: 2/hour
  - id: search
    endpoint: /search
    by: ip
    bucket: 1/hour
`

// watchBad is watchV2 with a typo on line 9.
const watchBad = `limits:
  - id: login
    endpoint: /login
    by: ip
    bucket: 3/hour
  - id: api
    endpoint: /api/*
    by: ip
    bucket: 2/hour, burts 4
`

const watchBadErr = `tiers: limits.yaml:9: bucket "2/hour, burts 4": want ", burst N" after the rate, got "burts 4"`

// reports records what a watcher reported.
type reports struct {
	mu      sync.Mutex
	errs    []error
	reloads []*Config
}

func (r *reports) opts() WatchSettings {
	return WatchSettings{
		OnReloadError: func(err error) { r.mu.Lock(); r.errs = append(r.errs, err); r.mu.Unlock() },
		OnReload:      func(c *Config) { r.mu.Lock(); r.reloads = append(r.reloads, c); r.mu.Unlock() },
	}
}

func (r *reports) counts() (errs, reloads int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs), len(r.reloads)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// outcome is the part of a decision the watch tests compare.
type outcome struct {
	Allowed   bool
	Limiter   string
	Limit     int64
	Remaining int64
}

func admitOutcome(t *testing.T, l *Limiter, endpoint, ip string) outcome {
	t.Helper()
	d, _, err := l.Admit(context.Background(), req("GET", endpoint, "ip", ip))
	if err != nil {
		t.Fatalf("Admit %s: %v", endpoint, err)
	}
	return outcome{d.Allowed, d.Limiter, d.Limit, d.Remaining}
}

func admitSteps(t *testing.T, l *Limiter, what string, steps []admitStep) {
	t.Helper()
	for i, s := range steps {
		if got := admitOutcome(t, l, s.endpoint, "10.0.0.1"); got != s.want {
			t.Fatalf("%s, step %d (%s): got %+v, want %+v", what, i, s.endpoint, got, s.want)
		}
	}
}

type admitStep struct {
	endpoint string
	want     outcome
}

func checkWant(t *testing.T, w *watcher, what string, wantReloaded bool, wantErr string) {
	t.Helper()
	reloaded, err := w.Check()
	got := ""
	if err != nil {
		got = err.Error()
	}
	if reloaded != wantReloaded || got != wantErr {
		t.Fatalf("%s: Check() = %v, %q; want %v, %q", what, reloaded, got, wantReloaded, wantErr)
	}
}

// TestWatchCheck walks one file through a good change, a bad change, a
// deletion and a restore, on the memory store and on a real redis-server,
// asserting the decisions enforced after each step.
func TestWatchCheck(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			clk := newClock()
			var store ratelimit.Store
			if backend == "memory" {
				store = ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: clk.Now})
			} else {
				store = mustRedisStore(redistest.Start(t).Client(t), ratelimit.RedisSettings{Clock: clk.Now})
			}
			testWatchCheck(t, store)
		})
	}
}

func testWatchCheck(t *testing.T, store ratelimit.Store) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, watchV1)
	cfg, err := ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(cfg, store, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	var rep reports
	w, err := newWatcher(l, path, rep.opts())
	if err != nil {
		t.Fatal(err)
	}

	// The first check applies the file: the same config, so nothing is lost.
	checkWant(t, w, "first check", true, "")
	checkWant(t, w, "no change", false, "")
	admitSteps(t, l, "v1", []admitStep{
		{"/login", outcome{true, "login", 3, 2}},
		{"/login", outcome{true, "login", 3, 1}},
		{"/api/x", outcome{true, "api", 5, 4}},
		{"/api/x", outcome{true, "api", 5, 3}},
		{"/search", outcome{true, "tiers", 0, 0}}, // no rule yet
	})

	// A good change: login (unchanged) keeps its counter and Stats, api
	// (new rate) starts full, search appears.
	writeFile(t, path, watchV2)
	checkWant(t, w, "v2", true, "")
	v2 := l.config()
	if len(v2.Rules) != 3 {
		t.Fatalf("after v2: %d rules, want 3", len(v2.Rules))
	}
	admitSteps(t, l, "v2", []admitStep{
		{"/login", outcome{true, "login", 3, 0}},
		{"/login", outcome{false, "login", 3, 0}},
		{"/api/x", outcome{true, "api", 2, 1}},
		{"/search", outcome{true, "search", 1, 0}},
	})
	if st := l.stats(); st["login"].Matched != 4 || st["login"].Denied != 1 || st["api"].Matched != 1 {
		t.Fatalf("stats after v2: %+v; want login matched 4, denied 1, api matched 1", st)
	}

	// A bad change: rejected with the line, reported once, v2 enforced.
	writeFile(t, path, watchBad)
	checkWant(t, w, "bad", false, watchBadErr)
	checkWant(t, w, "bad again", false, watchBadErr)
	if errs, reloads := rep.counts(); errs != 1 || reloads != 2 {
		t.Fatalf("after the bad file: %d errors and %d reloads reported; want 1 and 2", errs, reloads)
	}
	var ce *ConfigError
	if !errors.As(rep.errs[0], &ce) || ce.Line != 9 || ce.File != "limits.yaml" {
		t.Fatalf("reported error %v: want a *ConfigError for limits.yaml line 9", rep.errs[0])
	}
	if l.config() != v2 {
		t.Fatal("the bad file replaced the config")
	}
	admitSteps(t, l, "after bad", []admitStep{
		{"/login", outcome{false, "login", 3, 0}},
		{"/api/x", outcome{true, "api", 2, 0}},
		{"/api/x", outcome{false, "api", 2, 0}},
		{"/search", outcome{false, "search", 1, 0}},
	})

	// Deleted: reported (once), v2 still enforced.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		_, err := w.Check()
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("deleted, check %d: %v; want fs.ErrNotExist", i, err)
		}
	}
	if errs, _ := rep.counts(); errs != 2 {
		t.Fatalf("after deletion: %d errors reported, want 2", errs)
	}
	if l.config() != v2 {
		t.Fatal("the deletion replaced the config")
	}
	admitSteps(t, l, "deleted", []admitStep{{"/login", outcome{false, "login", 3, 0}}})

	// Restored as v2 (what is in use): nothing to reload.
	writeFile(t, path, watchV2)
	checkWant(t, w, "restored", false, "")
	if l.config() != v2 {
		t.Fatal("restoring the same content swapped the config")
	}

	// The bad content again after a good one is reported again.
	writeFile(t, path, watchBad)
	checkWant(t, w, "bad after good", false, watchBadErr)
	if errs, reloads := rep.counts(); errs != 3 || reloads != 2 {
		t.Fatalf("end: %d errors and %d reloads reported; want 3 and 2", errs, reloads)
	}

	// Replaced by rename (how editors and ConfigMaps write): back to v1,
	// api returns to its 5/hour counter, which kept its two charges.
	tmp := path + ".tmp"
	writeFile(t, tmp, watchV1)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "renamed v1", true, "")
	admitSteps(t, l, "v1 again", []admitStep{
		{"/api/x", outcome{true, "api", 5, 2}},
		{"/search", outcome{true, "tiers", 0, 0}},
	})
}

// TestWatchSkipsUnchangedStat: an old file whose stat has not changed is
// not read again; a changed stat is.
func TestWatchSkipsUnchangedStat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, watchV1)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	l := mustLimiter(t, watchV1, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	w, err := newWatcher(l, path, WatchSettings{OnReloadError: func(error) {}})
	if err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "first", true, "")
	// Same size, mtime restored: invisible to the stat, and not read.
	same := []byte(watchV1)
	same[len(same)-2] = '9' // "5/hour" → "5/hou9": invalid if it were read
	if err := os.WriteFile(path, same, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "stat unchanged", false, "")
	// A new mtime makes it read, and rejected.
	now := time.Now()
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "touched", false, `tiers: limits.yaml:9: bucket "5/hou9": unknown unit "hou9"`)
}

// TestWatchAfterForeignSwap: a config swapped in by someone else is
// replaced by the file's at the next check, even though the file did not
// change.
func TestWatchAfterForeignSwap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, watchV1)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	l := mustLimiter(t, watchV1, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	w, err := newWatcher(l, path, WatchSettings{OnReloadError: func(error) {}})
	if err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "first", true, "")
	checkWant(t, w, "unchanged", false, "")
	if err := l.reload("other.yaml", []byte(watchV2)); err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "after a foreign reload", true, "")
	if n := len(l.config().Rules); n != 2 {
		t.Fatalf("%d rules after the check, want the file's 2", n)
	}
	checkWant(t, w, "unchanged again", false, "")
}

func TestNewWatcherErrors(t *testing.T) {
	l := mustLimiter(t, watchV1, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	for _, c := range []struct {
		l    *Limiter
		path string
		opts WatchSettings
		want string
	}{
		{nil, "x.yaml", WatchSettings{}, "tiers: watch: nil limiter"},
		{l, "", WatchSettings{}, "tiers: watch: empty path"},
		{l, "x.yaml", WatchSettings{Interval: -time.Second}, "tiers: watch interval -1s must be positive"},
	} {
		_, err := newWatcher(c.l, c.path, c.opts)
		if err == nil || err.Error() != c.want {
			t.Errorf("newWatcher(%q): %v; want %q", c.path, err, c.want)
		}
	}
	dir := t.TempDir()
	w, err := newWatcher(l, dir, WatchSettings{OnReloadError: func(error) {}})
	if err != nil {
		t.Fatal(err)
	}
	checkWant(t, w, "directory", false, "tiers: watch: "+dir+" is not a regular file")
}

// TestWatchRunTicks drives Run's loop on synctest's fake clock: one check
// at start, one per interval, none after cancel, and Run returns (the
// bubble would report a leaked goroutine).
func TestWatchRunTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "limits.yaml")
		writeFile(t, path, watchV1)
		l := mustLimiter(t, watchV1, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
		var rep reports
		ws := rep.opts()
		ws.Interval = 10 * time.Second
		w, err := newWatcher(l, path, ws)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()
		synctest.Wait()
		if _, reloads := rep.counts(); reloads != 1 {
			t.Fatalf("after start: %d reloads, want 1 (the first check)", reloads)
		}
		writeFile(t, path, watchV2)
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if _, reloads := rep.counts(); reloads != 1 {
			t.Fatalf("before the first tick: %d reloads, want 1", reloads)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if _, reloads := rep.counts(); reloads != 2 || len(l.config().Rules) != 3 {
			t.Fatalf("after the first tick: %d reloads, %d rules; want 2 and 3", reloads, len(l.config().Rules))
		}
		writeFile(t, path, watchBad)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if errs, _ := rep.counts(); errs != 1 {
			t.Fatalf("after the bad file: %d errors, want 1", errs)
		}
		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v; want context.Canceled", err)
		}
		writeFile(t, path, watchV1)
		time.Sleep(time.Minute)
		synctest.Wait()
		if errs, reloads := rep.counts(); errs != 1 || reloads != 2 || len(l.config().Rules) != 3 {
			t.Fatalf("after cancel: %d errors, %d reloads, %d rules; want 1, 2, 3", errs, reloads, len(l.config().Rules))
		}
	})
}

// TestWatchRealLoop runs Limiter.Watch on real time: a change is applied
// and a cancel ends it.
func TestWatchRealLoop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, watchV1)
	l := mustLimiter(t, watchV1, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 16)
	ran := make(chan error, 1)
	go func() {
		ran <- l.Watch(ctx, path, WatchSettings{Interval: 20 * time.Millisecond, OnReloadError: func(err error) { errs <- err }})
	}()
	// Replace the file atomically, as a deploy should: an in-place write
	// can be read half-written (rejected and reported, then applied whole
	// at the next check).
	writeFile(t, path+".tmp", watchV2)
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(l.config().Rules) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the change was not applied within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d, _, err := l.Admit(ctx, req("GET", "/search", "ip", "10.0.0.1"))
	if err != nil || !d.Allowed || d.Limiter != "search" || d.Remaining != 0 {
		t.Fatalf("after the change: %+v, %v; want allowed by search with 0 left", d, err)
	}
	cancel()
	select {
	case err := <-ran:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch returned %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return within 10s of cancel")
	}
	select {
	case err := <-errs:
		t.Fatalf("unexpected error reported: %v", err)
	default:
	}
}
