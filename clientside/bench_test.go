package clientside_test

import (
	"testing"

	"github.com/spillway-go/spillway/clientside"
)

func BenchmarkThrottleAllow(b *testing.B) {
	th, _ := clientside.NewThrottle(clientside.ThrottleSettings{})
	b.ReportAllocs()
	for b.Loop() {
		if th.Allow() {
			th.Accepted()
		}
	}
}

func BenchmarkRetryBudget(b *testing.B) {
	rb, _ := clientside.NewRetryBudget(clientside.RetryBudgetSettings{})
	b.ReportAllocs()
	for b.Loop() {
		rb.Deposit()
		rb.TryRetry()
	}
}
