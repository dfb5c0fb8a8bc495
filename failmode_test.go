package spillway_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

func TestFailModeText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want spillway.FailMode
	}{
		{"open", spillway.FailOpen}, {"closed", spillway.FailClosed}, {" Closed ", spillway.FailClosed},
		{"fail_open", spillway.FailOpen}, {"fail-closed", spillway.FailClosed},
	} {
		got, err := spillway.ParseFailMode(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFailMode(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := spillway.ParseFailMode("maybe"); err == nil || err.Error() != `spillway: unknown fail mode "maybe" (want open or closed)` {
		t.Errorf("ParseFailMode(maybe) = %v", err)
	}
	if s := spillway.FailMode(7).String(); s != "failmode(7)" {
		t.Errorf("FailMode(7) = %q", s)
	}
	if b, err := spillway.FailMode(7).MarshalText(); err == nil {
		t.Errorf("FailMode(7).MarshalText() = %q, nil; want an error", b)
	}
	var m spillway.FailMode
	if err := m.UnmarshalText([]byte("closed")); err != nil || m != spillway.FailClosed {
		t.Errorf("UnmarshalText(closed) = %v, %v", m, err)
	}
	if err := m.UnmarshalText([]byte("shut")); err == nil || m != spillway.FailClosed {
		t.Errorf("UnmarshalText(shut) = %v, %v; want an error and m unchanged", m, err)
	}
	if b, err := spillway.FailOpen.MarshalText(); err != nil || string(b) != "open" {
		t.Errorf("MarshalText(open) = %q, %v", b, err)
	}
	if _, err := spillway.FailMode(3).MarshalText(); err == nil {
		t.Error("MarshalText(3) succeeded")
	}
}

func TestStoreError(t *testing.T) {
	refused := errors.New("connection refused")
	err := fmt.Errorf("chain: %w", &spillway.StoreError{Limiter: "tiers", Fail: spillway.FailClosed, Rules: []string{"login", "all"}, Err: refused})
	if !errors.Is(err, spillway.ErrStoreUnavailable) || !errors.Is(err, refused) {
		t.Fatalf("errors.Is: %v", err)
	}
	if got := err.Error(); got != "chain: spillway: store unavailable (tiers, rules [login all], fail closed): connection refused" {
		t.Fatalf("Error() = %q", got)
	}
	if block.FailModeOf(err, spillway.FailOpen) != spillway.FailClosed {
		t.Fatal("FailModeOf(closed store error, open) is not closed")
	}
	open := &spillway.StoreError{Err: refused}
	if got := open.Error(); got != "spillway: store unavailable (fail open): connection refused" {
		t.Fatalf("Error() = %q", got)
	}
	for _, tc := range []struct {
		err  error
		def  spillway.FailMode
		want spillway.FailMode
	}{
		{open, spillway.FailOpen, spillway.FailOpen},
		{open, spillway.FailClosed, spillway.FailClosed}, // closed wins
		{refused, spillway.FailOpen, spillway.FailOpen},
		{refused, spillway.FailClosed, spillway.FailClosed},
	} {
		if got := block.FailModeOf(tc.err, tc.def); got != tc.want {
			t.Errorf("FailModeOf(%v, %v) = %v; want %v", tc.err, tc.def, got, tc.want)
		}
	}
	if errors.Is(refused, spillway.ErrStoreUnavailable) {
		t.Fatal("a plain error matched ErrStoreUnavailable")
	}
}

func TestPriorityPropagation(t *testing.T) {
	ctx := context.Background()
	if _, ok := spillway.PriorityFromContext(ctx); ok {
		t.Fatal("empty context has a priority")
	}
	ctx = spillway.ContextWithPriority(ctx, spillway.SheddablePlus)
	if p, ok := spillway.PriorityFromContext(ctx); !ok || p != spillway.SheddablePlus {
		t.Fatalf("PriorityFromContext = %v, %v", p, ok)
	}
	if _, ok := spillway.PriorityFromContext(spillway.ContextWithPriority(ctx, 9)); ok {
		t.Fatal("an invalid priority was reported")
	}
	for _, tc := range []struct {
		in   string
		want spillway.Priority
		ok   bool
	}{
		{"critical_plus", spillway.CriticalPlus, true}, {" SHEDDABLE ", spillway.Sheddable, true},
		{"sheddable-plus", spillway.SheddablePlus, true}, {"", 0, false}, {"bogus", 0, false},
	} {
		if p, err := spillway.ParsePriority(tc.in); p != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v, ok %v", tc.in, p, err, tc.want, tc.ok)
		}
	}
}

func TestReceivedPriority(t *testing.T) {
	for _, tc := range []struct {
		def   spillway.Priority
		value string
		trust bool
		want  spillway.Priority
	}{
		{spillway.Critical, "sheddable", false, spillway.Sheddable},
		{spillway.Critical, "critical_plus", false, spillway.Critical},
		{spillway.Critical, "critical_plus", true, spillway.CriticalPlus},
		{spillway.SheddablePlus, "", true, spillway.SheddablePlus},
		{spillway.SheddablePlus, "bogus", true, spillway.SheddablePlus},
	} {
		if got := block.ReceivedPriority(tc.def, tc.value, tc.trust); got != tc.want {
			t.Errorf("ReceivedPriority(%v, %q, %v) = %v; want %v", tc.def, tc.value, tc.trust, got, tc.want)
		}
	}
}

func TestRequestValid(t *testing.T) {
	var nilReq *spillway.Request
	for _, tc := range []struct {
		r    *spillway.Request
		want bool
	}{
		{nilReq, false},
		{&spillway.Request{}, true},
		{&spillway.Request{Cost: -1}, false},
		{&spillway.Request{Priority: 4}, false},
		{&spillway.Request{Priority: -1}, false},
		{&spillway.Request{Priority: spillway.CriticalPlus, Cost: 1 << 40}, true},
	} {
		if got := tc.r.Validate() == nil; got != tc.want {
			t.Errorf("Validate(%+v) == nil is %v; want %v", tc.r, got, tc.want)
		}
	}
}
