package clientside_test

import (
	"fmt"
	"time"

	"github.com/spillway-go/spillway/clientside"
)

func ExampleThrottle() {
	now := time.Unix(0, 0)
	draw := 0.5
	th, err := clientside.NewThrottle(clientside.ThrottleSettings{
		Clock: func() time.Time { return now },
		Rand:  func() float64 { return draw },
	})
	if err != nil {
		panic(err)
	}
	// The backend accepted 10 of 40 requests: p = (40 − 2·10) / 41.
	for i := 0; i < 40; i++ {
		th.Allow()
		if i < 10 {
			th.Accepted()
		}
	}
	fmt.Printf("reject probability %.3f\n", th.Probability())
	fmt.Println("draw 0.5 sends:", th.Allow())
	// Output:
	// reject probability 0.488
	// draw 0.5 sends: true
}

func ExampleRetryBudget() {
	now := time.Unix(0, 0)
	b, err := clientside.NewRetryBudget(clientside.RetryBudgetSettings{
		Clock:               func() time.Time { return now },
		MaxTokens:           2,
		MinRetriesPerSecond: -1,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(b.TryRetry(), b.TryRetry(), b.TryRetry()) // starts with 2 tokens
	for i := 0; i < 10; i++ {
		b.Deposit() // 10 requests × 0.1 token
	}
	fmt.Println(b.TryRetry(), b.TryRetry())
	// Output:
	// true true false
	// true false
}

func ExampleBackoff_Delay() {
	b := clientside.Backoff{Rand: func() float64 { return 0.5 }}
	d, _ := b.Delay(3, 0) // exponential: 400ms, equal jitter
	fmt.Println(d)
	d, ok := b.Delay(1, 2*time.Second) // the server's 2s, plus up to 20%
	fmt.Println(d, ok)
	_, ok = b.Delay(1, time.Hour) // more than MaxRetryAfter: give up
	fmt.Println(ok)
	// Output:
	// 300ms
	// 2.2s true
	// false
}
