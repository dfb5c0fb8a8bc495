package telemetry

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

// Metric names and attribute keys of NewHoldMetrics.
const (
	MetricHoldsOutstanding = "spillway.holds.outstanding"
	MetricHoldSettles      = "spillway.holds.settles"
	MetricHoldSettledUnits = "spillway.holds.settled_units"
	MetricHoldsExpired     = "spillway.holds.expired"

	KeyRule         = attribute.Key("spillway.rule")          // a config rule's id, holds only
	KeySettleResult = attribute.Key("spillway.settle_result") // applied, already_settled, expired, error
)

// settleResults are the values of KeySettleResult: ratelimit's settle
// results, and "error" (the store did not answer). Anything else counts
// as "error".
var settleResults = [...]string{ratelimit.SettleApplied.String(), ratelimit.SettleAlreadySettled.String(), ratelimit.SettleExpired.String(), settleError}

const (
	settleExpired = 2 // index of "expired" in settleResults
	settleError   = "error"
)

// holdMetrics counts the holds of limits charged on the actual cost
// (reserve, then settle); see NewHoldMetrics for its metrics. It is safe
// for concurrent use.
type holdMetrics struct {
	name        string
	outstanding metric.Int64UpDownCounter
	settles     metric.Int64Counter
	units       metric.Int64Counter
	expired     metric.Int64Counter
	rules       sync.Map // rule → *ruleAttrs
}

// ruleAttrs are one rule's attribute sets, built once.
type ruleAttrs struct {
	rule    metric.MeasurementOption
	results [len(settleResults)]metric.MeasurementOption
}

// NewHoldMetrics returns a tiers.HoldObserver that counts the holds of
// limits charged on the actual cost (reserve, then settle), with
// instruments from the meter provider mp (nil: otel.GetMeterProvider()).
// limiter names the limiter that holds (bounded: a name, never a key).
// Instrument errors go to otel.Handle and leave that instrument a no-op.
//
//	hm := telemetry.NewHoldMetrics("api", nil)
//	lim, err := tiers.New(cfg, store, tiers.Settings{HoldObserver: hm})
//
// Metrics, each with the attributes spillway.limiter (the name given
// here) and spillway.rule (the rule's id: a config has few; limiter keys
// never appear):
//
//   - spillway.holds.outstanding (UpDownCounter, {hold}): holds made and
//     not yet ended;
//   - spillway.holds.settles (Counter, {settle}) by spillway.settle_result:
//     applied (settled to the actual cost), already_settled, expired (the
//     store had released the hold at its TTL), error (the store did not
//     answer: it releases the hold at its TTL);
//   - spillway.holds.settled_units (Counter, {unit}): what the requests
//     were charged in the end (the actual costs of applied settles; for the
//     others, what their steps charged);
//   - spillway.holds.expired (Counter, {hold}): holds that ended by their
//     TTL instead of a settle: the settles that found them expired and
//     those that failed.
//
// A hold whose settle never runs (a process that dies) stays counted as
// outstanding by that process; the store releases it all the same.
func NewHoldMetrics(limiter string, mp metric.MeterProvider) tiers.HoldObserver {
	m := meterProvider(mp).Meter(ScopeName)
	hm := &holdMetrics{name: limiter}
	var err error
	if hm.outstanding, err = m.Int64UpDownCounter(MetricHoldsOutstanding,
		metric.WithDescription("Holds of an estimated cost made and not yet settled or expired."),
		metric.WithUnit("{hold}")); err != nil {
		otel.Handle(err)
	}
	if hm.settles, err = m.Int64Counter(MetricHoldSettles,
		metric.WithDescription("Settles of holds by result: applied, already_settled, expired, error."),
		metric.WithUnit("{settle}")); err != nil {
		otel.Handle(err)
	}
	if hm.units, err = m.Int64Counter(MetricHoldSettledUnits,
		metric.WithDescription("Units the held requests were charged in the end (their actual cost)."),
		metric.WithUnit("{unit}")); err != nil {
		otel.Handle(err)
	}
	if hm.expired, err = m.Int64Counter(MetricHoldsExpired,
		metric.WithDescription("Holds that ended by their TTL (released by the store) instead of a settle."),
		metric.WithUnit("{hold}")); err != nil {
		otel.Handle(err)
	}
	return hm
}

func (hm *holdMetrics) attrs(rule string) *ruleAttrs {
	if a, ok := hm.rules.Load(rule); ok {
		return a.(*ruleAttrs)
	}
	lim, r := KeyLimiter.String(hm.name), KeyRule.String(rule)
	a := &ruleAttrs{rule: metric.WithAttributeSet(attribute.NewSet(lim, r))}
	for i, res := range settleResults {
		a.results[i] = metric.WithAttributeSet(attribute.NewSet(lim, r, KeySettleResult.String(res)))
	}
	v, _ := hm.rules.LoadOrStore(rule, a)
	return v.(*ruleAttrs)
}

// Held records that units are held for rule.
func (hm *holdMetrics) Held(ctx context.Context, rule string, units int64) {
	if hm == nil || hm.outstanding == nil {
		return
	}
	hm.outstanding.Add(ctx, 1, hm.attrs(rule).rule)
}

// Settled records that rule's hold ended with result (one of
// settleResults; anything else counts as "error") and that the request
// was charged units for it.
func (hm *holdMetrics) Settled(ctx context.Context, rule string, units int64, result string) {
	if hm == nil {
		return
	}
	a := hm.attrs(rule)
	i := len(settleResults) - 1 // error
	for j, r := range settleResults {
		if r == result {
			i = j
		}
	}
	if hm.outstanding != nil {
		hm.outstanding.Add(ctx, -1, a.rule)
	}
	if hm.settles != nil {
		hm.settles.Add(ctx, 1, a.results[i])
	}
	if hm.units != nil && units > 0 {
		hm.units.Add(ctx, units, a.rule)
	}
	if hm.expired != nil && (i == settleExpired || i == len(settleResults)-1) {
		hm.expired.Add(ctx, 1, a.rule)
	}
}
