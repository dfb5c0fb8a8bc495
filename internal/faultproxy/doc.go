// Package faultproxy is a fault-injecting TCP proxy for tests and the
// load-test harness. It listens on a free loopback port in front of any
// address (a redis-server, a Cluster node) and forwards bytes both ways,
// until told to misbehave: add latency per chunk and direction, stall (hold
// every byte until the mode changes back), blackhole (swallow every byte),
// reset (RST every connection, old and new) or refuse (close the listener so
// connects are refused). Modes switch at run time, while traffic flows.
//
// Shortest use:
//
//	p, err := faultproxy.NewProxy(server.Addr)
//	if err != nil { … }
//	defer p.Close()
//	client := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.SetMode(faultproxy.Stall) // Redis "hangs"
//	p.SetMode(faultproxy.Pass)  // and recovers
//
// A Proxy is safe for concurrent use.
package faultproxy
