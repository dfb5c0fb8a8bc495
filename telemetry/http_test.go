package telemetry_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/telemetry"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The decision lands on the span a tracing middleware started for the
// request, through httpx over a real loopback connection.
func TestDecisionOnRequestSpan(t *testing.T) {
	sr, tp, reader, mp := setup()
	rl, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 1, Period: time.Minute}, ratelimit.Settings{Scope: "per_ip"})
	require.NoError(t, err)
	lim := telemetry.Instrument(ratelimit.PerKey(rl, spillway.DimIP), "api", telemetry.Settings{TracerProvider: tp, MeterProvider: mp})
	tracing := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, span := tp.Tracer("server").Start(r.Context(), r.Method+" "+r.URL.Path)
			defer span.End()
			h.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	srv := httptest.NewServer(tracing(httpx.Middleware(lim, httpx.Settings{})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))))
	defer srv.Close()
	for _, want := range []int{200, 429} {
		resp, err := http.Get(srv.URL + "/x")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode)
	}
	spans := sr.Ended()
	require.Len(t, spans, 2)
	for i, want := range []string{"allowed", "denied"} {
		require.Len(t, spans[i].Events(), 1)
		a := attrMap(spans[i].Events()[0].Attributes)
		require.Equal(t, want, a["spillway.outcome"])
		require.Equal(t, "per_ip:ip", a["spillway.decided_by"]) // PerKey names the decision scope:dimension
		require.Equal(t, "critical", a["spillway.priority"])
		require.Equal(t, int64(1), a["spillway.limit"])
	}
	sum := collect(t, reader)[telemetry.MetricDecisions].Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 2)
	for _, dp := range sum.DataPoints {
		for _, kv := range dp.Attributes.ToSlice() {
			require.NotEqual(t, "127.0.0.1", kv.Value.String(), "a key became a metric attribute")
		}
	}
}
