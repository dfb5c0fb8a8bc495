// Package redistest starts real redis-server processes on free loopback
// ports for tests, and stops them when the test ends. It never uses a server
// that someone else started.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TB is the part of testing.TB the helpers need; *testing.T and *testing.B
// satisfy it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Logf(format string, args ...any)
}

var _ TB = (testing.TB)(nil)

// ServerBinary returns the path of redis-server, or an error that says how
// to install it.
func ServerBinary() (string, error) {
	if p := os.Getenv("SPILLWAY_REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redistest: redis-server is not installed (run ./scripts/test.sh, which installs it, or apt-get install redis-server, or set SPILLWAY_REDIS_SERVER): %w", err)
	}
	return p, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Server is one redis-server process on loopback.
type Server struct {
	Addr string // "127.0.0.1:port"
	Port int
	Dir  string // its working directory

	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server on a free loopback port with no persistence
// and stops it when the test ends. Extra arguments are appended to the
// command line (for example "--cluster-enabled", "yes").
func Start(t TB, extra ...string) *Server {
	t.Helper()
	s, err := StartServer(t.TempDir(), extra...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServer is Start without a test: the caller must call Stop. It is
// used by the load-test harness.
func StartServer(dir string, extra ...string) (*Server, error) {
	bin, err := ServerBinary()
	if err != nil {
		return nil, err
	}
	return startOnFreePort(bin, dir, "redis", func(port int, sdir string) ([]string, error) {
		return append(serverArgs(port, sdir), extra...), nil
	})
}

// startOnFreePort starts bin on a free loopback port in dir/<name>-<port>,
// with the command line args returns for that port and directory. A port
// taken between the look-up and the start is retried on another, up to five
// times.
func startOnFreePort(bin, dir, name string, args func(port int, sdir string) ([]string, error)) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, fmt.Errorf("redistest: no free port: %w", err)
		}
		sdir := filepath.Join(dir, name+"-"+strconv.Itoa(port))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return nil, err
		}
		a, err := args(port, sdir)
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: sdir, args: a}
		if err := s.start(bin); err != nil {
			lastErr = err
			continue
		}
		return s, nil
	}
	return nil, lastErr
}

// serverArgs is the command line every server here starts with: loopback
// only, no persistence, in the foreground, logging to dir.
func serverArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
		"--daemonize", "no",
		"--protected-mode", "no",
	}
}

func (s *Server) start(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := waitReady(s.Addr, done, 10*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("redistest: redis-server on %s did not start: %w; log:\n%s", s.Addr, err, s.Log())
	}
	return nil
}

func waitReady(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("process exited")
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil && strings.HasPrefix(line, "+PONG") {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %v", timeout)
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

// Client returns a new go-redis client for the server; it is closed when the
// test ends.
func (s *Server) Client(t TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
}

// Kill is Stop: the process is killed with SIGKILL, losing all data.
func (s *Server) Kill() { s.Stop() }

// Restart starts the server again on the same port with empty memory. It
// stops it first if it is running.
func (s *Server) Restart() error {
	s.Stop()
	bin, err := ServerBinary()
	if err != nil {
		return err
	}
	return s.start(bin)
}

// Pause sends SIGSTOP: the server accepts connections (the kernel does) but
// answers nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume sends SIGCONT after Pause.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redistest: server not started")
	}
	return s.cmd.Process.Signal(sig)
}

// Do runs one command on the server with a fresh connection, for test setup
// and assertions (CONFIG SET, SCRIPT FLUSH, INFO …).
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}
