package sim

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-go/spillway"
)

// RetryMode is how a client retries a failed attempt.
type RetryMode uint8

const (
	// RetryNaive retries at once, whatever the answer said, up to
	// maxNaiveRetries times: the retry storm.
	RetryNaive RetryMode = iota
	// RetryHonor waits for Retry-After (with jitter; exponential backoff
	// when there is none) and retries only Critical and CriticalPlus
	// work, under a retry budget.
	RetryHonor
)

func (m RetryMode) String() string {
	if m == RetryHonor {
		return "honor"
	}
	return "naive"
}

const (
	maxNaiveRetries = 3
	maxHonorRetries = 3
	budgetRatio     = 0.1 // retries per request the budget allows
	budgetMax       = 10.0
)

// Fleet clients: a load balancer (round robin) in front of the API servers
// and the client behaviour of each identity.
type Clients struct {
	hc       *http.Client
	route    atomic.Pointer[routing]
	rr       atomic.Uint64
	timeout  time.Duration // per attempt
	rec      *Recorder
	well     RetryMode // well-behaved clients
	abusive  RetryMode // abusive clients
	budgets  []retryBudget
	inflight sync.WaitGroup
	// Deadline makes every attempt state its timeout in the
	// spillway.TimeoutHeader header.
	Deadline bool
}

// routing is what the load balancer does now: the live servers, and the
// share of the traffic sent to the first of them (0: round robin over all;
// else the rest goes round robin over the others).
type routing struct {
	servers []string
	hot     float64
}

// SetServers replaces the live servers (a server died or joined).
func (c *Clients) SetServers(servers []string) {
	r := *c.route.Load()
	r.servers = servers
	c.route.Store(&r)
}

// SetHotShare sends share of the traffic to the first live server.
func (c *Clients) SetHotShare(share float64) {
	r := *c.route.Load()
	r.hot = share
	c.route.Store(&r)
}

// pick returns the server for an attempt; u is uniform in [0, 1).
func (c *Clients) pick(u float64) string {
	r := c.route.Load()
	n := uint64(len(r.servers))
	if r.hot > 0 && n > 1 {
		if u < r.hot {
			return r.servers[0]
		}
		return r.servers[1+c.rr.Add(1)%(n-1)]
	}
	return r.servers[c.rr.Add(1)%n]
}

// retryBudget is a token bucket of retries: each request earns
// budgetRatio of a retry, each retry spends one, so retries stay under
// ~10% of requests once the initial allowance is spent.
type retryBudget struct {
	mu     sync.Mutex
	tokens float64
}

func (b *retryBudget) earn() {
	b.mu.Lock()
	b.tokens = min(budgetMax, b.tokens+budgetRatio)
	b.mu.Unlock()
}

func (b *retryBudget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func newTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// Bounds the attempts left running after the client gave up.
		ResponseHeaderTimeout: 8 * time.Second,
	}
}

// NewClients returns the client population's behaviour against servers.
func NewClients(servers []string, n int, timeout time.Duration, well RetryMode, rec *Recorder) *Clients {
	c := &Clients{
		hc:      &http.Client{Transport: newTransport()},
		timeout: timeout,
		rec:     rec,
		well:    well,
		abusive: RetryNaive,
		budgets: make([]retryBudget, n),
	}
	for i := range c.budgets {
		c.budgets[i].tokens = 2
	}
	c.route.Store(&routing{servers: servers})
	return c
}

