package httpx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/admission"
	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
)

// Middleware returns net/http middleware that admits every request through
// l before the handler runs, configured by s (Settings{} for the
// defaults). See the package doc for what it sends.
func Middleware(l spillway.Limiter, s Settings) func(http.Handler) http.Handler {
	c := newConfig(s)
	return func(next http.Handler) http.Handler {
		return &handler{c: c, l: l, next: next}
	}
}

type handler struct {
	c    config
	l    spillway.Limiter
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &h.c
	if c.skip != nil && c.skip(r) {
		h.next.ServeHTTP(w, r)
		return
	}
	req := h.request(r)
	var usage *spillway.Usage
	if c.meter {
		usage = new(spillway.Usage)
		req.Usage = usage
	}
	var res admission.Result
	clientDeadline := false // the context's deadline is the client's (Settings.DeadlineHeader)
	if c.dlHeader != "" {
		if v := r.Header.Values(c.dlHeader); len(v) > 0 {
			d, err := spillway.ParseTimeout(v[0])
			if err == nil && len(v) > 1 {
				err = errors.New("more than one value")
			}
			if err != nil {
				err = fmt.Errorf("httpx: header %s: %w", c.dlHeader, err)
				res = admission.Result{Decision: spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: admission.LimiterRequest}, Done: spillway.Noop, Invalid: err}
			} else {
				prev, had := r.Context().Deadline()
				ctx, cancel := context.WithTimeout(r.Context(), d)
				defer cancel()
				r = r.WithContext(ctx)
				next, _ := ctx.Deadline()
				clientDeadline = !had || next.Before(prev)
			}
		}
	}
	if res.Invalid == nil && c.estHeader != "" {
		if v := r.Header.Values(c.estHeader); len(v) > 0 {
			n, err := admission.ParseCost(v[0])
			if err == nil && len(v) > 1 {
				err = errors.New("more than one value")
			}
			if err != nil {
				err = fmt.Errorf("httpx: header %s: %w", c.estHeader, err)
				res = admission.Result{Decision: spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: admission.LimiterRequest}, Done: spillway.Noop, Invalid: err}
			}
			req.Cost = n
		}
	}
	// One budget for the whole request: the chain here starts it, and a
	// chain or guard the handler runs spends what it left.
	ctx := budget.Request(r.Context())
	if res.Invalid == nil {
		res = admission.Admit(ctx, h.l, req, c.failMode)
	}
	if res.Err != nil && c.onError != nil {
		c.onError(r, res.Err)
	}
	d := res.Decision
	h.setRateHeaders(w.Header(), d)
	if !d.Allowed {
		detail := ""
		if res.Invalid != nil {
			detail = res.Invalid.Error()
		}
		h.deny(w, r, d, detail)
		return
	}
	if !c.noPropagate {
		// Outgoing calls made while serving carry the priority (Transport).
		ctx = spillway.ContextWithPriority(ctx, req.Priority)
	}
	if usage != nil {
		ctx = spillway.ContextWithUsage(ctx, usage)
	}
	r = r.WithContext(ctx)
	sw := &statusWriter{ResponseWriter: w}
	g := admission.Guard{Done: res.Done}
	defer g.Release() // the handler panicked: release; the panic goes on
	h.next.ServeHTTP(sw, r)
	if c.usageHeader != "" {
		h.readUsage(r, w.Header(), usage)
	}
	g.Finish(outcome(r.Context(), sw.status, clientDeadline))
}

