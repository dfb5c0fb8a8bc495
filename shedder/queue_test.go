package shedder

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/budget"
)

func preq(p spillway.Priority, cost int64) *spillway.Request {
	return &spillway.Request{Endpoint: "/q", Priority: p, Cost: cost}
}

// queued starts an Admit in a goroutine and waits until the Queue counts
// it as waiting, so that the order of arrival is the order of the calls.
type pending struct {
	d    spillway.Decision
	done spillway.Done
	ch   chan struct{}
}

func enqueue(t *testing.T, q *Queue, ctx context.Context, r *spillway.Request) *pending {
	t.Helper()
	before := q.Stats().Waiting
	p := &pending{ch: make(chan struct{})}
	go func() {
		defer close(p.ch)
		p.d, p.done, _ = q.Admit(ctx, r)
	}()
	require.Eventually(t, func() bool { return q.Stats().Waiting == before+1 }, 5*time.Second, time.Millisecond, "request never queued")
	return p
}

func (p *pending) wait(t *testing.T) spillway.Decision {
	t.Helper()
	select {
	case <-p.ch:
	case <-time.After(5 * time.Second):
		t.Fatal("Admit did not return")
	}
	return p.d
}

func (p *pending) returned() bool {
	select {
	case <-p.ch:
		return true
	default:
		return false
	}
}

func fill(t *testing.T, q *Queue, n int, p spillway.Priority) []spillway.Done {
	t.Helper()
	var dones []spillway.Done
	for i := 0; i < n; i++ {
		d, done, err := q.Admit(context.Background(), preq(p, 1))
		require.NoError(t, err)
		require.True(t, d.Allowed, "slot %d", i)
		dones = append(dones, done)
	}
	return dones
}

func TestQueueFreedSlotGoesToHighestPriority(t *testing.T) {
	q, err := NewQueue(2, QueueSettings{MaxWait: time.Hour, Depth: 10})
	require.NoError(t, err)
	held := fill(t, q, 2, spillway.Sheddable)
	ctx := context.Background()
	shed := enqueue(t, q, ctx, preq(spillway.Sheddable, 1))
	read1 := enqueue(t, q, ctx, preq(spillway.SheddablePlus, 1))
	read2 := enqueue(t, q, ctx, preq(spillway.SheddablePlus, 1))
	crit := enqueue(t, q, ctx, preq(spillway.Critical, 1))

	held[0](spillway.Success)
	require.True(t, crit.wait(t).Allowed)
	require.False(t, shed.returned() || read1.returned() || read2.returned(), "a lower priority got the slot")

	held[1](spillway.Success)
	require.True(t, read1.wait(t).Allowed, "the longest-waiting SheddablePlus is next")
	require.False(t, read2.returned() || shed.returned())

	crit.done(spillway.Success)
	require.True(t, read2.wait(t).Allowed)
	read1.done(spillway.Success)
	require.True(t, shed.wait(t).Allowed)

	st := q.Stats()
	require.Equal(t, QueueStats{Admitted: 6, Waited: 4, InFlight: 2, Slots: 2}, st)
	read2.done(spillway.Success)
	shed.done(spillway.Success)
	shed.done(spillway.Success) // twice is harmless
	require.Equal(t, int64(0), q.Stats().InFlight)
}

func TestQueueFullDisplacesTheNewestLowestWaiter(t *testing.T) {
	q, err := NewQueue(1, QueueSettings{MaxWait: time.Hour, Depth: 2, RetryAfter: 3 * time.Second})
	require.NoError(t, err)
	held := fill(t, q, 1, spillway.Critical)
	ctx := context.Background()
	old := enqueue(t, q, ctx, preq(spillway.Sheddable, 1))
	newer := enqueue(t, q, ctx, preq(spillway.Sheddable, 1))

	// Same priority as the waiters: no room, denied at once.
	d, _, err := q.Admit(ctx, preq(spillway.Sheddable, 1))
	require.NoError(t, err)
	require.Equal(t, spillway.Decision{Reason: spillway.ReasonShed, Limiter: "queue", Limit: 1, Remaining: 0, RetryAfter: 3 * time.Second}, d)

	// Higher priority: the newest Sheddable waiter makes room.
	crit := make(chan spillway.Decision, 1)
	go func() {
		d, done, _ := q.Admit(ctx, preq(spillway.Critical, 1))
		crit <- d
		done(spillway.Success)
	}()
	d = newer.wait(t)
	require.False(t, d.Allowed)
	require.Equal(t, spillway.ReasonShed, d.Reason)
	require.False(t, old.returned())

	held[0](spillway.Success)
	require.True(t, (<-crit).Allowed, "the Critical arrival is served before the older Sheddable waiter")
	require.True(t, old.wait(t).Allowed)
	old.done(spillway.Success)

	st := q.Stats()
	require.Equal(t, int64(1), st.Displaced)
	require.Equal(t, int64(1), st.Rejected)
	require.Equal(t, int64(0), st.InFlight)
	require.Equal(t, 0, st.Waiting)
}

