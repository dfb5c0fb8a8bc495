package httpx_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/usagestep"
)

// meterLimiter records the estimate at Admit and the reported total at done.
type meterLimiter struct {
	estimate, total int64
	reported        bool
	calls           int
}

func (m *meterLimiter) Admit(_ context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	m.calls++
	m.estimate = r.Cost
	u := r.Usage
	return spillway.Decision{Allowed: true}, func(spillway.Outcome) {
		if u != nil {
			m.total, m.reported = u.Total()
		}
	}, nil
}

func TestUsageMetering(t *testing.T) {
	cases := []struct {
		name       string
		estimate   string
		handler    func(w http.ResponseWriter, r *http.Request)
		status     int
		calls      int
		est, total int64
		reported   bool
	}{
		{"reported in steps", "100", func(w http.ResponseWriter, r *http.Request) {
			for range 3 {
				if err := spillway.ReportUsage(r.Context(), 70); err != nil {
					t.Errorf("ReportUsage: %v", err)
				}
			}
		}, 200, 1, 100, 210, true},
		{"response header", "5", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Tokens-Used", "42")
		}, 200, 1, 5, 42, true},
		{"trailer", "5", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			w.Header().Set(http.TrailerPrefix+"X-Tokens-Used", "9223372036854775807")
		}, 200, 1, 5, 9223372036854775807, true},
		{"nothing reported", "7", func(w http.ResponseWriter, r *http.Request) {}, 200, 1, 7, 0, false},
		{"bad response header keeps estimate", "7", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Tokens-Used", "-3")
		}, 200, 1, 7, 0, false},
		{"negative estimate", "-1", nil, 400, 0, 0, 0, false},
		{"huge estimate", "9223372036854775808", nil, 400, 0, 0, 0, false},
		{"garbage estimate", "1e3", nil, 400, 0, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &meterLimiter{}
			var errs []string
			h := httpx.Middleware(m, httpx.Settings{
				EstimateHeader: "x-estimate",
				UsageHeader:    "x-tokens-used",
				OnError:        func(_ *http.Request, err error) { errs = append(errs, err.Error()) },
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.handler == nil {
					t.Fatal("handler ran")
				}
				tc.handler(w, r)
			}))
			req := httptest.NewRequest("POST", "/gen", nil)
			req.Header.Set("X-Estimate", tc.estimate)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status || m.calls != tc.calls || m.estimate != tc.est || m.total != tc.total || m.reported != tc.reported {
				t.Fatalf("status %d calls %d estimate %d total %d reported %v; want %d %d %d %d %v (body %s)",
					rec.Code, m.calls, m.estimate, m.total, m.reported, tc.status, tc.calls, tc.est, tc.total, tc.reported, rec.Body)
			}
			if tc.status == 400 && !strings.Contains(rec.Body.String(), "header X-Estimate: cost") {
				t.Fatalf("body %s", rec.Body)
			}
			if tc.name == "bad response header keeps estimate" && (len(errs) != 1 || errs[0] != `httpx: response header X-Tokens-Used: cost -3 is negative`) {
				t.Fatalf("errors %q", errs)
			}
		})
	}
}

// refusingLimiter refuses every step past 10, as a spent limit does.
type refusingLimiter struct{ meterLimiter }

func (m *refusingLimiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	usagestep.OnStep(r.Usage, func(total int64) error {
		if total > 10 {
			return errors.New("spent")
		}
		return nil
	})
	return m.meterLimiter.Admit(ctx, r)
}

// A usage header that a limit refuses as a step is no error: the total is
// set and settled (the handler has returned; there is no work to stop).
func TestUsageHeaderRefusedStep(t *testing.T) {
	m := &refusingLimiter{}
	var errs []error
	h := httpx.Middleware(m, httpx.Settings{
		UsageHeader: "X-Tokens-Used",
		OnError:     func(_ *http.Request, err error) { errs = append(errs, err) },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Tokens-Used", "42")
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/gen", nil))
	if rec.Code != 200 || m.total != 42 || !m.reported || len(errs) != 0 {
		t.Fatalf("status %d total %d reported %v errors %v; want 200, 42 settled, no error", rec.Code, m.total, m.reported, errs)
	}
}