// PatternPath returns the path part of a ServeMux pattern
// ("[METHOD ][HOST]/PATH"): "POST /api/v1/login" → "/api/v1/login",
// "GET example.com/items/{id}" → "/items/{id}". The method goes in
// Request.Method; the path is what tiers rules match.
func PatternPath(pattern string) string {
	if i := strings.IndexByte(pattern, ' '); i >= 0 {
		pattern = strings.TrimLeft(pattern[i+1:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return pattern
}

// outcome maps how a response ended to what adaptive limiters learn. A
// client that went away, or whose own deadline (clientDeadline: read from
// its header) passed, says how long it would wait, not how loaded the
// server is: Ignored, as a cancelled request.
func outcome(ctx context.Context, status int, clientDeadline bool) spillway.Outcome {
	if errors.Is(ctx.Err(), context.Canceled) {
		return spillway.Ignored // the client went away
	}
	if clientDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return spillway.Ignored // the client's own deadline passed
	}
	if status >= 500 || ctx.Err() != nil {
		return spillway.Dropped
	}
	return spillway.Success
}

func (h *handler) request(r *http.Request) *spillway.Request {
	c := &h.c
	req := admission.NewRequest()
	req.Method, req.Priority = r.Method, c.priority(r)
	if !c.noReceived && req.Priority.Valid() {
		// A caller that sent a lower priority keeps it, whatever the
		// classifier said (a classifier that raises on the header, as
		// shedder.HTTPClassifier's TrustHeader, has already done so).
		req.Priority = block.ReceivedPriority(req.Priority, r.Header.Get(spillway.PriorityHeader), false)
	}
	switch {
	case c.endpoint != nil:
		req.Endpoint = c.endpoint(r)
	case r.Pattern != "":
		req.Endpoint = PatternPath(r.Pattern)
	default:
		req.Endpoint = r.URL.Path
	}
	if c.cost != nil {
		req.Cost = c.cost(r)
	}
	if ip, ok := ClientIP(r, c.trusted, c.fwdHeader); ok {
		req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimIP, Value: ip.String()})
	}
	if c.user != nil {
		if u := c.user(r); u != "" {
			req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimUser, Value: u})
		}
	}
	if c.apiKey != "" {
		if k := r.Header.Get(c.apiKey); k != "" {
			req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimAPIKey, Value: k})
		}
	}
	return req
}

