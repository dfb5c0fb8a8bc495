package sim

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/spillway-go/spillway"
)

// Phase is one stretch of a run with a constant offered rate and a Redis
// condition.
type Phase struct {
	Name     string        `json:"name"`
	Start    time.Duration `json:"-"`
	Length   time.Duration `json:"-"`
	Rate     float64       `json:"offered_rps"` // logical requests per second
	Redis    string        `json:"redis"`       // "healthy", "slow", "down"
	Capacity int           `json:"db_capacity"` // the database's capacity in this phase
	Servers  int           `json:"servers"`     // live API servers
	HotShare float64       `json:"hot_share"`   // share of the traffic sent to one server; 0: round robin
	// ExportRate is the offered rate of the export route (requests per
	// second, on top of Rate): Sheddable reports from well-behaved
	// clients, each holding a server worker for ExportHold.
	ExportRate float64 `json:"export_rps,omitempty"`
	// Slow multiplies the database's service time (0: 1); Stuck makes
	// every query hang to the statement timeout and fail.
	Slow     float64 `json:"db_slow,omitempty"`
	Stuck    bool    `json:"db_stuck,omitempty"`
	StartSec float64 `json:"start_s"`
	EndSec   float64 `json:"end_s"`
}

// End returns when the phase ends, from the start of the run.
func (p Phase) End() time.Duration { return p.Start + p.Length }

// Arrival is one logical request of the offered schedule: when it is sent,
// by which client, at which priority.
type Arrival struct {
	At       time.Duration
	Client   int // index into the client population
	Abusive  bool
	Priority spillway.Priority
	Seed     uint64 // per-request randomness (retry jitter), from the schedule
	Export   bool   // a request of the export route (Phase.ExportRate)
	Tenant   int    // 1-based tenant of a population with tenants; 0: none
}

// Population is the identity mix: many well-behaved clients and a few
// abusive ones that send a fixed share of the traffic.
type Population struct {
	WellBehaved  int
	Abusive      int
	AbusiveShare float64 // share of all arrivals sent by the abusive clients
	// PriorityMix is the share of each priority among the well-behaved
	// clients' requests, indexed by spillway.Priority. Abusive clients send
	// SheddablePlus (most GETs).
	PriorityMix [spillway.NumPriorities]float64
	// Tenants, when positive, groups the well-behaved clients into this
	// many tenants of equal size (WellBehaved / Tenants API keys each);
	// tenant 1 sends NoisyShare of the requests, the others the rest
	// evenly. Abusive must then be 0.
	Tenants    int
	NoisyShare float64
}

// DefaultPopulation: 200 well-behaved API keys, 4 abusive ones sending 20%
// of the requests; among the well-behaved requests 1% CriticalPlus (health
// checks, charges), 18% Critical (user-facing writes), 46% SheddablePlus
// (reads), 35% Sheddable (prefetch, batch).
func DefaultPopulation() Population {
	return Population{
		WellBehaved:  200,
		Abusive:      4,
		AbusiveShare: 0.20,
		PriorityMix:  [spillway.NumPriorities]float64{0.35, 0.46, 0.18, 0.01},
	}
}

// Clients returns the number of distinct clients (well-behaved first).
func (p Population) Clients() int { return p.WellBehaved + p.Abusive }

// BuildSchedule draws the open-loop offered schedule: within each phase,
// Poisson arrivals at the phase's rate (exponential gaps), each assigned to
// a client and a priority. The same seed, phases and population always give
// the same schedule, whatever the machine does while it runs.
func BuildSchedule(seed uint64, phases []Phase, pop Population) []Arrival {
	rng := rand.New(rand.NewPCG(seed, 0x5111_7a7e))
	var out []Arrival
	for _, ph := range phases {
		if ph.Rate <= 0 || ph.Length <= 0 {
			continue
		}
		t := float64(ph.Start)
		end := float64(ph.End())
		mean := float64(time.Second) / ph.Rate
		for {
			t += rng.ExpFloat64() * mean
			if t >= end {
				break
			}
			a := Arrival{At: time.Duration(t), Seed: rng.Uint64()}
			if pop.Tenants > 0 {
				keys := max(1, pop.WellBehaved/pop.Tenants)
				a.Tenant = 1
				if rng.Float64() >= pop.NoisyShare {
					a.Tenant = 2 + rng.IntN(pop.Tenants-1)
				}
				a.Client = (a.Tenant-1)*keys + rng.IntN(keys)
				a.Priority = pickPriority(rng, pop.PriorityMix)
				out = append(out, a)
				continue
			}
			if pop.Abusive > 0 && rng.Float64() < pop.AbusiveShare {
				a.Abusive = true
				a.Client = pop.WellBehaved + rng.IntN(pop.Abusive)
				a.Priority = spillway.SheddablePlus
			} else {
				a.Client = rng.IntN(max(1, pop.WellBehaved))
				a.Priority = pickPriority(rng, pop.PriorityMix)
			}
			out = append(out, a)
		}
	}
	// The export route's arrivals, from a stream of their own so that the
	// other requests are the same with or without them.
	ex := rand.New(rand.NewPCG(seed, 0xe4_9027))
	var exports []Arrival
	for _, ph := range phases {
		if ph.ExportRate <= 0 || ph.Length <= 0 {
			continue
		}
		t, end, mean := float64(ph.Start), float64(ph.End()), float64(time.Second)/ph.ExportRate
		for {
			t += ex.ExpFloat64() * mean
			if t >= end {
				break
			}
			exports = append(exports, Arrival{At: time.Duration(t), Seed: ex.Uint64(), Export: true,
				Client: ex.IntN(max(1, pop.WellBehaved)), Priority: spillway.Sheddable})
		}
	}
	if len(exports) > 0 {
		out = append(out, exports...)
		slices.SortStableFunc(out, func(a, b Arrival) int { return cmp.Compare(a.At, b.At) })
	}
	return out
}

func pickPriority(rng *rand.Rand, mix [spillway.NumPriorities]float64) spillway.Priority {
	var total float64
	for _, w := range mix {
		total += w
	}
	u := rng.Float64() * total
	for i, w := range mix {
		if u < w {
			return spillway.Priority(i)
		}
		u -= w
	}
	return spillway.Critical
}

// ScheduleDigest is a SHA-256 over the schedule, so two runs can show that
// they offered exactly the same load.
func ScheduleDigest(s []Arrival) string {
	h := sha256.New()
	var b [8 * 5]byte
	for _, a := range s {
		binary.LittleEndian.PutUint64(b[0:], uint64(a.At))
		binary.LittleEndian.PutUint64(b[8:], uint64(a.Client))
		binary.LittleEndian.PutUint64(b[16:], uint64(a.Priority))
		binary.LittleEndian.PutUint64(b[24:], a.Seed)
		b[32] = 0
		if a.Abusive {
			b[32] = 1
		}
		if a.Export {
			b[32] |= 2
		}
		h.Write(b[:33])
	}
	return hex.EncodeToString(h.Sum(nil))
}
