package main

import (
	"fmt"
	"time"
)

// cascadePhases splits one configuration's run of length d into the
// cascade's phases: baseline → spike to 10× → Redis slow → Redis down →
// Redis back (the spike lasts to the end, so recovery happens under load).
func cascadePhases(d time.Duration, sys System) []Phase {
	spec := []struct {
		name  string
		frac  float64
		mult  float64
		redis string
	}{
		{"baseline", 0.16, 1, redisHealthy},
		{"spike", 0.20, 10, redisHealthy},
		{"redis_slow", 0.20, 10, redisSlow},
		{"redis_down", 0.20, 10, redisDown},
		{"recovery", 0.24, 10, redisHealthy},
	}
	var out []Phase
	var at time.Duration
	for k, s := range spec {
		l := time.Duration(float64(d) * s.frac).Round(time.Millisecond)
		if k == len(spec)-1 {
			l = d - at
		}
		out = append(out, Phase{Name: s.name, Start: at, Length: l, Rate: sys.Baseline * s.mult, Redis: s.redis,
			StartSec: at.Seconds(), EndSec: (at + l).Seconds()})
		at += l
	}
	return out
}

// goodputLevels are the offered loads of the goodput sweep, as multiples
// of the backend's capacity.
var goodputLevels = []float64{0.5, 1, 1.5, 2, 3, 4}

// goodputPhases splits d into one step per level, Redis healthy.
func goodputPhases(d time.Duration, sys System) []Phase {
	var out []Phase
	step := (d / time.Duration(len(goodputLevels))).Round(time.Millisecond)
	for k, lv := range goodputLevels {
		at := time.Duration(k) * step
		out = append(out, Phase{Name: fmt.Sprintf("%.1fx", lv), Start: at, Length: step, Rate: lv * sys.capacityRPS(),
			Redis: redisHealthy, StartSec: at.Seconds(), EndSec: (at + step).Seconds()})
	}
	return out
}
