package ratelimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/testclock"
)

// holdDebug logs every operation of holdDifferential.
var holdDebug = os.Getenv("SPILLWAY_HOLD_DEBUG") != ""

// retried returns a copy of h that has not seen its settle's reply: what a
// caller whose settle timed out holds when it retries. Its Settle goes to
// the store again, which must not apply it twice.
func (h *Hold) retried() *Hold {
	return &Hold{store: h.store, id: h.id, ttl: h.ttl, items: h.items, exps: h.exps, rkeys: h.rkeys, members: h.members, dec: h.dec, allowed: h.allowed}
}

// TestRedisStoreHoldDifferential replays random sequences of reserves,
// settles (retried ones included), dropped holds, plain decisions (alone
// and coalesced into one call) and resets on the memory store and on Redis, on one fake clock that also
// goes backwards, and compares every decision and every settle result.
func TestRedisStoreHoldDifferential(t *testing.T) {
	srv, _ := redisServer(t)
	hook := &freezeHook{raw: srv.Client(t)}
	c := srv.Client(t)
	c.AddHook(hook)
	seeds := uint64(6)
	if n, err := strconv.Atoi(os.Getenv("SPILLWAY_HOLD_SEEDS")); err == nil && n > 0 {
		seeds = uint64(n) // a longer search, off in CI
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			holdDifferential(t, c, seed, 800)
		})
	}
}

