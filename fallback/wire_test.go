package fallback

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A read that runs out of time while the reply already waits in the
// socket (the reader was late: the CPU, not the server) is recorded as
// replied; one with no reply as the server's silence since the write.
func TestWireConnTellsALateReaderFromASilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answer := make(chan bool, 2)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 16)
		for reply := range answer {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if reply {
				_, _ = c.Write([]byte("+OK\r\n"))
			}
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	h := newHealth(HealthSettings{})
	c := wrapConn(raw, h)
	defer c.Close()
	buf := make([]byte, 16)

	// The server answers at once; the reader comes after its deadline.
	answer <- true
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the reply arrives meanwhile
	_ = c.SetReadDeadline(time.Now().Add(-time.Millisecond))
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("late read: %v, want a deadline error", err)
	}
	if e := h.lastWire(); e == nil || !e.replied {
		t.Fatalf("late read recorded %+v; want replied", e)
	}
	_ = c.SetReadDeadline(time.Time{})
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "+OK\r\n" {
		t.Fatalf("reading the reply: %q %v", buf[:n], err)
	}

	// The server does not answer: silence since the write.
	answer <- false
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of a silent server: %v, want a deadline error", err)
	}
	if e := h.lastWire(); e == nil || e.replied || e.silence < 30*time.Millisecond {
		t.Fatalf("silent server recorded %+v; want not replied, silent 30ms or more", e)
	}
	close(answer)
}

// One piece of evidence is one failure: the calls that share a silent
// command (coalesced into one script call) find it counted after the
// first; a dial error from before a call began (the pool hands it out
// until it redials) counts for nothing; a read that timed out with no
// silence of Redis's recorded is this process's own wait.
func TestEvidenceCountsOnce(t *testing.T) {
	h := newHealth(HealthSettings{})
	h.wired = true
	const allowance = 40 * time.Millisecond
	start := time.Now()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	if got := h.blamesRedis(context.DeadlineExceeded, start, allowance); got != blameProcess {
		t.Fatalf("timeout with no evidence: %v, want blameProcess", got)
	}
	h.noteWire(&wireEvent{at: time.Now().UnixNano(), silence: allowance / 4})
	if got := h.blamesRedis(timeout, start, allowance); got != blameProcess {
		t.Fatalf("a short silence: %v, want blameProcess", got)
	}
	h.noteWire(&wireEvent{at: time.Now().UnixNano(), silence: allowance})
	want := []blame{blameRedis, blameCounted, blameCounted}
	for i, w := range want {
		if got := h.blamesRedis(timeout, start, allowance); got != w {
			t.Fatalf("call %d sharing one silence: %v, want %v", i, got, w)
		}
	}
	df := &dialFailure{err: errors.New("connection refused"), ev: &wireEvent{at: time.Now().UnixNano(), broken: true}}
	if got := h.blamesRedis(df, start, allowance); got != blameRedis {
		t.Fatalf("a refused dial of the call: %v, want blameRedis", got)
	}
	if got := h.blamesRedis(df, start, allowance); got != blameCounted {
		t.Fatalf("the same dial error again: %v, want blameCounted", got)
	}
	stale := &dialFailure{err: errors.New("connection refused"), ev: &wireEvent{at: start.Add(-time.Second).UnixNano(), broken: true}}
	if got := h.blamesRedis(stale, start, allowance); got != blameCounted {
		t.Fatalf("a dial error from before the call: %v, want blameCounted", got)
	}
}
