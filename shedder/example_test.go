package shedder_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/shedder"
)

func ExampleWorker() {
	now := time.Unix(0, 0)
	// A server with 4 workers; 20% of them (rounded down to 3 left for the
	// rest) are kept for Critical work.
	w, err := shedder.NewWorker(4, shedder.WorkerSettings{Clock: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, p := range []spillway.Priority{spillway.SheddablePlus, spillway.SheddablePlus, spillway.SheddablePlus, spillway.SheddablePlus, spillway.Critical, spillway.Critical} {
		d, _, _ := w.Admit(ctx, &spillway.Request{Priority: p})
		if d.Allowed {
			fmt.Printf("%-14s allowed\n", p)
		} else {
			fmt.Printf("%-14s %v, retry after %v\n", p, d.Reason, d.RetryAfter)
		}
	}
	// Output:
	// sheddable_plus allowed
	// sheddable_plus allowed
	// sheddable_plus allowed
	// sheddable_plus shed, retry after 1s
	// critical       allowed
	// critical       shed, retry after 1s
}

func ExampleClassifyHTTP() {
	for _, r := range []*http.Request{
		httptest.NewRequest("GET", "/healthz", nil),
		httptest.NewRequest("POST", "/v1/charges", nil),
		httptest.NewRequest("GET", "/v1/charges", nil),
	} {
		fmt.Println(r.Method, r.URL.Path, shedder.ClassifyHTTP(r))
	}
	test := httptest.NewRequest("POST", "/v1/charges", nil)
	test.Header.Set(shedder.TestModeHeader, "1")
	fmt.Println("test mode:", shedder.ClassifyHTTP(test))
	// Output:
	// GET /healthz critical_plus
	// POST /v1/charges critical
	// GET /v1/charges sheddable_plus
	// test mode: sheddable
}

// A caller's priority arrives in spillway.PriorityHeader (httpx.Transport
// sets it from the context of the request being served); the backend's
// classifier may lower a request's priority to it.
func ExampleHTTPClassifier_trustHeader() {
	out, _ := http.NewRequest("GET", "http://backend.internal/v1/balance", nil)
	out.Header.Set(spillway.PriorityHeader, spillway.Critical.String())
	fmt.Println(spillway.PriorityHeader+":", out.Header.Get(spillway.PriorityHeader))

	// The backend's classifier raises a GET to the caller's priority only
	// when it trusts the header (it sits behind an edge that strips it).
	backend := shedder.HTTPClassifier{TrustHeader: true}
	fmt.Println("backend classifies it", backend.Classify(out))
	// Output:
	// Spillway-Priority: critical
	// backend classifies it critical
}

// A database pool whose size is learned from the latency of its queries:
// it starts at 2 slots, doubles while queries keep their latency and use
// the slots (slow start), halves when one fails, and hands a freed slot to
// the highest priority waiting. In a fleet, NewPool's fleet caps it at
// what the fleet shedder allows this server, and a CapacityWatcher feeds
// it the database's utilization gauge.
func ExamplePool() {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	lim, _ := concurrency.NewLatencyLimit(concurrency.LatencyConfig{Initial: 2})
	pool, err := shedder.NewPool(lim, nil, shedder.QueueSettings{Name: "db_pool", Clock: clock,
		MaxWait: time.Second, // Critical work waits up to 1 s for a slot
		PriorityWait: map[spillway.Priority]time.Duration{ // batch work never waits
			spillway.SheddablePlus: 0, spillway.Sheddable: 0}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	critical := &spillway.Request{Priority: spillway.Critical}
	query := func(n int, rtt time.Duration, o spillway.Outcome) {
		var dones []spillway.Done
		for i := 0; i < n; i++ {
			_, done, _ := pool.Admit(ctx, critical)
			dones = append(dones, done)
		}
		now = now.Add(rtt)
		for _, done := range dones {
			done(o)
		}
	}
	fmt.Println("slots:", pool.Slots())
	for i := 0; i < 12; i++ { // 24 queries of 5 ms, two at a time
		query(2, 5*time.Millisecond, spillway.Success)
	}
	fmt.Println("after 24 queries:", pool.Slots())
	query(1, time.Second, spillway.Dropped) // a query timed out
	fmt.Println("after a timeout:", pool.Slots())

	// Both slots busy: batch work is turned away, Critical work waits for
	// the next slot.
	_, done1, _ := pool.Admit(ctx, critical)
	_, done2, _ := pool.Admit(ctx, critical)
	d, _, _ := pool.Admit(ctx, &spillway.Request{Priority: spillway.SheddablePlus})
	fmt.Println("batch:", d.Allowed, d.Reason, d.RetryAfter)
	got := make(chan bool)
	go func() {
		d, done, _ := pool.Admit(ctx, critical)
		done(spillway.Ignored)
		got <- d.Allowed
	}()
	for pool.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	done1(spillway.Ignored) // its slot goes to the waiter
	fmt.Println("critical, after a wait:", <-got)
	done2(spillway.Ignored)
	// Output:
	// slots: 2
	// after 24 queries: 4
	// after a timeout: 2
	// batch: false shed 1s
	// critical, after a wait: true
}
