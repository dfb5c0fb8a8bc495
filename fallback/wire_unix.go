//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package fallback

import (
	"net"
	"syscall"
)

// pending reports whether bytes from the server wait unread in c's socket
// (a peek that neither consumes nor blocks; false when c does not expose
// its descriptor, as a TLS connection does not).
func pending(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	has := false
	// Control, not Read: a read deadline that has passed does not stop it.
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		has = n > 0 && err == nil
	})
	return has
}
