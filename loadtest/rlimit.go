package main

import "syscall"

// raiseFileLimit lifts the open-file limit as far as the process may: a
// fleet under a 10× spike holds thousands of loopback connections (both
// ends in this one process). Go already raises the soft limit to the hard
// one; root may also raise the hard limit.
func raiseFileLimit() {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return
	}
	const want = 1 << 17
	if r.Max < want {
		nr := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nr) == nil {
			return
		}
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
}
