package shedder

import (
	"context"
	"math"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway"
)

func treq(tenant string) *spillway.Request {
	r := &spillway.Request{Endpoint: "/q", Priority: spillway.Critical}
	r.Set(spillway.DimUser, tenant)
	return r
}

// QueueSettings.Tenant: a tenant over its max-min share of a contended queue is
// refused at once with 429 and a Retry-After of its own (one that got
// less service than the mean lately may have one request more waiting,
// refused the same way if no slot frees for it in time); a freed slot
// goes to the waiter whose tenant got the least service lately; tenants
// are forgotten once idle.
func TestQueueFairShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(4, QueueSettings{MaxWait: time.Second, Depth: 20, Tenant: spillway.DimUser})
		require.NoError(t, err)
		bg := context.Background()
		_, done, _ := q.Admit(bg, treq("a"))
		time.Sleep(100 * time.Millisecond)
		done(spillway.Success)  // work holds a slot 100 ms
		time.Sleep(time.Second) // a is forgotten
		// The noisy tenant takes every free slot: nobody waits, nobody else asks.
		var noisy []spillway.Done
		for range 4 {
			d, done, _ := q.Admit(bg, treq("n"))
			require.True(t, d.Allowed)
			noisy = append(noisy, done)
		}
		a1 := admitAsync(q, bg, treq("a")) // share 1 of 4 (n wants 4): waits
		synctest.Wait()
		// n wants 5 now; a keeps its 1, n's share is 3; it holds 4.
		d, _, _ := q.Admit(bg, treq("n"))
		require.Equal(t, spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "queue", Limit: 3,
			RetryAfter: 166666666}, d) // 100 ms × 5 ÷ 3
		b1 := admitAsync(q, bg, treq("b"))
		synctest.Wait()
		// Shares of 4 among b (1), a (2, then 3), n (4): 1, 1.5, 1.5; a
		// may hold its share rounded up, 2, and, having got less service
		// lately than the mean (0.8 of a request against 1.6), one more.
		a2 := admitAsync(q, bg, treq("a"))
		synctest.Wait()
		a3 := admitAsync(q, bg, treq("a"))
		synctest.Wait()
		require.Equal(t, 4, q.Stats().Waiting)
		d, _, _ = q.Admit(bg, treq("a"))
		require.Equal(t, spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "queue", Limit: 2,
			RetryAfter: 266666666}, d) // 100 ms × 4 ÷ 1.5
		require.Equal(t, 4, q.Stats().Waiting)

		// Freed slots go by the service each tenant got lately: b (none),
		// then a (one request 1.1 s ago, e^-0.22 = 0.80 of one: its record
		// outlived its idle spell), oldest first, then a again.
		noisy[0](spillway.Success)
		synctest.Wait()
		require.True(t, b1.returned() && b1.d.Allowed)
		require.False(t, a1.returned() || a2.returned())
		noisy[1](spillway.Success)
		synctest.Wait()
		require.True(t, a1.returned() && a1.d.Allowed)
		require.False(t, a2.returned())
		noisy[2](spillway.Success)
		synctest.Wait()
		require.True(t, a2.returned() && a2.d.Allowed)
		require.False(t, a3.returned())
		// a's request beyond its share finds no slot within its wait: it
		// gets its tenant's refusal (429), not the queue's 503.
		time.Sleep(time.Second)
		synctest.Wait()
		require.True(t, a3.returned())
		require.Equal(t, spillway.Decision{Reason: spillway.ReasonConcurrency, Limiter: "queue", Limit: 2,
			RetryAfter: 200 * time.Millisecond}, a3.d) // 100 ms × 3 ÷ 1.5
		require.Equal(t, QueueStats{Admitted: 8, Waited: 3, OverShare: 3, InFlight: 4, Slots: 4}, q.Stats())
		q.mu.Lock()
		require.Len(t, q.tenants[spillway.Critical], 3)
		q.mu.Unlock()
		for _, d := range []spillway.Done{noisy[3], a1.done, b1.done, a2.done} {
			d(spillway.Success)
		}
		// Idle tenants stay one mean hold time (between two requests),
		// then are forgotten.
		q.mu.Lock()
		require.Len(t, q.tenants[spillway.Critical], 3)
		q.mu.Unlock()
		time.Sleep(time.Second)
		_, done, _ = q.Admit(bg, treq("z"))
		q.mu.Lock()
		require.Len(t, q.tenants[spillway.Critical], 1)
		q.mu.Unlock()
		done(spillway.Success)
	})
}

// Weights and priorities: the capacity a priority shares is what higher
// priorities hold no part of; weights divide it.
func TestQueueFairShareWeights(t *testing.T) {
	q, err := NewQueue(12, QueueSettings{Tenant: spillway.DimAPIKey, TenantWeights: map[string]float64{"gold": 3}})
	require.NoError(t, err)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.usedBy[spillway.CriticalPlus] = 4 // 8 left to Critical
	for _, name := range []string{"gold", "x", "y"} {
		tt := q.tenantFor(spillway.Critical, name)
		tt.inflight = 10
	}
	q.tenantFor(spillway.Critical, "small").inflight = 1
	// small keeps its 1; 7 left, split 3:1:1 among gold, x, y.
	require.InDelta(t, 4.2, q.fairShare(spillway.Critical, "gold", 1), 1e-9)
	require.InDelta(t, 1.4, q.fairShare(spillway.Critical, "x", 1), 1e-9)
	// small wanting 2 is above the level (8 ÷ 6): its part, 4/3.
	require.InDelta(t, 4.0/3, q.fairShare(spillway.Critical, "small", 1), 1e-9)
	// A newcomer of weight 1 wanting 1: its demand fits the level.
	require.InDelta(t, 1, q.fairShare(spillway.Critical, "new", 1), 1e-9)

	for _, bad := range []QueueSettings{{Tenant: "k", TenantWeights: map[string]float64{"a": 0}}, {Tenant: "k", TenantWeights: map[string]float64{"a": math.Inf(1)}}} {
		_, err := NewQueue(1, bad)
		require.Error(t, err)
	}
}

// A tenant forgotten when idle leaves its record of service behind until
// it fades below minServed, for at most maxRemembered tenants per
// priority; a full memory drops the faded records (at most once per
// servedDecay), and a tenant that comes back takes its record back.
func TestQueueTenantMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(1, QueueSettings{Tenant: spillway.DimUser})
		require.NoError(t, err)
		q.mu.Lock()
		defer q.mu.Unlock()
		p := spillway.Critical
		idle := func(name string, served float64) *tenant {
			return &tenant{name: name, p: p, weight: 1, served: served, servedAt: time.Now()}
		}
		for i := range maxRemembered {
			q.remember(idle(strconv.Itoa(i), 1))
		}
		require.Len(t, q.memory[p], maxRemembered)
		q.remember(idle("x", 1)) // full, nothing faded: not kept
		require.Len(t, q.memory[p], maxRemembered)
		require.NotContains(t, q.memory[p], "x")

		time.Sleep(16 * time.Second) // e^(-16/5) = 0.041 of one request: faded
		q.remember(idle("y", 2))
		require.Len(t, q.memory[p], 1)
		q.remember(idle("z", 0.04)) // faded already
		require.Len(t, q.memory[p], 1)

		time.Sleep(5 * time.Second)
		y := q.tenantFor(p, "y")
		require.InDelta(t, 2/math.E, y.servedNow(time.Now()), 1e-9)
		require.Empty(t, q.memory[p])
		require.Equal(t, 0.0, q.tenantFor(p, "x").servedNow(time.Now()))
	})
}