func TestQueueWaitRunsOut(t *testing.T) {
	q, err := NewQueue(1, QueueSettings{MaxWait: 20 * time.Millisecond})
	require.NoError(t, err)
	held := fill(t, q, 1, spillway.Sheddable)
	start := time.Now()
	d, _, err := q.Admit(context.Background(), preq(spillway.CriticalPlus, 1))
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, spillway.ReasonShed, d.Reason)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)

	// A context that ends first ends the wait too.
	ctx, cancel := context.WithCancel(context.Background())
	q2, err := NewQueue(1, QueueSettings{MaxWait: time.Hour})
	require.NoError(t, err)
	held2 := fill(t, q2, 1, spillway.Sheddable)
	p := enqueue(t, q2, ctx, preq(spillway.Critical, 1))
	cancel()
	require.False(t, p.wait(t).Allowed)

	// Nothing leaked: each pool takes exactly its slot again once freed.
	for _, c := range []struct {
		q    *Queue
		held []spillway.Done
	}{{q, held}, {q2, held2}} {
		require.Equal(t, int64(1), c.q.Stats().TimedOut)
		c.held[0](spillway.Success)
		fill(t, c.q, 1, spillway.Sheddable)
		d, _, _ := c.q.Admit(ctx, preq(spillway.Sheddable, 1)) // ctx is cancelled: no wait
		require.False(t, d.Allowed)
	}
}

func TestQueueNoWaitAndNoOvertaking(t *testing.T) {
	// MaxWait -1 (no wait): a full pool denies at once.
	q, err := NewQueue(1, QueueSettings{MaxWait: -1})
	require.NoError(t, err)
	fill(t, q, 1, spillway.Sheddable)
	d, _, _ := q.Admit(context.Background(), preq(spillway.CriticalPlus, 1))
	require.False(t, d.Allowed)
	require.Equal(t, int64(1), q.Stats().Rejected)

	// A waiting head of cost 2 is not overtaken by a cost-1 request of
	// its own priority or lower, even with a slot free; a higher priority
	// takes the free slot.
	q, err = NewQueue(3, QueueSettings{MaxWait: time.Hour})
	require.NoError(t, err)
	held := fill(t, q, 2, spillway.Sheddable)
	big := enqueue(t, q, context.Background(), preq(spillway.SheddablePlus, 2))
	small := enqueue(t, q, context.Background(), preq(spillway.SheddablePlus, 1))
	d, crit, _ := q.Admit(context.Background(), preq(spillway.Critical, 1))
	require.True(t, d.Allowed, "the free slot goes to a priority above every waiter")
	held[0](spillway.Success)
	held[1](spillway.Success)
	require.True(t, big.wait(t).Allowed)
	require.False(t, small.returned(), "3 slots: Critical 1 + big 2")
	crit(spillway.Success)
	require.True(t, small.wait(t).Allowed)
}

func TestQueueRejectsBadInput(t *testing.T) {
	q, err := NewQueue(4, QueueSettings{})
	require.NoError(t, err)
	d, _, err := q.Admit(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, spillway.ReasonInvalid, d.Reason)
	d, _, _ = q.Admit(context.Background(), preq(spillway.Critical, 5))
	require.Equal(t, spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "queue", Limit: 4}, d)
	d, _, _ = q.Admit(context.Background(), preq(spillway.Priority(9), 1))
	require.Equal(t, spillway.ReasonInvalid, d.Reason)
	for _, bad := range []struct {
		slots int64
		set   QueueSettings
		want  string
	}{
		{0, QueueSettings{}, "slots 0"},
		{1, QueueSettings{PriorityWait: map[spillway.Priority]time.Duration{spillway.Critical: -time.Second}}, "-1s, negative"},
		{1, QueueSettings{PriorityWait: map[spillway.Priority]time.Duration{7: time.Second}}, "priority wait of a priority outside"},
		{1, QueueSettings{Depth: -1}, "depth -1"},
		{1, QueueSettings{RetryAfter: -1}, "retry after"},
		{1, QueueSettings{LIFO: -1}, "LIFO"},
		{1, QueueSettings{SojournTarget: 2, SojournInterval: 1}, "sojourn"},
	} {
		_, err := NewQueue(bad.slots, bad.set)
		require.ErrorContains(t, err, bad.want)
	}
}

