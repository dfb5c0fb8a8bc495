package shedder

import (
	"net/http"
	"strings"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/block"
)

// TestModeHeader marks test-mode traffic (synthetic checks, load tests):
// any non-empty value other than "0" or "false" classifies the request as
// Sheddable.
const TestModeHeader = "X-Spillway-Test-Mode"

// defaultHealthPaths are the paths that HTTPClassifier treats as health
// checks (CriticalPlus) when HealthPaths is nil.
var defaultHealthPaths = []string{"/healthz", "/readyz", "/livez"}

// HTTPClassifier assigns a priority to an incoming HTTP request. The zero
// value is the default classifier, applied in this order:
//
//  1. Override, when set and it reports ok;
//  2. a health check (a path in HealthPaths) is CriticalPlus;
//  3. a request carrying TestModeHeader is Sheddable;
//  4. a request carrying spillway.PriorityHeader keeps the priority it
//     names when that is lower than what its method gives, or at any level
//     when TrustHeader is set;
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
	// /healthz, /readyz and /livez; an empty non-nil slice means none.
	HealthPaths []string
	// TrustHeader makes the classifier raise a request's priority to the
	// one named in spillway.PriorityHeader. Turn it on only behind a trusted edge that
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
		paths = defaultHealthPaths
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
	return block.ReceivedPriority(methodPriority(r.Method), r.Header.Get(spillway.PriorityHeader), c.TrustHeader)
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
