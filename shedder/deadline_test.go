package shedder

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spillway-go/spillway"
)

// admitAsync starts an Admit and returns where its decision will be.
func admitAsync(q *Queue, ctx context.Context, r *spillway.Request) *pending {
	p := &pending{ch: make(chan struct{})}
	go func() {
		defer close(p.ch)
		p.d, p.done, _ = q.Admit(ctx, r)
	}()
	return p
}

// deadlineOnly carries a deadline that never cancels it, as a context
// whose deadline a block reads before its timer fires.
type deadlineOnly struct {
	context.Context
	at time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.at, true }

// A request whose expected wait is longer than its deadline leaves it is
// refused at once; one whose deadline passes while it waits is dropped
// before any work; a request whose context already ended gets nothing.
func TestQueueDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(2, QueueSettings{MaxWait: time.Second, Depth: 10})
		require.NoError(t, err)
		bg := context.Background()
		// Work holds its slot 100 ms on average.
		held := fill(t, q, 2, spillway.Critical)
		time.Sleep(100 * time.Millisecond)
		finish(held)
		require.Equal(t, 100*time.Millisecond, q.Hold())
		held = fill(t, q, 2, spillway.Critical)

		// Both slots used, nobody waiting: one unit ahead, 50 ms expected,
		// then 100 ms of work.
		ctx30, cancel30 := context.WithTimeout(bg, 30*time.Millisecond)
		defer cancel30()
		d, _, _ := q.Admit(ctx30, preq(spillway.Critical, 1))
		require.Equal(t, spillway.Decision{Reason: spillway.ReasonShed, Limiter: "queue", Limit: 2, RetryAfter: time.Second}, d)
		ctx80, cancel80 := context.WithTimeout(bg, 160*time.Millisecond)
		defer cancel80()
		b := admitAsync(q, ctx80, preq(spillway.Critical, 1)) // 150 ms ≤ 160 ms: waits
		synctest.Wait()
		c := admitAsync(q, bg, preq(spillway.Critical, 1)) // no deadline: waits
		synctest.Wait()
		// Three units ahead now: 150 + 100 ms expected, more than 200 ms left.
		ctx120, cancel120 := context.WithTimeout(bg, 200*time.Millisecond)
		defer cancel120()
		d, _, _ = q.Admit(ctx120, preq(spillway.Critical, 1))
		require.False(t, d.Allowed)
		// A lower priority waits behind the higher ones too.
		d, _, _ = q.Admit(ctx120, preq(spillway.SheddablePlus, 1))
		require.False(t, d.Allowed)
		require.Equal(t, 2, q.Stats().Waiting)

		// b's deadline passes while it waits: dropped.
		time.Sleep(170 * time.Millisecond)
		synctest.Wait()
		require.True(t, b.returned())
		require.Equal(t, spillway.ReasonShed, b.d.Reason)
		// A freed slot goes to c.
		held[0](spillway.Success)
		synctest.Wait()
		require.True(t, c.returned() && c.d.Allowed)
		// A context that already ended gets nothing, free slot or not.
		c.done(spillway.Success)
		gone, cancel := context.WithCancel(bg)
		cancel()
		d, _, _ = q.Admit(gone, preq(spillway.Critical, 1))
		require.False(t, d.Allowed)
		require.Equal(t, QueueStats{Admitted: 5, Waited: 1, Late: 4, Expired: 1, InFlight: 1, Slots: 2}, q.Stats())
		held[1](spillway.Success)

		// A waiter whose deadline passed by the time a slot frees is
		// denied at the grant, and the slot goes on to the next.
		held = fill(t, q, 2, spillway.Critical)
		late := admitAsync(q, deadlineOnly{bg, time.Now().Add(200 * time.Millisecond)}, preq(spillway.Critical, 1))
		synctest.Wait()
		next := admitAsync(q, bg, preq(spillway.Critical, 1))
		synctest.Wait()
		time.Sleep(210 * time.Millisecond)
		held[0](spillway.Success)
		synctest.Wait()
		require.True(t, late.returned() && !late.d.Allowed)
		require.True(t, next.returned() && next.d.Allowed)
		st := q.Stats()
		require.Equal(t, int64(2), st.Expired)
		require.Equal(t, int64(2), st.InFlight)
		held[1](spillway.Success)
		next.done(spillway.Success)
	})
}