// TestQueueNeverExceedsSlots: 200 goroutines of mixed priorities and
// costs against 10 slots: the work in flight never exceeds 10, every
// admission is released, and the counters add up.
func TestQueueNeverExceedsSlots(t *testing.T) {
	q, err := NewQueue(10, QueueSettings{MaxWait: 5 * time.Millisecond, Depth: 20})
	require.NoError(t, err)
	var inflight, peak, allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 200; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				c := int64(1 + (g+i)%3)
				d, done, _ := q.Admit(context.Background(), preq(spillway.Priority((g+i)%spillway.NumPriorities), c))
				if !d.Allowed {
					denied.Add(1)
					continue
				}
				allowed.Add(1)
				n := inflight.Add(c)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				time.Sleep(100 * time.Microsecond)
				inflight.Add(-c)
				done(spillway.Success)
			}
		}()
	}
	wg.Wait()
	st := q.Stats()
	require.LessOrEqual(t, peak.Load(), int64(10))
	require.Equal(t, int64(0), st.InFlight)
	require.Equal(t, 0, st.Waiting)
	require.Equal(t, allowed.Load(), st.Admitted)
	require.Equal(t, denied.Load(), st.TimedOut+st.Displaced+st.Rejected)
	require.Equal(t, int64(200*50), allowed.Load()+denied.Load())
	require.Positive(t, st.Waited)
	t.Logf("%+v, peak %d", st, peak.Load())
}

// SetSlots grows the pool for the waiters at once, in priority order, and
// shrinks it without cutting work in flight: nothing new is admitted until
// the work in flight is under the new count.
func TestQueueSetSlots(t *testing.T) {
	q, err := NewQueue(2, QueueSettings{MaxWait: time.Hour, Depth: 10})
	require.NoError(t, err)
	held := fill(t, q, 2, spillway.Sheddable)
	ctx := context.Background()
	shed := enqueue(t, q, ctx, preq(spillway.Sheddable, 1))
	crit := enqueue(t, q, ctx, preq(spillway.Critical, 1))
	require.NoError(t, q.SetSlots(3))
	require.True(t, crit.wait(t).Allowed, "the new slot goes to the highest priority waiting")
	require.False(t, shed.returned())
	require.Equal(t, int64(3), q.Slots())

	require.NoError(t, q.SetSlots(1)) // 3 in flight, 1 slot
	held[0](spillway.Success)
	held[1](spillway.Success)
	require.False(t, shed.returned(), "admitted while the work in flight was above the new count")
	crit.done(spillway.Success)
	require.True(t, shed.wait(t).Allowed)
	d, _, _ := q.Admit(ctx, preq(spillway.Critical, 2))
	require.Equal(t, spillway.Decision{Reason: spillway.ReasonCostExceedsLimit, Limiter: "queue", Limit: 1}, d)
	require.Error(t, q.SetSlots(0))
	require.Equal(t, int64(1), q.Slots())
	shed.done(spillway.Success)
	require.Equal(t, QueueStats{Admitted: 4, Waited: 2, InFlight: 0, Slots: 1}, q.Stats())
}

// budgetSeen records whether a chain's next block still had budget left.
type budgetSeen struct{ ok atomic.Bool }

func (b *budgetSeen) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	_, ok := budget.Deadline(ctx, 0)
	b.ok.Store(ok)
	return spillway.Decision{Allowed: true}, spillway.Noop, nil
}

func TestQueueWaitDoesNotSpendTheBudget(t *testing.T) {
	q, err := NewQueue(1, QueueSettings{MaxWait: 5 * time.Second})
	require.NoError(t, err)
	d, hold, err := q.Admit(context.Background(), preq(spillway.Sheddable, 1))
	require.NoError(t, err)
	require.True(t, d.Allowed)
	go func() {
		time.Sleep(400 * time.Millisecond) // twice the budget below
		hold(spillway.Success)
	}()
	next := &budgetSeen{}
	start := time.Now()
	d, done, err := spillway.ChainBudget(200*time.Millisecond, q, next).Admit(context.Background(), preq(spillway.Critical, 1))
	require.NoError(t, err)
	require.True(t, d.Allowed, "the waiter gets the freed slot")
	defer done(spillway.Success)
	require.GreaterOrEqual(t, time.Since(start), 400*time.Millisecond, "the request waited for the slot")
	require.True(t, next.ok.Load(), "the block after the queue found the budget spent by the queue's wait")
}
