package shedder_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/shedder"
)

func TestClassifyHTTP(t *testing.T) {
	cases := []struct {
		method, path string
		header       map[string]string
		want         spillway.Priority
	}{
		{"GET", "/healthz", nil, spillway.CriticalPlus},
		{"GET", "/readyz", nil, spillway.CriticalPlus},
		{"HEAD", "/livez", nil, spillway.CriticalPlus},
		{"GET", "/healthz/deep", nil, spillway.SheddablePlus},
		{"POST", "/v1/charges", nil, spillway.Critical},
		{"PUT", "/v1/x", nil, spillway.Critical},
		{"PATCH", "/v1/x", nil, spillway.Critical},
		{"DELETE", "/v1/x", nil, spillway.Critical},
		{"GET", "/v1/x", nil, spillway.SheddablePlus},
		{"HEAD", "/v1/x", nil, spillway.SheddablePlus},
		{"OPTIONS", "/v1/x", nil, spillway.SheddablePlus},
		{"PROPFIND", "/v1/x", nil, spillway.Critical},
		{"POST", "/v1/x", map[string]string{shedder.TestModeHeader: "1"}, spillway.Sheddable},
		{"POST", "/v1/x", map[string]string{shedder.TestModeHeader: "true"}, spillway.Sheddable},
		{"POST", "/v1/x", map[string]string{shedder.TestModeHeader: "0"}, spillway.Critical},
		{"POST", "/v1/x", map[string]string{shedder.TestModeHeader: "false"}, spillway.Critical},
		{"GET", "/healthz", map[string]string{shedder.TestModeHeader: "1"}, spillway.CriticalPlus},
		// The propagated header may lower a priority…
		{"POST", "/v1/x", map[string]string{spillway.PriorityHeader: "sheddable_plus"}, spillway.SheddablePlus},
		// …but not raise it without TrustHeader.
		{"GET", "/v1/x", map[string]string{spillway.PriorityHeader: "critical_plus"}, spillway.SheddablePlus},
		{"GET", "/v1/x", map[string]string{spillway.PriorityHeader: "bogus"}, spillway.SheddablePlus},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.path, nil)
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		if got := shedder.ClassifyHTTP(r); got != c.want {
			t.Errorf("%s %s %v: got %v, want %v", c.method, c.path, c.header, got, c.want)
		}
	}
}

func TestHTTPClassifierOptions(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/x", nil)
	r.Header.Set(spillway.PriorityHeader, "CRITICAL")
	trusting := shedder.HTTPClassifier{TrustHeader: true}
	if got := trusting.Classify(r); got != spillway.Critical {
		t.Errorf("trusted header: got %v, want critical", got)
	}
	c := shedder.HTTPClassifier{
		HealthPaths: []string{"/ping"},
		Override: func(r *http.Request) (spillway.Priority, bool) {
			if r.URL.Path == "/batch" {
				return spillway.Sheddable, true
			}
			return 0, false
		},
	}
	for path, want := range map[string]spillway.Priority{
		"/ping":    spillway.CriticalPlus,
		"/healthz": spillway.SheddablePlus, // HealthPaths replaced the defaults
		"/batch":   spillway.Sheddable,
	} {
		if got := c.Classify(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("GET %s: got %v, want %v", path, got, want)
		}
	}
	none := shedder.HTTPClassifier{HealthPaths: []string{}}
	if got := none.Classify(httptest.NewRequest("GET", "/healthz", nil)); got != spillway.SheddablePlus {
		t.Errorf("empty HealthPaths: got %v, want sheddable_plus", got)
	}
}
