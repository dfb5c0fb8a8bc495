package fallback

import (
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
	if e := h.wire.Load(); e == nil || !e.replied {
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
	if e := h.wire.Load(); e == nil || e.replied || e.silence < 30*time.Millisecond {
		t.Fatalf("silent server recorded %+v; want not replied, silent 30ms or more", e)
	}
	close(answer)
}