// QueueSettings.LIFO: while the oldest waiter has waited the threshold, a freed slot
// goes to the newest; otherwise to the oldest.
func TestQueueAdaptiveLIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(1, QueueSettings{MaxWait: time.Second, Depth: 10, LIFO: 50 * time.Millisecond})
		require.NoError(t, err)
		bg := context.Background()
		held := fill(t, q, 1, spillway.Critical)
		w1 := admitAsync(q, bg, preq(spillway.Critical, 1))
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		w2 := admitAsync(q, bg, preq(spillway.Critical, 1))
		synctest.Wait()
		// 10 ms: no standing queue, the oldest first.
		held[0](spillway.Success)
		synctest.Wait()
		require.True(t, w1.returned() && w1.d.Allowed)
		require.False(t, w2.returned())
		time.Sleep(20 * time.Millisecond)
		w3 := admitAsync(q, bg, preq(spillway.Critical, 1))
		synctest.Wait()
		time.Sleep(40 * time.Millisecond) // w2 has waited 60 ms: the newest first
		w1.done(spillway.Success)
		synctest.Wait()
		require.True(t, w3.returned() && w3.d.Allowed)
		require.False(t, w2.returned())
		w3.done(spillway.Success)
		synctest.Wait()
		require.True(t, w2.returned() && w2.d.Allowed)
		w2.done(spillway.Success)

		_, err = NewQueue(1, QueueSettings{LIFO: -time.Millisecond})
		require.EqualError(t, err, "shedder: LIFO threshold -1ms is negative")
	})
}

// QueueSettings.SojournTarget and SojournInterval: a queue that has not been empty for the interval bounds a
// new wait by the target and denies, at its turn, a waiter that has
// waited longer; before that a wait is bounded by the interval.
func TestQueueSojourn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, err := NewQueue(1, QueueSettings{MaxWait: time.Second, Depth: 10, SojournTarget: 10 * time.Millisecond, SojournInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		bg := context.Background()
		held := fill(t, q, 1, spillway.Critical)
		w1 := admitAsync(q, bg, preq(spillway.Critical, 1)) // waits at most 100 ms
		synctest.Wait()
		time.Sleep(50 * time.Millisecond)
		w2 := admitAsync(q, bg, preq(spillway.Critical, 1)) // not standing yet: 100 ms too
		synctest.Wait()
		time.Sleep(51 * time.Millisecond)
		synctest.Wait()
		require.True(t, w1.returned() && !w1.d.Allowed) // its 100 ms ran out
		// The queue has not been empty for 101 ms: standing.
		w3 := admitAsync(q, bg, preq(spillway.Critical, 1))
		synctest.Wait()
		time.Sleep(4 * time.Millisecond)
		held[0](spillway.Success) // w2 waited 55 ms > 10 ms: denied; w3 (4 ms) served
		synctest.Wait()
		require.True(t, w2.returned() && !w2.d.Allowed)
		require.True(t, w3.returned() && w3.d.Allowed)
		w3.done(spillway.Success)
		// A new arrival under a standing queue waits at most the target.
		held = fill(t, q, 1, spillway.Critical)
		w4 := admitAsync(q, bg, preq(spillway.Critical, 1)) // the queue was empty: 100 ms
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.True(t, w4.returned() && !w4.d.Allowed)
		require.Equal(t, QueueStats{Admitted: 3, Waited: 1, TimedOut: 2, Expired: 1, InFlight: 1, Slots: 1}, q.Stats())
		held[0](spillway.Success)

		for _, c := range [][2]time.Duration{{0, time.Second}, {time.Second, time.Millisecond}, {-1, time.Second}} {
			_, err = NewQueue(1, QueueSettings{SojournTarget: c[0], SojournInterval: c[1]})
			require.Error(t, err)
		}
	})
}

func finish(dones []spillway.Done) {
	for _, d := range dones {
		d(spillway.Success)
	}
}
