package telemetry

// DurationBuckets are the histogram bounds, for the tests.
var DurationBuckets = durationBuckets