// Status returns the HTTP status for a denial: 400 for a malformed request,
// 503 Service Unavailable for shedding, the ceiling and a failed-closed
// store (Reason.IsShed), 429 Too Many Requests for the rest. It returns 200
// for an allowed decision.
func Status(d spillway.Decision) int {
	switch admission.ClassOf(d) {
	case admission.Allowed:
		return http.StatusOK
	case admission.Invalid:
		return http.StatusBadRequest
	case admission.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// RetryAfterSeconds returns the Retry-After of a denial in whole seconds,
// rounded up and at least 1, and false when the denial has none: the
// request was malformed or costs more than the limit can ever admit.
func RetryAfterSeconds(d spillway.Decision) (int64, bool) {
	wait, ok := admission.RetryAfter(d)
	if !ok {
		return 0, false
	}
	return max(admission.CeilSeconds(wait), 1), true
}

func (h *handler) setRateHeaders(hdr http.Header, d spillway.Decision) {
	if d.Limit <= 0 {
		return
	}
	remaining := max(d.Remaining, 0)
	if h.c.legacy {
		v := admission.RateValues(d, h.c.now())
		hdr["X-Ratelimit-Limit"] = v[0:1:1]
		hdr["X-Ratelimit-Remaining"] = v[1:2:2]
		hdr["X-Ratelimit-Reset"] = v[2:3:3]
	}
	if h.c.ietf {
		name := sfString(d.Limiter)
		policy := name + ";q=" + strconv.FormatInt(d.Limit, 10)
		if d.Window > 0 {
			policy += ";w=" + strconv.FormatInt(admission.CeilSeconds(d.Window), 10)
		}
		hdr["Ratelimit-Policy"] = []string{policy}
		hdr["Ratelimit"] = []string{name + ";r=" + strconv.FormatInt(remaining, 10) + ";t=" + strconv.FormatInt(admission.CeilSeconds(d.ResetAfter), 10)}
	}
}

// sfString formats s as a structured-field string (RFC 8941): printable
// ASCII only, quotes and backslashes escaped.
func sfString(s string) string {
	if s == "" {
		s = "default"
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '"' || ch == '\\':
			b.WriteByte('\\')
			b.WriteByte(ch)
		case ch >= 0x20 && ch < 0x7f:
			b.WriteByte(ch)
		default:
			b.WriteByte('_')
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Problem is the application/problem+json body (RFC 9457) of a denial.
type Problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail,omitempty"`
	RetryAfter int64  `json:"retry_after,omitempty"` // seconds, as in the Retry-After header
	Limiter    string `json:"limiter,omitempty"`     // the limiter or rule that denied
	Reason     string `json:"reason"`                // spillway.Reason.String()
}

func (h *handler) deny(w http.ResponseWriter, r *http.Request, d spillway.Decision, detail string) {
	hdr := w.Header()
	secs, hasRetry := RetryAfterSeconds(d)
	if hasRetry {
		hdr["Retry-After"] = []string{strconv.FormatInt(secs, 10)}
	}
	if h.c.denied != nil {
		h.c.denied(w, r, d)
		return
	}
	status := Status(d)
	p := Problem{
		Type:    "about:blank",
		Title:   http.StatusText(status),
		Status:  status,
		Detail:  detail,
		Limiter: d.Limiter,
		Reason:  d.Reason.String(),
	}
	if h.c.problemURI != "" {
		p.Type = h.c.problemURI + d.Reason.String()
	}
	if hasRetry {
		p.RetryAfter = secs
	}
	if p.Detail == "" {
		p.Detail = describe(d, secs)
	}
	body, _ := json.Marshal(p) // cannot fail: strings and ints
	hdr["Content-Type"] = []string{"application/problem+json"}
	hdr["Cache-Control"] = []string{"no-store"}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body) + 1)}
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

func describe(d spillway.Decision, secs int64) string {
	switch d.Reason {
	case spillway.ReasonRateLimited:
		return fmt.Sprintf("rate limit %q exceeded; retry in %d s", d.Limiter, secs)
	case spillway.ReasonCostExceedsLimit:
		return fmt.Sprintf("the request costs more than limit %q can ever admit; do not retry", d.Limiter)
	case spillway.ReasonConcurrency:
		return fmt.Sprintf("too many concurrent requests (%q); retry in %d s", d.Limiter, secs)
	case spillway.ReasonShed:
		return fmt.Sprintf("the service is shedding load (%q); retry in %d s", d.Limiter, secs)
	case spillway.ReasonCeiling:
		return fmt.Sprintf("a shared resource is at capacity (%q); retry in %d s", d.Limiter, secs)
	case spillway.ReasonFailClosed:
		return fmt.Sprintf("the limiter's store is unavailable; retry in %d s", secs)
	case spillway.ReasonInvalid:
		return "malformed request"
	}
	return fmt.Sprintf("denied by %q (%s)", d.Limiter, d.Reason)
}

// statusWriter records the status the handler wrote. It unwraps for
// http.ResponseController (Hijack, deadlines) and passes Flush through.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the wrapped ResponseWriter, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// readUsage sets usage from the declared response header or trailer.
func (h *handler) readUsage(r *http.Request, hdr http.Header, usage *spillway.Usage) {
	name := h.c.usageHeader
	v, ok := hdr[http.TrailerPrefix+name]
	if !ok {
		v, ok = hdr[name]
	}
	if !ok || len(v) == 0 {
		return
	}
	n, err := admission.ParseCost(v[0])
	if err == nil {
		// The total is set even when a limit refuses it as a step (a
		// tiers.SpentError): that matters only to a handler still at
		// work, and this one has returned; done settles the total.
		if err = usage.Set(n); err == nil || !errors.Is(err, spillway.ErrInvalidUsage) {
			return
		}
	}
	if h.c.onError != nil {
		h.c.onError(r, fmt.Errorf("httpx: response header %s: %w", name, err))
	}
}
