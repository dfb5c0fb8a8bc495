package shedder

import (
	"context"
	"net/http"
	"strings"

	"github.com/spillway-go/spillway"
)

// Header is the HTTP header that carries a request's priority to downstream
// services, so a backend sheds the same way its caller would. Its value is
// the name returned by spillway.Priority.String ("critical_plus").
const Header = "Spillway-Priority"

// MetadataKey is the gRPC metadata key that carries the priority; gRPC
// metadata keys are lowercase. The value is the same as Header's.
const MetadataKey = "spillway-priority"

// TestModeHeader marks test-mode traffic (synthetic checks, load tests):
// any non-empty value other than "0" or "false" classifies the request as
// Sheddable.
const TestModeHeader = "X-Spillway-Test-Mode"

// DefaultHealthPaths are the paths that HTTPClassifier treats as health
// checks (CriticalPlus) when HealthPaths is nil.
var DefaultHealthPaths = []string{"/healthz", "/readyz", "/livez"}

// HTTPClassifier assigns a priority to an incoming HTTP request. The zero
// value is the default classifier, applied in this order:
//
//  1. Override, when set and it reports ok;
//  2. a health check (a path in HealthPaths) is CriticalPlus;
//  3. a request carrying TestModeHeader is Sheddable;
//  4. a request carrying Header keeps the priority it names when that is
//     lower than what its method gives, or at any level when TrustHeader
//     is set;
//  5. POST, PUT, PATCH and DELETE are Critical; GET, HEAD and OPTIONS are
//     SheddablePlus; any other method is Critical.
//
// An HTTPClassifier is safe for concurrent use as long as its fields are not
// changed.
type HTTPClassifier struct {
	// Override, when set, is asked first; ok=false falls through to the
	// default rules.
	Override func(r *http.Request) (p spillway.Priority, ok bool)
	// HealthPaths lists the exact paths classified CriticalPlus; nil means
	// DefaultHealthPaths, an empty non-nil slice means none.
	HealthPaths []string
	// TrustHeader makes the classifier raise a request's priority to the
	// one named in Header. Turn it on only behind a trusted edge that
	// strips the header from outside traffic: otherwise any client could
	// claim CriticalPlus. Without it the header can only lower a priority,
	// which is always safe.
	TrustHeader bool
}

// Classify returns the priority of r.
func (c *HTTPClassifier) Classify(r *http.Request) spillway.Priority {
	if c.Override != nil {
		if p, ok := c.Override(r); ok && p.Valid() {
			return p
		}
	}
	paths := c.HealthPaths
	if paths == nil {
		paths = DefaultHealthPaths
	}
	if r.URL != nil {
		for _, hp := range paths {
			if r.URL.Path == hp {
				return spillway.CriticalPlus
			}
		}
	}
	if isTestMode(r.Header.Get(TestModeHeader)) {
		return spillway.Sheddable
	}
	byMethod := methodPriority(r.Method)
	if p, ok := FromHeader(r.Header); ok && (p < byMethod || c.TrustHeader) {
		return p
	}
	return byMethod
}

// ClassifyHTTP classifies r with the zero HTTPClassifier (see its rules).
// Its signature fits the adapters' classifier hooks.
func ClassifyHTTP(r *http.Request) spillway.Priority {
	var c HTTPClassifier
	return c.Classify(r)
}

func methodPriority(m string) spillway.Priority {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, "":
		// net/http treats an empty method as GET.
		return spillway.SheddablePlus
	default:
		return spillway.Critical
	}
}

func isTestMode(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// FromHeader reads the priority from Header in h. It reports false when the
// header is absent or does not name a priority.
func FromHeader(h http.Header) (spillway.Priority, bool) {
	v := h.Get(Header)
	if v == "" {
		return 0, false
	}
	p, err := spillway.ParsePriority(strings.TrimSpace(v))
	if err != nil {
		return 0, false
	}
	return p, true
}

// SetHeader sets Header on h to p's name. An invalid p removes the header.
func SetHeader(h http.Header, p spillway.Priority) {
	if !p.Valid() {
		h.Del(Header)
		return
	}
	h.Set(Header, p.String())
}

// Propagate sets Header on an outgoing request from the priority in its
// context (see NewContext), leaving the request unchanged when the context
// carries none. Use it in a client transport so a backend sheds the same
// way its caller does.
func Propagate(req *http.Request) {
	if p, ok := FromContext(req.Context()); ok {
		SetHeader(req.Header, p)
	}
}

type ctxKey struct{}

// NewContext returns a copy of ctx that carries priority p. Adapters store
// the priority of the request being served so that outgoing calls made
// while serving it (HTTP header, gRPC metadata) carry it downstream.
func NewContext(ctx context.Context, p spillway.Priority) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the priority stored by NewContext and whether there
// was one.
func FromContext(ctx context.Context) (spillway.Priority, bool) {
	p, ok := ctx.Value(ctxKey{}).(spillway.Priority)
	return p, ok && p.Valid()
}
