package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with connections and bytes.
type Mode uint8

const (
	// Pass forwards bytes both ways (after the configured latency).
	Pass Mode = iota
	// Stall accepts connections and holds every byte read, in both
	// directions, until the mode changes: like a server that hangs
	// (SIGSTOP) and later resumes with nothing lost.
	Stall
	// Blackhole accepts connections and swallows every byte, in both
	// directions: like a network partition. A connection that lost bytes
	// is closed when the mode changes, since its stream is corrupt.
	Blackhole
	// Reset sends a TCP RST on every open connection and on every new one
	// as soon as it is accepted.
	Reset
	// Refuse closes the listener, so connects fail with "connection
	// refused", and resets every open connection. Leaving Refuse listens
	// again on the same port.
	Refuse
	numModes
)

var modeNames = [numModes]string{"pass", "stall", "blackhole", "reset", "refuse"}

// String returns the lowercase name of m.
func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses the name returned by String.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("faultproxy: unknown mode %q (want one of pass, stall, blackhole, reset, refuse)", s)
}

// Stats counts what went through the proxy since it started.
type Stats struct {
	Accepted  int64 // connections accepted (including ones reset at once)
	Active    int64 // connections open now
	BytesUp   int64 // bytes forwarded client → target
	BytesDown int64 // bytes forwarded target → client
	Dropped   int64 // bytes swallowed by Blackhole
	Received  int64 // bytes read from clients, whatever became of them
}

// Proxy is a TCP proxy on a loopback port in front of one target address.
type Proxy struct {
	target string
	addr   string

	mu       sync.Mutex
	mode     Mode
	changed  chan struct{} // closed and replaced on every mode change
	ln       net.Listener
	conns    map[*conn]struct{}
	closed   bool
	upLat    time.Duration
	downLat  time.Duration
	acceptWG sync.WaitGroup
	connWG   sync.WaitGroup

	accepted, active, up, down, dropped, received atomic.Int64
}

// NewProxy listens on a free port of 127.0.0.1 and forwards every
// connection to target. The caller must Close it.
func NewProxy(target string) (*Proxy, error) {
	if target == "" {
		return nil, errors.New("faultproxy: target address is empty")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{
		target:  target,
		addr:    ln.Addr().String(),
		changed: make(chan struct{}),
		conns:   make(map[*conn]struct{}),
	}
	p.serve(ln)
	return p, nil
}

// Addr returns the address clients connect to ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.addr }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:  p.accepted.Load(),
		Active:    p.active.Load(),
		BytesUp:   p.up.Load(),
		BytesDown: p.down.Load(),
		Dropped:   p.dropped.Load(),
		Received:  p.received.Load(),
	}
}

// SetLatency delays every chunk forwarded client → target by up and every
// chunk target → client by down (0 for none). It applies to chunks read
// after the call, in Pass mode; a chunk's delay holds back the chunks behind
// it, like a slow link.
func (p *Proxy) SetLatency(up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upLat, p.downLat = max(up, 0), max(down, 0)
}

func (p *Proxy) latency(upstream bool) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if upstream {
		return p.upLat
	}
	return p.downLat
}

// SetMode switches the mode. Leaving Refuse listens again on the same port;
// that fails (and the proxy stays refusing) only if another process took the
// port meanwhile.
func (p *Proxy) SetMode(m Mode) error {
	if m >= numModes {
		return fmt.Errorf("faultproxy: unknown mode %d", uint8(m))
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("faultproxy: proxy is closed")
	}
	prev := p.mode
	if prev == m {
		p.mu.Unlock()
		return nil
	}
	if prev == Refuse {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.mu.Unlock()
			return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
		}
		p.serveLocked(ln)
	}
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	var kill []*conn
	switch {
	case m == Reset || m == Refuse:
		for c := range p.conns {
			kill = append(kill, c)
		}
	case prev == Blackhole:
		for c := range p.conns {
			if c.lost.Load() {
				kill = append(kill, c)
			}
		}
	}
	var ln net.Listener
	if m == Refuse {
		ln, p.ln = p.ln, nil
	}
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range kill {
		c.reset()
	}
	return nil
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end. It is safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ln := p.ln
	p.ln = nil
	close(p.changed)
	p.changed = make(chan struct{})
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range conns {
		c.close()
	}
	p.acceptWG.Wait()
	p.connWG.Wait()
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

