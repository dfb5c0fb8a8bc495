package concurrency

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// TestDifferentialMemoryVsRedis replays the same random sequence of
// acquisitions of random costs, releases and clock steps (including steps back) on both
// stores and compares every result: the memory store is the oracle.
func TestDifferentialMemoryVsRedis(t *testing.T) {
	srv := redistest.Start(t)
	memClock, redisClock := newFakeClock(), newFakeClock()
	mem := NewMemoryStore(MemorySettings{Clock: memClock.Now})
	rs, err := NewRedisStore(srv.Client(t), RedisSettings{Clock: redisClock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for seed := uint64(1); seed <= 3; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		var held []held1
		for op := 0; op < 400; op++ {
			key := "k" + strconv.Itoa(r.IntN(3))
			switch x := r.IntN(10); {
			case x < 5:
				id := "s" + strconv.FormatUint(seed, 10) + "-" + strconv.Itoa(op)
				limit := int64(1 + r.IntN(6))
				cost := int64(1 + r.IntN(int(limit)))
				// At least 1s: Redis expires an idle key (PEXPIRE ttl) on
				// its own wall clock, not the fake one, so a TTL shorter
				// than a scheduling stall of a loaded machine would let
				// Redis drop a set the memory store still holds.
				ttl := time.Duration(1+r.IntN(50)) * time.Second
				a, err1 := mem.acquire(ctx, "diff", key, id, cost, limit, ttl)
				b, err2 := rs.acquire(ctx, "diff", key, id, cost, limit, ttl)
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				if a != b {
					t.Fatalf("seed %d op %d acquire %s cost %d limit %d ttl %v: memory %+v, redis %+v", seed, op, key, cost, limit, ttl, a, b)
				}
				if a.Allowed {
					held = append(held, held1{key, id, cost})
				}
			case x < 8 && len(held) > 0:
				i := r.IntN(len(held))
				h := held[i]
				held = append(held[:i], held[i+1:]...)
				if err := mem.release(ctx, "diff", h.key, h.id, h.cost); err != nil {
					t.Fatal(err)
				}
				if err := rs.release(ctx, "diff", h.key, h.id, h.cost); err != nil {
					t.Fatal(err)
				}
			default:
				// Steps in the same proportion to the TTLs, with µs
				// remainders for the rounding edges.
				step := time.Duration(r.IntN(300)-30) * 100 * time.Millisecond // sometimes back
				step += time.Duration(r.IntN(100000)) * time.Microsecond
				memClock.Advance(step)
				redisClock.Advance(step)
			}
		}
	}
}

// held1 is an admitted request of the differential test.
type held1 struct {
	key, id string
	cost    int64
}

// FuzzAlgorithms feeds arbitrary samples to LatencyLimit and AIMD: they
// never panic and their limits stay within [Min, Max].
func FuzzAlgorithms(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 5, 0, 9, 250})
	f.Add([]byte{0, 0, 0, 0, 255, 255, 255, 255, 128})
	f.Fuzz(func(t *testing.T, data []byte) {
		g, _ := NewLatencyLimit(LatencyConfig{Initial: 2, Min: 2, Max: 50, Window: 3})
		a, _ := NewAIMD(AIMDConfig{Min: 1, Max: 50, Timeout: 100 * time.Millisecond})
		now := time.Unix(1_800_000_000, 0)
		for i := 0; i+2 < len(data); i += 3 {
			now = now.Add(time.Duration(int8(data[i])) * time.Millisecond) // may go back
			o := spillway.Success
			if data[i+2]&1 == 1 {
				o = spillway.Dropped
			}
			s := sample{Start: now, RTT: time.Duration(data[i+1]) * time.Millisecond, InFlight: int(data[i+2] >> 1), Outcome: o}
			g.update(s)
			a.update(s)
			if l := g.value(); l < 2 || l > 50 {
				t.Fatalf("latency limit %d outside [2, 50]", l)
			}
			if l := a.value(); l < 1 || l > 50 {
				t.Fatalf("aimd limit %d outside [1, 50]", l)
			}
		}
	})
}
