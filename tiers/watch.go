package tiers

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DefaultWatchInterval is how often Limiter.Watch looks at its file unless
// WatchSettings.Interval says otherwise.
const DefaultWatchInterval = time.Second

// racyWindow is how long after a file's mtime a watcher keeps reading it
// even when its stat has not changed: a write within the filesystem's mtime
// granularity (one second on some, two on FAT) of the previous read leaves
// the stat unchanged, so only the content hash can tell.
const racyWindow = 2 * time.Second

// WatchSettings configures Limiter.Watch. The zero value means the
// defaults.
type WatchSettings struct {
	// Interval is how often the file is checked (default
	// DefaultWatchInterval); negative is an error.
	Interval time.Duration

	// OnReloadError receives a failed check: the parse error of a
	// rejected file (a *ConfigError naming the file and the line) or the
	// error reading it (wrapping fs.ErrNotExist when the file is gone).
	// It is called once per failure, not on every tick: again only when
	// the error changes. Nil logs with slog.Default at level Error.
	OnReloadError func(error)

	// OnReload is called after a new config is swapped in, with that
	// config.
	OnReload func(*Config)
}

// watcher follows a config file for Limiter.Watch (see there).
type watcher struct {
	l        *Limiter
	path     string
	name     string // the base name, used in parse errors
	interval time.Duration
	onError  func(error)
	onReload func(*Config)

	mu      sync.Mutex
	seen    os.FileInfo // the stat of the last read, nil before the first
	readAt  time.Time   // when it was read
	cur     error       // the outcome for the content last read
	good    [sha256.Size]byte
	applied *Config // the config swapped in for good; nil before the first
	bad     [sha256.Size]byte
	badErr  error // reload's error for bad, nil when none was rejected
	lastErr error // the error of the last check, for reporting changes only
}

// newWatcher returns a watcher of the config file at path for l. It does
// not look at the file yet: Check and Run do.
func newWatcher(l *Limiter, path string, s WatchSettings) (*watcher, error) {
	if l == nil {
		return nil, errors.New("tiers: watch: nil limiter")
	}
	if path == "" {
		return nil, errors.New("tiers: watch: empty path")
	}
	w := &watcher{
		l:        l,
		path:     path,
		name:     filepath.Base(path),
		interval: DefaultWatchInterval,
		onError:  s.OnReloadError,
		onReload: s.OnReload,
	}
	if s.Interval != 0 {
		w.interval = s.Interval
	}
	if w.interval <= 0 {
		return nil, fmt.Errorf("tiers: watch interval %v must be positive", w.interval)
	}
	if w.onError == nil {
		w.onError = func(err error) {
			slog.Error("tiers: config file not reloaded; the config in use stays", "path", path, "err", err)
		}
	}
	return w, nil
}

// Watch follows the config file at path and reloads l when its content
// changes, until ctx is done; it returns ctx.Err(), or at once an error
// for an empty path or a negative WatchSettings.Interval.
//
//	go lim.Watch(ctx, "/etc/myapp/limits.yaml",
//		tiers.WatchSettings{OnReloadError: func(err error) { log.Print(err) }})
//
// It polls (portable, and sees a file replaced by rename or by a
// Kubernetes ConfigMap symlink swap as well as one edited in place): each
// check stats the file and reads it only when its identity, size or mtime
// changed, or when the mtime is recent enough that a same-size rewrite
// could hide in the mtime granularity; the content's SHA-256 then decides
// whether anything changed.
//
// A changed file is parsed and goes through Limiter.Swap: a valid one is swapped in
// atomically, and rules whose id and policy are unchanged keep their
// counters and Stats. A file that does not parse, or that cannot be read
// (deleted, unreadable), changes nothing: the Limiter keeps enforcing the
// last good config with its counters, and the error is reported to the
// WatchSettings.OnReloadError func. The same bad content is not parsed or
// reported again; the next change is.
//
// The first check applies the file as it is, whatever config the Limiter
// was created with (a Swap of an identical config keeps every counter), and
// so does the first check after someone else swapped a config in: while Watch
// runs, the file is the source of truth.
//
// Replace the file atomically (write a temporary file in the same
// directory, then rename it over the old one): a check can read a file
// being written in place half-written. Such a half is almost always
// rejected and reported, and the whole file applied at the next check; but
// a cut that falls between two rules parses, and would be enforced for one
// interval.
//
// Limitation of polling: a rewrite that keeps the file's size and restores
// its old mtime is not seen.
func (l *Limiter) Watch(ctx context.Context, path string, s WatchSettings) error {
	w, err := newWatcher(l, path, s)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// Run checks the file at once, then every interval, until ctx is done; it
// returns ctx.Err(). It starts no other goroutine.
func (w *watcher) Run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.Check()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			w.Check()
		}
	}
}

// Check looks at the file once and reloads the Limiter if the content
// changed. reloaded says whether a new config was swapped in. err is nil
// when the config in use is the file's content; otherwise it says why not
// (the same error again while nothing changes). A new error is also
// passed to the error handler.
func (w *watcher) Check() (reloaded bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	reloaded, err = w.check()
	if err != nil && (w.lastErr == nil || w.lastErr.Error() != err.Error()) {
		w.onError(err)
	}
	w.lastErr = err
	if reloaded && w.onReload != nil {
		w.onReload(w.l.config())
	}
	return reloaded, err
}

func (w *watcher) check() (bool, error) {
	fi, err := os.Stat(w.path)
	if err != nil {
		return false, fmt.Errorf("tiers: watch: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("tiers: watch: %s is not a regular file", w.path)
	}
	inUse := w.applied != nil && w.l.config() == w.applied // else someone else swapped
	if inUse && sameStat(w.seen, fi) && w.readAt.Sub(fi.ModTime()) > racyWindow {
		return false, w.cur
	}
	readAt := time.Now()
	data, err := os.ReadFile(w.path)
	if err != nil {
		return false, fmt.Errorf("tiers: watch: %w", err)
	}
	// The stat taken before the read: if the file changes between the
	// two, the next stat differs and the file is read again.
	w.seen, w.readAt = fi, readAt
	sum := sha256.Sum256(data)
	switch {
	case inUse && sum == w.good:
		w.cur = nil
		return false, nil
	case w.badErr != nil && sum == w.bad:
		w.cur = w.badErr
		return false, w.badErr
	}
	if err := w.l.reload(w.name, data); err != nil {
		w.bad, w.badErr, w.cur = sum, err, err
		return false, err
	}
	w.good, w.applied, w.cur = sum, w.l.config(), nil
	w.badErr = nil
	return true, nil
}

// sameStat reports whether a and b are the same file with the same size
// and mtime.
func sameStat(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