func (p *Proxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.acceptWG.Add(1)
	go p.acceptLoop(ln)
}

func (p *Proxy) acceptLoop(ln net.Listener) {
	defer p.acceptWG.Done()
	for {
		client, err := ln.Accept()
		if err != nil {
			return // listener closed (Refuse or Close)
		}
		p.accepted.Add(1)
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		p.mu.Unlock()
		if closed || mode == Reset || mode == Refuse {
			rst(client)
			continue
		}
		c := &conn{p: p, client: client, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			rst(client)
			continue
		}
		p.conns[c] = struct{}{}
		p.connWG.Add(1)
		p.mu.Unlock()
		p.active.Add(1)
		go c.run()
	}
}

// rst closes a TCP connection with SO_LINGER 0, which sends RST instead of
// FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

type conn struct {
	p      *Proxy
	client net.Conn

	mu       sync.Mutex
	server   net.Conn
	done     chan struct{}
	doneOnce sync.Once
	lost     atomic.Bool // Blackhole swallowed bytes of this connection
}

func (c *conn) run() {
	defer c.p.connWG.Done()
	defer func() {
		c.close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
		c.p.active.Add(-1)
	}()
	server, err := net.DialTimeout("tcp", c.p.target, 5*time.Second)
	if err != nil {
		rst(c.client)
		return
	}
	c.mu.Lock()
	select {
	case <-c.done:
		c.mu.Unlock()
		rst(server)
		return
	default:
	}
	c.server = server
	c.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.pump(c.client, server, true) }()
	go func() { defer wg.Done(); c.pump(server, c.client, false) }()
	wg.Wait()
}

// pump copies src to dst chunk by chunk, consulting the mode before each
// write. Any error ends the whole connection.
func (c *conn) pump(src, dst net.Conn, upstream bool) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if upstream && n > 0 {
			c.p.received.Add(int64(n))
		}
		if n > 0 && !c.forward(buf[:n], dst, upstream) {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward applies the mode to one chunk; it reports false when the
// connection must end.
func (c *conn) forward(chunk []byte, dst net.Conn, upstream bool) bool {
	for {
		c.p.mu.Lock()
		mode, changed := c.p.mode, c.p.changed
		c.p.mu.Unlock()
		switch mode {
		case Stall:
			select {
			case <-changed:
				continue
			case <-c.done:
				return false
			}
		case Blackhole:
			c.lost.Store(true)
			c.p.dropped.Add(int64(len(chunk)))
			return true
		case Reset, Refuse:
			return false
		}
		if d := c.p.latency(upstream); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return false
			}
		}
		// The mode may have changed while we slept.
		c.p.mu.Lock()
		mode = c.p.mode
		c.p.mu.Unlock()
		if mode != Pass {
			continue
		}
		// Count before writing, so a peer that saw the bytes also sees
		// them counted.
		if upstream {
			c.p.up.Add(int64(len(chunk)))
		} else {
			c.p.down.Add(int64(len(chunk)))
		}
		_, err := dst.Write(chunk)
		return err == nil
	}
}

// reset ends the connection with RST on both sides.
func (c *conn) reset() {
	c.doneOnce.Do(func() {
		close(c.done)
		c.mu.Lock()
		server := c.server
		c.mu.Unlock()
		rst(c.client)
		if server != nil {
			rst(server)
		}
	})
}

// close ends the connection; the client sees FIN.
func (c *conn) close() {
	c.doneOnce.Do(func() {
		close(c.done)
		c.mu.Lock()
		server := c.server
		c.mu.Unlock()
		_ = c.client.Close()
		if server != nil {
			_ = server.Close()
		}
	})
}

var _ io.Closer = (*Proxy)(nil)