// Close waits for attempts still running (the server answers every one,
// at the latest at its backend's statement timeout) and closes the
// connections.
func (c *Clients) Close() {
	done := make(chan struct{})
	go func() { c.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	c.hc.CloseIdleConnections()
}

type attemptResult struct {
	status     int
	retryAfter time.Duration
	err        error
}

// Do runs one logical request with its retries; ctx ends the run (no more
// retries after it).
func (c *Clients) Do(ctx context.Context, a Arrival) {
	mode := c.well
	if a.Abusive {
		mode = c.abusive
	}
	rng := rand.New(rand.NewPCG(a.Seed, 7))
	if a.Export {
		// One try: a report is Sheddable work, not retried.
		res, timedOut := c.attempt(a, false, rng.Float64())
		c.rec.Export(res.err == nil && res.status == http.StatusOK && !timedOut)
		return
	}
	budget := &c.budgets[a.Client]
	budget.earn()
	start := time.Now()
	ok := false
	for attempt := 0; ; attempt++ {
		res, timedOut := c.attempt(a, attempt > 0, rng.Float64())
		ok = res.err == nil && res.status == http.StatusOK && !timedOut
		c.rec.AttemptResult(ok, timedOut)
		if a.Tenant > 0 {
			c.rec.Tenant(a.Tenant, ok, res.status, res.retryAfter)
		}
		if ok || ctx.Err() != nil {
			break
		}
		var wait time.Duration
		if mode == RetryNaive {
			if attempt >= maxNaiveRetries {
				break
			}
		} else {
			// Only user-facing work is worth a retry: Sheddable and
			// SheddablePlus work (prefetch, batch) is dropped, so the
			// retry budget is spent where it matters.
			if a.Priority < spillway.Critical || attempt >= maxHonorRetries || !budget.spend() {
				break
			}
			if res.retryAfter > 0 {
				wait = res.retryAfter + time.Duration(rng.Float64()*0.5*float64(res.retryAfter))
			} else {
				wait = time.Duration((0.5 + rng.Float64()) * float64(200*time.Millisecond<<attempt))
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	if !a.Abusive && a.Priority >= spillway.Critical {
		c.rec.Critical(ok, time.Since(start))
	}
}

// attempt sends one attempt to the next server. The client stops waiting
// after its timeout, but the HTTP request itself is left to finish in the
// background (its answer is discarded): a client that gave up does not
// stop the work it caused, and the connection stays reusable.
func (c *Clients) attempt(a Arrival, retry bool, u float64) (attemptResult, bool) {
	srv := c.pick(u)
	method, path := http.MethodGet, "/api/v1/search"
	switch {
	case a.Export:
		path = ExportPath
	case a.Priority >= spillway.Critical:
		method, path = http.MethodPost, "/api/v1/posts"
	}
	if !a.Export {
		c.rec.Attempt(retry)
	}
	req, err := http.NewRequest(method, srv+path, nil)
	if err != nil {
		return attemptResult{err: err}, false
	}
	req.Header.Set("X-API-Key", apiKey(a.Client))
	req.Header.Set(priorityHeader, a.Priority.String())
	if a.Tenant > 0 {
		req.Header.Set(TenantHeader, "tenant-"+strconv.Itoa(a.Tenant))
	}
	if c.Deadline {
		req.Header.Set(spillway.TimeoutHeader, strconv.FormatInt(c.timeout.Milliseconds(), 10))
	}
	done := make(chan attemptResult, 1)
	c.inflight.Add(1)
	go func() {
		defer c.inflight.Done()
		resp, err := c.hc.Do(req)
		if err != nil {
			done <- attemptResult{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r := attemptResult{status: resp.StatusCode}
		if s := resp.Header.Get("Retry-After"); s != "" {
			if secs, err := strconv.Atoi(s); err == nil && secs > 0 {
				r.retryAfter = time.Duration(secs) * time.Second
			}
		}
		done <- r
	}()
	timeout := c.timeout
	if a.Export {
		timeout += ExportHold // a report's client knows it takes a while
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	t0 := time.Now()
	select {
	case r := <-done:
		if c.rec.Debug.On() {
			k := "client:" + strconv.Itoa(r.status)
			c.rec.Debug.Add(k+"_n", 1)
			c.rec.Debug.Add(k+"_us", time.Since(t0).Microseconds())
		}
		return r, false
	case <-t.C:
		if c.rec.Debug.On() {
			c.rec.Debug.Add("client:timeout_n", 1)
		}
		return attemptResult{}, true
	}
}

const priorityHeader = "X-Priority"

// TenantHeader carries a request's tenant (the account its API key belongs
// to); the servers make it the request's user dimension.
const TenantHeader = "X-Tenant"

func apiKey(client int) string { return "key-" + strconv.Itoa(client) }
