// Package share is the local share of a fleet-wide limit that the blocks
// on one Redis client enforce on their own while Redis cannot answer. It
// is kept per client: the fleet shedder on a client records the servers it
// saw alive at each refresh, fallback.NewHealth records an explicit
// override, and every block on the client (fallback.Store, the
// concurrency limiter, the global ceiling, the fleet shedder itself) reads
// the share when it decides locally.
package share

import (
	"math"
	"sync"
	"sync/atomic"
)

// Unknown is the share while the fleet's size is unknown (no fleet shedder
// on the client, or before its first refresh): the fleet is taken to be
// five servers.
const Unknown = 0.2

// Floor is the smallest share the fleet's size gives: a fleet of more than
// 1/Floor servers may admit up to N × Floor of a limit during an outage
// (an explicit override may go lower).
const Floor = 0.05

// State is the share of one client. The zero value knows nothing: Share
// returns Unknown.
type State struct {
	servers  atomic.Int64  // live servers at the fleet's last refresh; 0 unknown
	override atomic.Uint64 // math.Float64bits of an explicit share; 0 none
}

var states sync.Map // client -> *State

// Of returns the State of client, creating it. A nil client returns a
// State of its own each time.
func Of(client any) *State {
	if client == nil {
		return new(State)
	}
	if s, ok := states.Load(client); ok {
		return s.(*State)
	}
	s, _ := states.LoadOrStore(client, new(State))
	return s.(*State)
}

// SetServers records the servers last seen alive (n < 1 is ignored).
func (s *State) SetServers(n int64) {
	if n >= 1 {
		s.servers.Store(n)
	}
}

// Fixed reports whether an override is set.
func (s *State) Fixed() bool { return s.override.Load() != 0 }

// Servers returns the servers last seen alive, 0 when unknown.
func (s *State) Servers() int64 { return s.servers.Load() }

// SetOverride fixes the share to f in (0, 1]; 0 removes the override.
func (s *State) SetOverride(f float64) {
	if f == 0 {
		s.override.Store(0)
		return
	}
	s.override.Store(math.Float64bits(f))
}

// Share returns the fraction of a fleet-wide limit this server enforces
// alone: the override when set, else 1/N for the N servers last seen
// alive (at least Floor; a lone server keeps its whole limit), else
// Unknown.
func (s *State) Share() float64 {
	if s == nil {
		return Unknown
	}
	if o := s.override.Load(); o != 0 {
		return math.Float64frombits(o)
	}
	n := s.servers.Load()
	if n < 1 {
		return Unknown
	}
	return max(1/float64(n), Floor)
}

// Scale returns max(1, floor(n × share)) for n >= 1, in integer
// arithmetic on parts per million so that 0.29 × 100 is 29; n < 1 is
// returned unchanged.
func Scale(n int64, share float64) int64 {
	if n < 1 {
		return n
	}
	ppm := int64(math.Round(share * 1e6))
	if ppm >= 1e6 {
		return n
	}
	ppm = max(ppm, 1)
	q := n / 1e6 * ppm
	q += n % 1e6 * ppm / 1e6
	return max(q, 1)
}