// holdDifferential runs steps random operations on a RedisStore over c
// and on a MemoryStore and compares every outcome. Holds live 50ms to 2s
// of the fake clock, so many expire unsettled (released by the next
// touch), and bursts span up to 3s, so releases and refunds matter.
func holdDifferential(t *testing.T, c redis.UniversalClient, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 15))
	clk := testclock.New(rt0.Add(time.Duration(r.Int64N(int64(time.Hour)))))
	prefix := fmt.Sprintf("hdiff%d:", seed)
	rs := mustRedisStore(c, RedisSettings{Clock: clk.Now, Prefix: prefix})
	ms := NewMemoryStore(MemorySettings{Clock: clk.Now})
	ctx := context.Background()

	type scope struct {
		name string
		p    Policy
	}
	scopes := make([]scope, 3)
	for i := range scopes {
		p := randomPolicy(r)
		for p.Algorithm != TokenBucket && p.Algorithm != GCRA && p.Algorithm != LeakyBucket {
			p = randomPolicy(r)
		}
		scopes[i] = scope{fmt.Sprintf("s%d", i), p}
	}
	entities := []string{"alice", "bob", "{x}"}
	ttls := []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second}
	randomItems := func() []Item {
		items := make([]Item, 1+r.IntN(3))
		for i := range items {
			sc := scopes[r.IntN(len(scopes))]
			cp := sc.p.Capacity()
			var cost int64
			switch x := r.IntN(12); {
			case x == 0:
				cost = 0
			case x == 1:
				cost = cp + 1 + r.Int64N(2)
			case x == 2:
				cost = math.MaxInt64
			case x < 7:
				cost = 1 + r.Int64N(cp)
			default:
				cost = 1
			}
			// a quarter fixed: charged by the reservation, not held
			items[i] = Item{Scope: sc.name, Key: entities[r.IntN(len(entities))], Policy: sc.p, Cost: cost, Fixed: r.IntN(4) == 0}
		}
		return items
	}
	type pair struct{ r, m *Hold }
	logf := func(format string, args ...any) {
		if holdDebug {
			t.Logf(format, args...)
		}
	}
	var held []pair
	var reserves, allowed, applied, already, expired, coalescedRounds, coalescedHolds int
	for step := 0; step < steps; step++ {
		switch x := r.IntN(20); {
		case x < 10:
			clk.Advance(time.Duration(r.Int64N(int64(40 * time.Millisecond))))
		case x < 11:
			clk.Advance(time.Duration(r.Int64N(int64(2 * time.Second))))
		case x < 12:
			clk.Advance(-time.Duration(r.Int64N(int64(500 * time.Millisecond)))) // backwards
		}
		at := clk.Now().Sub(rt0)
		switch op := r.IntN(20); {
		case op < 7: // reserve
			items := randomItems()
			ttl := ttls[r.IntN(len(ttls))]
			hR, errR := rs.Reserve(ctx, items, ttl)
			hM, errM := ms.Reserve(ctx, items, ttl)
			if errR != nil || errM != nil {
				t.Fatalf("step %d: reserve %+v: redis %v, memory %v", step, items, errR, errM)
			}
			reserves++
			if hR.allowed != hM.allowed {
				t.Fatalf("step %d at %v: reserve %+v allowed: redis %v, memory %v\n redis  %+v\n memory %+v", step, at, items, hR.allowed, hM.allowed, hR.dec, hM.dec)
			}
			for i := range items {
				if hR.dec[i] != hM.dec[i] {
					t.Fatalf("step %d at %v: reserve item %d (%+v):\n redis  %+v\n memory %+v", step, at, i, items[i], hR.dec[i], hM.dec[i])
				}
			}
			logf("step %d at %v: reserve %+v ttl %v -> %v %+v (memory %v) id %s", step, at, items, ttl, hR.allowed, hR.dec, hM.allowed, hR.id)
			if hR.allowed {
				allowed++
				held = append(held, pair{hR, hM})
			}
		case op < 12 && len(held) > 0: // settle, sometimes twice or as a retry
			j := r.IntN(len(held))
			p := held[j]
			if r.IntN(3) > 0 {
				held = append(held[:j], held[j+1:]...)
			} else {
				held[j] = pair{p.r.retried(), p.m.retried()}
			}
			actual := make([]int64, len(p.r.items))
			for i := range actual {
				switch x := r.IntN(10); {
				case x == 0:
					actual[i] = math.MaxInt64
				case x < 3:
					actual[i] = 0
				default:
					actual[i] = r.Int64N(2*p.r.items[i].Policy.Capacity() + 2)
				}
			}
			var resR []SettleResult
			var errR error
			resM, errM := p.m.settleEach(ctx, actual)
			if r.IntN(3) == 0 {
				// off the request path: on a single server the settle
				// rides on the next reservation (run first), on a
				// Cluster it is flushed before it
				ch := make(chan settleResult, 1)
				if err := p.r.settleAsync(actual, func(res []SettleResult, err error) { ch <- settleResult{res, err} }); err != nil {
					t.Fatal(err)
				}
				if rs.sharded != oneServer {
					if err := rs.flushSettles(ctx); err != nil {
						t.Fatal(err)
					}
				}
				items := randomItems()
				ttl := ttls[r.IntN(len(ttls))]
				hR, errRR := rs.Reserve(ctx, items, ttl)
				hM, errRM := ms.Reserve(ctx, items, ttl)
				if errRR != nil || errRM != nil {
					t.Fatalf("step %d: reserve after an async settle %+v: redis %v, memory %v", step, items, errRR, errRM)
				}
				if hR.allowed != hM.allowed || fmt.Sprint(hR.dec) != fmt.Sprint(hM.dec) {
					t.Fatalf("step %d at %v: reserve after an async settle %+v:\n redis  %v %+v\n memory %v %+v", step, at, items, hR.allowed, hR.dec, hM.allowed, hM.dec)
				}
				if hR.allowed {
					held = append(held, pair{hR, hM})
				}
				sr := <-ch
				resR, errR = sr.res, sr.err
			} else {
				resR, errR = p.r.settleEach(ctx, actual)
			}
			if errR != nil || errM != nil {
				t.Fatalf("step %d: settle: redis %v, memory %v", step, errR, errM)
			}
			logf("step %d at %v: settle %s %+v with %v -> redis %v memory %v", step, at, p.r.id, p.r.items, actual, resR, resM)
			for i := range resR {
				if resR[i] != resM[i] {
					t.Fatalf("step %d at %v: settle item %d (%+v) with %d: redis %v, memory %v", step, at, i, p.r.items[i], actual[i], resR[i], resM[i])
				}
				switch resR[i] {
				case SettleApplied:
					applied++
				case SettleAlreadySettled:
					already++
				case SettleExpired:
					expired++
				}
			}
		case op < 13 && r.IntN(2) == 0: // reservations coalesced into one call, as the coalescer sends them
			round := [][]Item{randomItems(), randomItems()}
			if r.IntN(2) == 0 {
				round = append(round, randomItems())
			}
			ttl := ttls[r.IntN(len(ttls))]
			ttlUS, _, _ := holdTTLOf(ttl)
			ws := make([]*waiter, len(round))
			hs := make([]*Hold, len(round))
			ids := make([]string, len(round))
			ok := true
			for b, items := range round {
				hs[b], ids[b] = rs.newHold(items, ttl)
				ws[b] = &waiter{ctx: ctx, done: make(chan struct{}, 1)}
				ok = ok && ws[b].prepareHold(rs, hs[b], ttlUS)
			}
			if !ok {
				continue
			}
			coalescedHolds++
			rs.flush(ws)
			for b, items := range round {
				w := ws[b]
				<-w.done
				if w.err != nil {
					t.Fatalf("step %d: coalesced reserve %d: %v", step, b, w.err)
				}
				hR := hs[b]
				if w.allowed {
					hR.allowed, hR.id = true, ids[b]
				}
				hM, err := ms.Reserve(ctx, items, ttl)
				if err != nil {
					t.Fatal(err)
				}
				reserves++
				logf("step %d at %v: coalesced reserve %d %+v ttl %v -> %v %+v (memory %v) id %s", step, at, b, items, ttl, hR.allowed, hR.dec, hM.allowed, hR.id)
				if hR.allowed != hM.allowed {
					t.Fatalf("step %d at %v: coalesced reserve %d %+v allowed: redis %v, memory %v\n redis  %+v\n memory %+v", step, at, b, items, hR.allowed, hM.allowed, hR.dec, hM.dec)
				}
				for i := range items {
					if hR.dec[i] != hM.dec[i] {
						t.Fatalf("step %d at %v: coalesced reserve %d item %d (%+v):\n redis  %+v\n memory %+v", step, at, b, i, items[i], hR.dec[i], hM.dec[i])
					}
				}
				if hR.allowed {
					allowed++
					held = append(held, pair{hR, hM})
				}
			}
		case op < 13 && len(held) > 0: // dropped: the process died
			j := r.IntN(len(held))
			logf("step %d: drop %s", step, held[j].r.id)
			held = append(held[:j], held[j+1:]...)
		case op < 14:
			it := randomItems()[0]
			logf("step %d: reset %s/%s", step, it.Scope, it.Key)
			if err := rs.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
			if err := ms.Reset(ctx, it.Scope, it.Key, it.Policy); err != nil {
				t.Fatal(err)
			}
		case op < 16: // plain batches coalesced into one call, as the coalescer sends them
			round := [][]Item{randomItems(), randomItems()}
			if r.IntN(2) == 0 {
				round = append(round, randomItems())
			}
			if !coalescible(rs, round) {
				continue
			}
			coalescedRounds++
			outsR, oksR, errs := decideRound(ctx, rs, round)
			for b, items := range round {
				if errs[b] != nil {
					t.Fatalf("step %d: coalesced batch %d: %v", step, b, errs[b])
				}
				outM := make([]spillway.Decision, len(items))
				okM, err := ms.Decide(ctx, items, outM)
				if err != nil {
					t.Fatal(err)
				}
				logf("step %d at %v: coalesced batch %d %+v -> redis %v %+v", step, at, b, items, oksR[b], outsR[b])
				if oksR[b] != okM {
					t.Fatalf("step %d at %v: coalesced batch %d of %d %+v: redis %v, memory %v\n redis  %+v\n memory %+v", step, at, b, len(round), items, oksR[b], okM, outsR[b], outM)
				}
				for i := range items {
					if outsR[b][i] != outM[i] {
						t.Fatalf("step %d at %v: coalesced batch %d item %d (%+v):\n redis  %+v\n memory %+v", step, at, b, i, items[i], outsR[b][i], outM[i])
					}
				}
			}
		default: // a plain decision (a peek, a charge) on the same keys
			items := randomItems()
			outR := make([]spillway.Decision, len(items))
			outM := make([]spillway.Decision, len(items))
			okR, errR := rs.Decide(ctx, items, outR)
			okM, errM := ms.Decide(ctx, items, outM)
			if errR != nil || errM != nil {
				t.Fatalf("step %d: decide: redis %v, memory %v", step, errR, errM)
			}
			logf("step %d at %v: decide %+v -> redis %v %+v", step, at, items, okR, outR)
			if okR != okM {
				t.Fatalf("step %d at %v: decide %+v: redis %v, memory %v\n redis  %+v\n memory %+v", step, at, items, okR, okM, outR, outM)
			}
			for i := range items {
				if outR[i] != outM[i] {
					t.Fatalf("step %d at %v: decide item %d (%+v):\n redis  %+v\n memory %+v", step, at, i, items[i], outR[i], outM[i])
				}
			}
		}
	}
	t.Logf("%d reserves, %d allowed; settled items: %d applied, %d already settled, %d expired; %d coalesced rounds, %d of reservations", reserves, allowed, applied, already, expired, coalescedRounds, coalescedHolds)
	if allowed == 0 || allowed == reserves || applied == 0 || already == 0 || expired == 0 || coalescedHolds == 0 {
		t.Fatalf("the sequence missed a case: %d reserves, %d allowed, %d applied, %d already settled, %d expired", reserves, allowed, applied, already, expired)
	}
}
