package fallback

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The health judges Redis by what Redis did, not by how long a caller
// waited. A call's time has two parts: the wait in this process before its
// command is written (the ratelimit store's coalescing queue, go-redis's
// connection pool, the Go scheduler) and the wait for Redis's reply after
// it. Only the second says anything about Redis. wireConn, the connection
// the health's dial hook hands to go-redis, times it: it notes when a
// command is written and when Redis last sent a byte, and when a read runs
// out of time with a command outstanding it tells its Health how long
// Redis had been silent and whether the reply was in fact already waiting
// in the socket (the reader was late, not Redis). go-redis may retry the
// command and return another error (the retry's expired context), so the
// evidence goes to the Health, not into the error.

// wireConn is a net.Conn that times the silence of the server.
type wireConn struct {
	net.Conn
	h *Health
	// wroteAt is when the oldest command not yet followed by a byte of
	// reply was written; readAt is when the server last sent a byte (Unix
	// ns, 0: never). A command written after a reply sets wroteAt anew.
	wroteAt, readAt atomic.Int64
	// claimed is the wroteAt of the silence a call counted (silentNow).
	claimed atomic.Int64
}

// Close forgets c (silentNow) and closes it.
func (c *wireConn) Close() error {
	c.h.conns.Delete(c)
	return c.Conn.Close()
}

// silentNow says whom a call that ran out of time without a read of its
// own timing out counts against: the Redis when one of h's connections has
// a command outstanding that Redis has not answered for at least d (its
// reply not waiting unread in the socket) — the first such call per
// command; the later ones find it counted — else this process.
func (h *Health) silentNow(d time.Duration) blame {
	verdict := blameProcess
	now := time.Now().UnixNano()
	h.conns.Range(func(k, _ any) bool {
		c := k.(*wireConn)
		w := c.wroteAt.Load()
		if w == 0 || w <= c.readAt.Load() || time.Duration(now-w) < d || pending(c.Conn) {
			return true
		}
		if old := c.claimed.Load(); old != w && c.claimed.CompareAndSwap(old, w) {
			verdict = blameRedis
			return false
		}
		verdict = blameCounted
		return true
	})
	return verdict
}

// sysWireConn is a wireConn over a connection that exposes its file
// descriptor, which go-redis's pool uses to check idle connections.
type sysWireConn struct{ *wireConn }

func (c sysWireConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

func wrapConn(c net.Conn, h *Health) net.Conn {
	w := &wireConn{Conn: c, h: h}
	h.conns.Store(w, struct{}{})
	if _, ok := c.(syscall.Conn); ok {
		return sysWireConn{w}
	}
	return w
}

// NetConn returns the wrapped connection (go-redis unwraps through it).
func (c *wireConn) NetConn() net.Conn { return c.Conn }

func (c *wireConn) Write(b []byte) (int, error) {
	now := time.Now().UnixNano()
	if w := c.wroteAt.Load(); w == 0 || w <= c.readAt.Load() {
		c.wroteAt.Store(now)
	}
	return c.Conn.Write(b)
}

func (c *wireConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.readAt.Store(time.Now().UnixNano())
	}
	switch {
	case err == nil || n > 0:
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Only with a command outstanding (written after the last byte
		// read): an idle read that times out says nothing.
		if w, r := c.wroteAt.Load(), c.readAt.Load(); w > r {
			now := time.Now().UnixNano()
			c.h.noteWire(&wireEvent{at: now, silence: time.Duration(now - w), replied: pending(c.Conn)})
		}
	case !errors.Is(err, net.ErrClosed):
		// the server closed or reset the connection
		c.h.noteWire(&wireEvent{at: time.Now().UnixNano(), broken: true})
	}
	return n, err
}

// noteWire records e for h (and the Health of its Cluster client).
func (h *Health) noteWire(e *wireEvent) {
	if e.broken {
		h.failedAt.Store(e.at)
		if h.parent != nil {
			h.parent.failedAt.Store(e.at)
		}
	}
	h.keepWire(e)
	if h.parent != nil {
		h.parent.keepWire(e)
	}
}

// wireEvents is how many of the latest reads that ran out of time a Health
// keeps: a call looks at those that happened while it ran.
const wireEvents = 32

func (h *Health) keepWire(e *wireEvent) {
	h.wire[(h.wireNext.Add(1)-1)%wireEvents].Store(e)
}

// lastWire is the latest read that ran out of time, or nil.
func (h *Health) lastWire() *wireEvent {
	n := h.wireNext.Load()
	if n == 0 {
		return nil
	}
	return h.wire[(n-1)%wireEvents].Load()
}

// wireEvent is the latest read of a Health's connections that ran out of
// time with a command outstanding: at (Unix ns), Redis had been silent for
// silence, unless its reply was already in the socket (replied), unread
// because this process was late; or (broken) the latest connection the
// server closed, reset or refused. go-redis retries such a command and may
// return the retry's expired context instead of the connection's error.
type wireEvent struct {
	at      int64
	silence time.Duration
	replied bool
	broken  bool // the server closed or reset a connection, or refused one
	// claimed: a call counted it against the Redis already (claim).
	claimed atomic.Bool
}

// claim reports whether the call that found e counts it against the Redis
// (the first to find it) or finds it counted (every later one).
func (e *wireEvent) claim() blame {
	if e.claimed.CompareAndSwap(false, true) {
		return blameRedis
	}
	return blameCounted
}

// dialFailure is a failed dial: the server (or the network to it) did not
// accept a connection within took. go-redis's pool returns the same error
// to later calls until it redials: ev (when it failed, and whether a call
// counted it) tells those apart.
type dialFailure struct {
	err  error
	took time.Duration
	ev   *wireEvent
}

func (e *dialFailure) Error() string { return e.err.Error() }
func (e *dialFailure) Unwrap() error { return e.err }

// wireHook is the dial part of a Health's hook alone: for a client whose
// calls a Store with a breaker of its own makes, so that the
// breaker can tell a slow Redis from a late caller.
type wireHook struct{ h *Health }

func (k wireHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return k.h.dial(ctx, next, network, addr)
	}
}

func (wireHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (wireHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// dial opens a connection for h: timed (wireConn), and a failure says how
// long it took.
func (h *Health) dial(ctx context.Context, next redis.DialHook, network, addr string) (net.Conn, error) {
	start := time.Now()
	c, err := next(ctx, network, addr)
	if err != nil {
		took := time.Since(start)
		ev := &wireEvent{at: time.Now().UnixNano(), broken: true}
		if !timedOut(err) && !errors.Is(err, ErrOpen) {
			h.noteWire(ev)
		}
		return nil, &dialFailure{err: err, took: took, ev: ev}
	}
	return wrapConn(c, h), nil
}

// watchWire makes every connection client dials for its commands go
// through h's dial hook (wireConn): the nodes' of a Cluster or Ring too,
// whose own clients dial (h's dial hook is already on client itself). It
// reports whether it could: false for a client type it does not know.
func (h *Health) watchWire(client redis.UniversalClient) bool {
	k := wireHook{h}
	switch c := client.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(k) })
		return true
	case *redis.Ring:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(k) })
		_ = c.ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error {
			n.AddHook(k)
			return nil
		})
		return true
	}
	return false
}
