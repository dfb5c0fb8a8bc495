package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// fixed answers every Admit with d and err, and records the releases of its
// Done.
type fixed struct {
	d        spillway.Decision
	err      error
	calls    int
	released []spillway.Outcome
}

func (f *fixed) Admit(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
	f.calls++
	if f.err != nil {
		return spillway.Decision{}, spillway.Noop, f.err
	}
	return f.d, func(o spillway.Outcome) { f.released = append(f.released, o) }, nil
}

func TestAdmit(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	closedErr := &spillway.StoreError{Limiter: "tiers", Fail: spillway.FailClosed, Err: down}
	openErr := &spillway.StoreError{Limiter: "tiers", Fail: spillway.FailOpen, Err: down}
	rate := spillway.Decision{Reason: spillway.ReasonRateLimited, Limiter: "ip", Limit: 5, RetryAfter: time.Second}
	ok := spillway.Decision{Allowed: true, Limiter: "ip", Limit: 5, Remaining: 4}
	for _, tc := range []struct {
		name     string
		d        spillway.Decision
		err      error
		fail     spillway.FailMode
		want     spillway.Decision
		wantErr  error
		released []spillway.Outcome // after Admit, before the handler
	}{
		{"allowed", ok, nil, spillway.FailOpen, ok, nil, nil},
		{"denied, done called at once", rate, nil, spillway.FailOpen, rate, nil, []spillway.Outcome{spillway.Ignored}},
		{"plain error, fail open", spillway.Decision{}, down, spillway.FailOpen, spillway.Decision{Allowed: true}, down, nil},
		{"plain error, fail closed", spillway.Decision{}, down, spillway.FailClosed, spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: LimiterStore}, down, nil},
		{"closed store error, fail open", spillway.Decision{}, closedErr, spillway.FailOpen, spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: LimiterStore}, closedErr, nil},
		{"open store error, fail open", spillway.Decision{}, openErr, spillway.FailOpen, spillway.Decision{Allowed: true}, openErr, nil},
		{"open store error, fail closed", spillway.Decision{}, openErr, spillway.FailClosed, spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: LimiterStore}, openErr, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &fixed{d: tc.d, err: tc.err}
			r := NewRequest()
			r.Set(spillway.DimIP, "10.0.0.1")
			res := Admit(ctx, l, r, tc.fail)
			if res.Decision != tc.want || res.Err != tc.wantErr || res.Invalid != nil || res.Done == nil {
				t.Fatalf("Admit = %+v; want decision %+v, err %v", res, tc.want, tc.wantErr)
			}
			if len(l.released) != len(tc.released) || (len(tc.released) > 0 && l.released[0] != tc.released[0]) {
				t.Fatalf("released %v; want %v", l.released, tc.released)
			}
			res.Done(spillway.Success)
			if !tc.want.Allowed || tc.err != nil {
				if len(l.released) != len(tc.released) {
					t.Fatalf("the Done of a denial or an error released again: %v", l.released)
				}
				return
			}
			if len(l.released) != 1 || l.released[0] != spillway.Success {
				t.Fatalf("released %v; want [success]", l.released)
			}
		})
	}
	// A malformed request never reaches the limiter.
	for _, r := range []*spillway.Request{nil, {Cost: -1, Priority: spillway.Critical}, {Priority: 7}} {
		l := &fixed{d: ok}
		res := Admit(ctx, l, r, spillway.FailOpen)
		want := spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: LimiterRequest}
		if res.Decision != want || !errors.Is(res.Invalid, spillway.ErrInvalidRequest) || res.Err != nil || l.calls != 0 {
			t.Fatalf("Admit(%+v) = %+v, %d calls; want %+v without a call", r, res, l.calls, want)
		}
	}
}

func TestGuard(t *testing.T) {
	var got []spillway.Outcome
	done := block.Once(func(o spillway.Outcome) { got = append(got, o) })
	func() {
		defer func() { _ = recover() }()
		g := Guard{Done: done}
		defer g.Release()
		panic("handler bug")
	}()
	if len(got) != 1 || got[0] != spillway.Ignored {
		t.Fatalf("panic released %v; want [ignored]", got)
	}
	got = nil
	func() {
		g := Guard{Done: func(o spillway.Outcome) { got = append(got, o) }}
		defer g.Release()
		g.Finish(spillway.Dropped)
	}()
	if len(got) != 1 || got[0] != spillway.Dropped {
		t.Fatalf("finished released %v; want [dropped] once", got)
	}
}

func TestClassAndRetry(t *testing.T) {
	for _, tc := range []struct {
		d     spillway.Decision
		class Class
		wait  time.Duration
		retry bool
	}{
		{spillway.Decision{Allowed: true}, Allowed, 0, false},
		{spillway.Decision{Reason: spillway.ReasonInvalid}, Invalid, 0, false},
		{spillway.Decision{Reason: spillway.ReasonRateLimited, RetryAfter: 1500 * time.Millisecond}, TooMany, 1500 * time.Millisecond, true},
		{spillway.Decision{Reason: spillway.ReasonConcurrency}, TooMany, time.Second, true},
		{spillway.Decision{Reason: spillway.ReasonCostExceedsLimit}, TooMany, 0, false},
		{spillway.Decision{Reason: spillway.ReasonShed, RetryAfter: 200 * time.Millisecond}, Unavailable, 200 * time.Millisecond, true},
		{spillway.Decision{Reason: spillway.ReasonCeiling}, Unavailable, time.Second, true},
		{spillway.Decision{Reason: spillway.ReasonFailClosed}, Unavailable, time.Second, true},
	} {
		if c := ClassOf(tc.d); c != tc.class {
			t.Errorf("ClassOf(%v) = %d; want %d", tc.d.Reason, c, tc.class)
		}
		if w, ok := RetryAfter(tc.d); w != tc.wait || ok != tc.retry {
			t.Errorf("RetryAfter(%+v) = %v, %v; want %v, %v", tc.d, w, ok, tc.wait, tc.retry)
		}
	}
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, time.Nanosecond: 1, time.Second: 1, 1001 * time.Millisecond: 2} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d; want %d", d, got, want)
		}
	}
}

func TestRateValues(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	if v := RateValues(spillway.Decision{Allowed: true}, now); v != nil {
		t.Fatalf("no Limit: %v; want nil", v)
	}
	v := RateValues(spillway.Decision{Allowed: true, Limit: 10, Remaining: -3, ResetAfter: 1500 * time.Millisecond}, now)
	if len(v) != 3 || v[0] != "10" || v[1] != "0" || v[2] != "1700000002" {
		t.Fatalf("RateValues = %v; want [10 0 1700000002] (remaining clamped, reset rounded up)", v)
	}
	v = RateValues(spillway.Decision{Limit: 10, Remaining: 3, ResetAfter: 2 * time.Second}, now)
	if v[1] != "3" || v[2] != "1700000002" {
		t.Fatalf("RateValues = %v; want remaining 3, reset exact", v)
	}
}
