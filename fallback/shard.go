package fallback

import (
	"context"
	"errors"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// shards is the health of a Cluster client, one breaker per node: a
// primary's failure opens the breaker of that node only, so the slots it
// serves are decided locally while every other slot is still decided by
// Redis. Each node's client gets a shardHook (go-redis's OnNewNode), which
// gates and counts that node's commands — the Stores' too —
// and dials its connections (wireConn). The Health of the client (parent)
// then never opens by itself: its State sums up the nodes'.
//
// While a node is open, the cluster's view of the slots is reloaded every
// OpenTimeout/4 (ClusterClient.ReloadState), so that once a replica serves
// the failed primary's slots, their calls go to it: its node has a breaker
// of its own, closed. The failed node's breaker probes that node alone (a
// PING on its client): it closes when that node answers again, and is
// dropped when go-redis closes the node's client (it serves no slot).
type shards struct {
	parent    *Health
	cluster   *redis.ClusterClient
	m         sync.Map // node address -> *Health
	reloading atomic.Bool
}

// watchShards gives each node of c a breaker of its own (see shards).
func (h *Health) watchShards(c *redis.ClusterClient) {
	sh := &shards{parent: h, cluster: c}
	h.shards = sh
	c.OnNewNode(sh.add)
}

// add makes the breaker of a node client go-redis just created.
func (sh *shards) add(n *redis.Client) {
	p := sh.parent
	addr := n.Options().Addr
	name := p.set.Name + "@" + addr
	hs := p.set
	hs.Name = name
	hs.Probe = func(ctx context.Context) error { return n.Ping(ctx).Err() }
	hook := hs.OnStateChange
	var child *Health
	hs.OnStateChange = func(name string, from, to State) {
		child.shardChanged(from, to)
		if hook != nil {
			hook(name, from, to)
		}
	}
	child = newHealth(hs)
	child.parent = p
	child.addr = addr
	child.attached, child.direct, child.wired = true, true, true
	child.gone = func() { sh.m.CompareAndDelete(addr, child) }
	sh.m.Store(addr, child)
	n.AddHook(shardHook{child})
}

// shardChanged runs when a node's breaker changes state (with its lock
// held): the time is noted for Stats, and an opening starts the reloads of
// the cluster's slots.
func (h *Health) shardChanged(_, to State) {
	if to == Open {
		h.parent.shards.kick()
	}
}

// kick reloads the cluster's slots now and every OpenTimeout/4 while a
// node's breaker is not closed.
func (sh *shards) kick() {
	if !sh.reloading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer sh.reloading.Store(false)
		every := max(sh.parent.set.OpenTimeout/4, 10*time.Millisecond)
		for {
			sh.cluster.ReloadState(context.Background())
			time.Sleep(every)
			if !sh.anyOpen() {
				return
			}
		}
	}()
}

func (sh *shards) anyOpen() bool {
	open := false
	sh.m.Range(func(_, v any) bool {
		open = !v.(*Health).closed.Load()
		return !open
	})
	return open
}

// each calls f for each node's breaker, in address order.
func (sh *shards) each(f func(*Health)) {
	var hs []*Health
	sh.m.Range(func(_, v any) bool {
		hs = append(hs, v.(*Health))
		return true
	})
	sort.Slice(hs, func(i, j int) bool { return hs[i].addr < hs[j].addr })
	for _, c := range hs {
		f(c)
	}
}

// state sums up the nodes: Closed while every node is closed, Open when
// every node is open, else HalfOpen (some slots are decided locally).
func (sh *shards) state() State {
	n, closed, open := 0, 0, 0
	sh.each(func(c *Health) {
		n++
		switch c.state() {
		case Closed:
			closed++
		case Open:
			open++
		}
	})
	switch {
	case closed == n:
		return Closed
	case open == n:
		return Open
	}
	return HalfOpen
}

// shardHook gates and counts the commands of one Cluster node, whatever
// block sent them, and dials its connections.
type shardHook struct{ h *Health }

func (k shardHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if k.h.refusesDial(ctx) {
			k.h.rejected.Add(1)
			return nil, ErrOpen
		}
		return k.h.dial(ctx, next, network, addr)
	}
}

func (k shardHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if k.h.isProbe(ctx) {
			return next(ctx, cmd)
		}
		done, err := k.h.allow()
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		start := time.Now()
		err = next(ctx, cmd)
		k.report(ctx, done, err, start)
		return err
	}
}

func (k shardHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if k.h.isProbe(ctx) {
			return next(ctx, cmds)
		}
		done, err := k.h.allow()
		if err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		start := time.Now()
		err = next(ctx, cmds)
		k.report(ctx, done, err, start)
		return err
	}
}

// report counts the outcome on the node's breaker and, when it is a
// failure, tells the call of a Store that sent it.
func (k shardHook) report(ctx context.Context, done func(error), err error, start time.Time) {
	failed := k.h.report(ctx, done, err, start, k.h.parent.allowanceOf(ctx, start)) && err != nil && !healthy(err) &&
		!errors.Is(err, ErrOpen) && !errors.Is(ctx.Err(), context.Canceled)
	if failed {
		if g, ok := ctx.Value(guardKey{}).(*guardCtx); ok {
			g.shardFailed.Store(true)
		}
	}
}

// isProbe reports whether ctx is a probe of h's.
func (h *Health) isProbe(ctx context.Context) bool {
	p, ok := ctx.Value(probeKey{}).(*Health)
	return ok && p == h && !h.closed.Load()
}
