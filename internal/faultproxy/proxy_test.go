package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway/internal/redistest"
)

// echoServer answers every byte with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back within wait.
func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	return readN(c, len(msg), wait)
}

func readN(c net.Conn, n int, wait time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPass(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	got, err := roundTrip(c, "hello", time.Second)
	if err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v; want hello", got, err)
	}
	st := p.Stats()
	if st.Accepted != 1 || st.Active != 1 || st.BytesUp != 5 || st.BytesDown != 5 || st.Dropped != 0 || st.Received != 5 {
		t.Fatalf("stats = %+v; want 1 accepted, 1 active, 5 up, 5 down", st)
	}
}

func TestLatencyDelaysEachDirection(t *testing.T) {
	p := newProxy(t, echoServer(t))
	p.SetLatency(30*time.Millisecond, 20*time.Millisecond)
	c := dial(t, p.Addr())
	start := time.Now()
	got, err := roundTrip(c, "x", 2*time.Second)
	elapsed := time.Since(start)
	if err != nil || got != "x" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	// A lower bound is deterministic: the bytes cannot come back before
	// both delays passed.
	if elapsed < 50*time.Millisecond {
		t.Fatalf("round trip took %v; want ≥ 50ms (30ms up + 20ms down)", elapsed)
	}
	p.SetLatency(0, 0)
	if got, err := roundTrip(c, "y", time.Second); err != nil || got != "y" {
		t.Fatalf("after latency removed: %q, %v", got, err)
	}
}

func TestStallHoldsBytesUntilPass(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.SetMode(Stall); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, "bc", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("stalled read err = %v; want a timeout", err)
	}
	// A new connection is accepted but never answered either.
	c2 := dial(t, p.Addr())
	if _, err := roundTrip(c2, "z", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new stalled conn err = %v; want a timeout", err)
	}
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	if got, err := readN(c, 2, time.Second); err != nil || got != "bc" {
		t.Fatalf("after Pass = %q, %v; want the held bytes bc", got, err)
	}
	if got, err := readN(c2, 1, time.Second); err != nil || got != "z" {
		t.Fatalf("after Pass (new conn) = %q, %v; want z", got, err)
	}
}

func TestBlackholeSwallowsAndClosesCorruptConns(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if err := p.SetMode(Blackhole); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, "lost", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed read err = %v; want a timeout", err)
	}
	if st := p.Stats(); st.Dropped != 4 || st.Received != 4 || st.BytesUp != 0 {
		t.Fatalf("stats = %+v; want 4 dropped, 4 received, 0 forwarded", st)
	}
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 1, time.Second); err == nil || isTimeout(err) {
		t.Fatalf("corrupt conn after Blackhole: err = %v; want it closed", err)
	}
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "ok", time.Second); err != nil || got != "ok" {
		t.Fatalf("new conn after Blackhole = %q, %v", got, err)
	}
}

func TestResetRSTsOldAndNewConns(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.SetMode(Reset); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 1, time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("old conn err = %v; want ECONNRESET", err)
	}
	// A new connection is accepted and reset at once: the dial itself or
	// the first read fails.
	c2, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err == nil {
		defer c2.Close()
		_, err = roundTrip(c2, "b", time.Second)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.EOF) {
		t.Fatalf("new conn err = %v; want a reset", err)
	}
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	c3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, "c", time.Second); err != nil || got != "c" {
		t.Fatalf("after Pass = %q, %v", got, err)
	}
	if st := p.Stats(); st.Accepted != 3 {
		t.Fatalf("accepted = %d; want 3", st.Accepted)
	}
}

func TestRefuseClosesListenerAndReopens(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	if err := p.SetMode(Refuse); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v; want ECONNREFUSED", err)
	}
	if _, err := readN(c, 1, time.Second); err == nil || isTimeout(err) {
		t.Fatalf("open conn while refusing: %v; want it reset", err)
	}
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	c2 := dial(t, p.Addr())
	if got, err := roundTrip(c2, "back", time.Second); err != nil || got != "back" {
		t.Fatalf("after Pass = %q, %v", got, err)
	}
}

func TestModeStringAndParse(t *testing.T) {
	for m := Pass; m < numModes; m++ {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("slow"); err == nil {
		t.Fatal("ParseMode(slow) = nil error")
	}
	p := newProxy(t, echoServer(t))
	if err := p.SetMode(Mode(42)); err == nil {
		t.Fatal("SetMode(42) = nil error")
	}
	if _, err := NewProxy(""); err == nil {
		t.Fatal("NewProxy(\"\") = nil error")
	}
}

func TestCloseEndsEverything(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	_ = p.SetMode(Stall)
	_, _ = c.Write([]byte("held"))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Active != 0 {
		t.Fatalf("active after Close = %d", st.Active)
	}
	if err := p.SetMode(Pass); err == nil {
		t.Fatal("SetMode after Close = nil error")
	}
}

func TestRedisThroughProxy(t *testing.T) {
	srv := redistest.Start(t)
	p := newProxy(t, srv.Addr)
	rc := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ReadTimeout: 5 * time.Second, ContextTimeoutEnabled: true})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_ = p.SetMode(Stall)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := rc.Get(short, "k").Err(); !isTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GET while stalled: %v; want a timeout", err)
	}
	_ = p.SetMode(Pass)
	if v, err := rc.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after Pass = %q, %v", v, err)
	}
}
