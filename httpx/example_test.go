package httpx_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/ratelimit"
)

func ExampleMiddleware() {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 2, Period: time.Minute}, ratelimit.Settings{Scope: "per_ip"})
	if err != nil {
		panic(err)
	}
	mw := httpx.Middleware(ratelimit.PerKey(lim, spillway.DimIP), httpx.Settings{})
	mux := http.NewServeMux()
	mux.Handle("GET /search", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "results")
	})))
	for range 3 {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/search", nil)) // from 192.0.2.1
		fmt.Printf("%d remaining=%s retry-after=%q\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=1 retry-after=""
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="30"
}

func ExampleTransport() {
	client := &http.Client{Transport: &httpx.Transport{Client: clientside.NewClient()}}
	_ = client // 429 and 503 answers to GETs are retried after Retry-After, under a retry budget
}
