// Package telemetry is the one place where spillway talks to OpenTelemetry.
//
// Instrument wraps any spillway.Limiter (a block, a Chain) so that every
// decision is visible:
//
//   - on the request's span, an event "spillway.decision" with the limiter
//     name, the rule that decided, the outcome (allowed, denied, error), the
//     reason, limit, remaining, degraded, priority and the decision latency
//     (or, with Settings.ChildSpan, a child span "spillway.admit" carrying the same
//     attributes);
//   - as metrics: the counter spillway.decisions by limiter, outcome,
//     degraded, priority and reason, and the histogram
//     spillway.decision.duration (seconds) by limiter and outcome.
//
// ObserveBreaker publishes a fallback.Health's breaker state
// (spillway.breaker.state), read at every collection. NewHoldMetrics counts
// the holds of limits charged on the actual cost (spillway.holds.*:
// outstanding, settles by result, units settled, expired) for tiers to
// feed (tiers.Settings.HoldObserver).
//
// The shortest use:
//
//	chain = telemetry.Instrument(chain, "api", telemetry.Settings{})
//
// Only Instrument takes Settings (TracerProvider, MeterProvider,
// ChildSpan, Clock; the zero value is the default); NewHoldMetrics and
// ObserveBreaker take just a meter provider, so a setting that does not
// apply does not compile.
// Providers default to otel.GetTracerProvider() and otel.GetMeterProvider()
// (a nil provider too); this package never sets the globals. Instruments are created once, in Instrument. Limiter
// keys (IPs, users, API keys) never become metric attributes: every metric
// attribute has a small fixed set of values, except the limiter name, which
// the caller chooses. The rule that decided (Decision.Limiter) goes only on
// spans.
//
// Everything here is safe for concurrent use.
package telemetry
