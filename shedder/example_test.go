package shedder_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/shedder"
)

func ExampleWorker() {
	now := time.Unix(0, 0)
	// A server with 4 workers; 20% of them (rounded down to 3 left for the
	// rest) are kept for Critical work.
	w, err := shedder.NewWorker(4, shedder.WithClock(func() time.Time { return now }))
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
