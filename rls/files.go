package rls

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ReadDir reads every config file under dir, recursively, sorted by path.
// Directories and files whose names start with ".." (Kubernetes' ConfigMap
// internals) are skipped, and so are dot files when ignoreDot is set
// (RUNTIME_IGNOREDOTFILES). Symbolic links to files are followed.
func ReadDir(dir string, ignoreDot bool) ([]File, error) {
	var files []File
	root := dir
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		root = dir + string(filepath.Separator) // a link to the directory: walk what it points at
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, "..") || (ignoreDot && strings.HasPrefix(name, "."))) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		info, err := os.Stat(path) // follows a symlink
		if err != nil || info.IsDir() {
			return nil // a dangling link or a link to a directory
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, File{Name: path, Content: b})
		return nil
	})
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	if err != nil {
		return nil, fmt.Errorf("rls: reading the config directory %s: %w", dir, err)
	}
	return files, nil
}

// digest identifies a set of files by names and contents.
func digest(files []File) [32]byte {
	h := sha256.New()
	for _, f := range files {
		h.Write([]byte(f.Name))
		h.Write([]byte{0})
		h.Write(f.Content)
		h.Write([]byte{0})
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// reloader loads the config directory into a Service and follows it: every
// interval it reads the directory again (a few small files), and when
// their names or contents changed it loads them. A set of files that does
// not load leaves the last good config in place; the error, naming the
// file and line, is logged once and counted in config_load_error.
// Polling sees edits in place, files added or removed, and a symlink swap
// of the whole directory (RUNTIME_WATCH_ROOT, Kubernetes ConfigMaps) alike.
type reloader struct {
	svc       *Service
	dir       string
	ignoreDot bool
	opts      LoadOptions
	log       *slog.Logger
	last      [32]byte
	lastErr   string
	onLoad    func(*Config, error) // tests and health: after every attempt
}

// newReloader returns a reloader of dir into svc.
func newReloader(svc *Service, dir string, ignoreDot bool, opts LoadOptions, log *slog.Logger) *reloader {
	return &reloader{svc: svc, dir: dir, ignoreDot: ignoreDot, opts: opts, log: log}
}

// Load reads and loads the directory once, whatever was loaded before.
// It returns the error of a config that did not load.
func (r *reloader) Load() error {
	files, err := ReadDir(r.dir, r.ignoreDot)
	if err != nil {
		return r.failed(err)
	}
	r.last = digest(files)
	return r.apply(files)
}

func (r *reloader) apply(files []File) error {
	c, err := Load(files, r.opts)
	if err != nil {
		return r.failed(err)
	}
	r.svc.SetConfig(c)
	r.svc.stats.ConfigLoadSuccess.Add(1)
	r.lastErr = ""
	r.log.Info("rls: config loaded", "dir", r.dir, "files", len(files), "domains", strings.Join(c.domainNames(), ","))
	if r.onLoad != nil {
		r.onLoad(c, nil)
	}
	return nil
}

func (r *reloader) failed(err error) error {
	r.svc.stats.ConfigLoadError.Add(1)
	if msg := err.Error(); msg != r.lastErr {
		r.lastErr = msg
		if r.svc.config() != nil {
			r.log.Error("rls: config not loaded; the last good config stays", "err", err)
		} else {
			r.log.Error("rls: config not loaded", "err", err)
		}
	}
	if r.onLoad != nil {
		r.onLoad(nil, err)
	}
	return err
}

// Run checks the directory every interval until ctx ends.
func (r *reloader) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		files, err := ReadDir(r.dir, r.ignoreDot)
		if err != nil {
			if !strings.Contains(r.lastErr, err.Error()) {
				_ = r.failed(err)
			}
			continue
		}
		d := digest(files)
		if bytes.Equal(d[:], r.last[:]) {
			continue
		}
		r.last = d
		_ = r.apply(files)
	}
}
