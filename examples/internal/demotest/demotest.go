// Package demotest is the examples' test scaffold: it runs an example's
// run function in the test process and decodes what its stdout telemetry
// printed.
package demotest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Buffer is a bytes.Buffer safe for the server goroutine and the test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// RunFunc is an example's run: serve until ctx ends, messages to out,
// stdout telemetry to otelOut, and ready called with the listen address
// once it listens.
type RunFunc func(ctx context.Context, args []string, out, otelOut io.Writer, ready func(addr string)) error

// Server is an example running in the test process.
type Server struct {
	Addr      string  // the address it listens on
	Out, OTel *Buffer // its messages and its stdout telemetry
	// Stop stops it and requires that run returned nil; it is also
	// called at the end of the test.
	Stop func()
}

// Start runs run with -addr 127.0.0.1:0 and args, and returns once it
// listens.
func Start(t *testing.T, run RunFunc, args ...string) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Out: &Buffer{}, OTel: &Buffer{}}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), s.Out, s.OTel, func(a string) { addrc <- a })
	}()
	select {
	case a := <-addrc:
		var once sync.Once
		s.Stop = func() {
			once.Do(func() {
				cancel()
				require.NoError(t, <-errc)
			})
		}
		t.Cleanup(s.Stop)
		s.Addr = a
		return s
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v\n%s", err, s.Out.String())
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("server did not start")
	}
	return nil
}

// Attr is an attribute as the stdout exporters print it.
type Attr struct {
	Key   string
	Value struct{ Value any }
}

// AttrMap turns attributes into a map of key to value.
func AttrMap(attrs []Attr) map[string]any {
	m := make(map[string]any, len(attrs))
	for _, a := range attrs {
		m[a.Key] = a.Value.Value
	}
	return m
}

// Span is a span as the stdout exporter prints it.
type Span struct {
	Name     string
	SpanKind int
	Events   []struct {
		Name       string
		Attributes []Attr
	}
	Resource []Attr
}

// Metrics is one export of the stdout metric exporter.
type Metrics struct {
	ScopeMetrics []struct {
		Scope   struct{ Name string }
		Metrics []struct {
			Name string
			Data struct {
				Temporality string
				DataPoints  []struct {
					Attributes []Attr
					Value      float64 // counter points
					Count      float64 // histogram points
				}
			}
		}
	}
}

// DecodeOTel splits what the stdout exporters wrote into spans and metric
// exports.
func DecodeOTel(t *testing.T, s string) ([]Span, []Metrics) {
	t.Helper()
	var spans []Span
	var metrics []Metrics
	dec := json.NewDecoder(strings.NewReader(s))
	for dec.More() {
		var raw map[string]json.RawMessage
		require.NoError(t, dec.Decode(&raw))
		b, err := json.Marshal(raw)
		require.NoError(t, err)
		if _, ok := raw["ScopeMetrics"]; ok {
			var m Metrics
			require.NoError(t, json.Unmarshal(b, &m))
			metrics = append(metrics, m)
		} else {
			var sp Span
			require.NoError(t, json.Unmarshal(b, &sp))
			spans = append(spans, sp)
		}
	}
	return spans, metrics
}

// SumPoints adds up, across exports (delta temporality), the points of the
// named spillway instrument by their attribute set (JSON, sorted keys).
func SumPoints(t *testing.T, exports []Metrics, name string) map[string]float64 {
	t.Helper()
	sums := map[string]float64{}
	for _, e := range exports {
		for _, sm := range e.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name {
					continue
				}
				require.Equal(t, "github.com/spillway-go/spillway/telemetry", sm.Scope.Name)
				require.Equal(t, "DeltaTemporality", m.Data.Temporality)
				for _, p := range m.Data.DataPoints {
					k, err := json.Marshal(AttrMap(p.Attributes)) // sorted keys
					require.NoError(t, err)
					sums[string(k)] += p.Value + p.Count
				}
			}
		}
	}
	return sums
}

// Decision is the spillway.decision event of the single span in spans,
// which must be named name, with the varying attributes (retry and
// latency) removed and returned apart.
func Decision(t *testing.T, spans []Span, name, service string) (ev map[string]any, retryMS, latencyUS float64) {
	t.Helper()
	require.Len(t, spans, 1, "only the denied request's span is printed")
	sp := spans[0]
	require.Equal(t, name, sp.Name)
	require.Equal(t, 2, sp.SpanKind) // server
	require.Equal(t, map[string]any{"service.name": service}, AttrMap(sp.Resource))
	require.Len(t, sp.Events, 1)
	require.Equal(t, "spillway.decision", sp.Events[0].Name)
	ev = AttrMap(sp.Events[0].Attributes)
	retryMS, _ = ev["spillway.retry_after_ms"].(float64)
	latencyUS, _ = ev["spillway.latency_us"].(float64)
	delete(ev, "spillway.retry_after_ms")
	delete(ev, "spillway.latency_us")
	return ev, retryMS, latencyUS
}
