package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/lua"
)

// holdVector is one golden vector of the layout of a bucket key's value
// (lua/testdata/hold_layout.json): a value, what it decodes to, and what
// one decision or one settle on it leads to, with the client's clock.
type holdVector struct {
	Name    string `json:"name"`
	Value   string `json:"value"` // "": no key
	Decoded *struct {
		TAT         int64 `json:"tat"`
		Marked      bool  `json:"marked"`
		First, Last int64
		Holds       []struct {
			Member string `json:"member"`
			Est    int64  `json:"est"`
			End    int64  `json:"end"`
		} `json:"holds"`
	} `json:"decoded"` // nil: not of the layout (read as no state)
	Op     string `json:"op"` // "decide" (ratelimit_token_bucket.lua), "reserve" (ratelimit_hold.lua) or "settle" (ratelimit_settle.lua)
	Now    int64  `json:"now"`
	T      int64  `json:"T"`
	Tau    int64  `json:"tau"`
	N      int64  `json:"n"`   // decide: the cost; reserve: the estimate
	TTL    int64  `json:"ttl"` // reserve: the hold's life, µs
	Member string `json:"member"`
	Est    int64  `json:"est"`
	Actual int64  `json:"actual"`
	End    int64  `json:"end"` // settle: the hold's release time
	// the outcome: decide's wait and decision, settle's result, and the
	// key's value after ("": no key)
	Wait    int64  `json:"wait"`
	Allowed bool   `json:"allowed"`
	Result  string `json:"result"`
	After   string `json:"after"`
}

func holdVectors(t *testing.T) []holdVector {
	t.Helper()
	b, err := os.ReadFile("../lua/testdata/hold_layout.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []holdVector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	return vs
}

// decoded is the heldValue v.Decoded names.
func (v *holdVector) decoded() heldValue {
	d := v.Decoded
	hv := heldValue{tat: d.TAT, marked: d.Marked, first: d.First, last: d.Last}
	for _, e := range d.Holds {
		hv.holds = append(hv.holds, heldEntry{member: e.Member, est: e.Est, end: e.End})
	}
	return hv
}

// apply runs v's operation on the key's value in Go: the codec of
// hold_layout.go and the arithmetic of hold.go, as the scripts do (the
// release of the holds that ended on a marked key, then the decision or
// the settle). It returns the wait (decide) or the result (settle), and
// the value after.
func (v *holdVector) apply() (wait int64, allowed bool, res SettleResult, after string) {
	lim := &limits{T: v.T, tau: v.Tau, B: v.Tau / v.T}
	hv, ok := parseHeldValue(v.Value)
	if !ok {
		hv = heldValue{}
	}
	after = v.Value
	// a marked key: release the holds that ended, once now reaches first
	if hv.marked && len(hv.holds) > 0 && v.Now >= hv.first {
		t0 := heldNow(hv.tat, v.Now, lim, true)
		var keep []heldEntry
		first := int64(0)
		for _, e := range hv.holds {
			if e.end <= v.Now {
				hv.tat = heldRefund(hv.tat, t0, e.est, lim.T)
				continue
			}
			keep = append(keep, e)
			if first == 0 || e.end < first {
				first = e.end
			}
		}
		hv.holds, hv.first = keep, first
		if len(keep) == 0 {
			hv.last = 0
		}
		hv.marked = len(hv.holds) > 0 || hv.tat-t0 > lim.tau
		after = hv.String()
	}
	switch v.Op {
	case "reserve":
		o, nt, t := heldDecide(hv.tat, v.Now, lim, v.N, hv.marked)
		wait = max(hv.tat, t) - t
		if o.allowed {
			end := v.Now + v.TTL
			if len(hv.holds) == 0 || end < hv.first {
				hv.first = end
			}
			hv.last = max(hv.last, end)
			hv.tat, hv.marked = nt, true
			hv.holds = append(hv.holds, heldEntry{member: v.Member, est: v.N, end: end})
			after = hv.String()
		}
		return wait, o.allowed, 0, after
	case "decide":
		o, nt, t := heldDecide(hv.tat, v.Now, lim, v.N, hv.marked)
		wait = max(hv.tat, t) - t
		if o.allowed && v.N > 0 {
			hv.tat = nt
			hv.marked = len(hv.holds) > 0 || nt-t > lim.tau
			after = hv.String()
		}
		return wait, o.allowed, 0, after
	case "settle":
		i := -1
		for j, e := range hv.holds {
			if e.member == v.Member && e.est == v.Est {
				i = j
			}
		}
		if i < 0 {
			if v.Now < v.End {
				return 0, false, SettleAlreadySettled, after
			}
			return 0, false, SettleExpired, after
		}
		hv.holds = append(hv.holds[:i:i], hv.holds[i+1:]...)
		if len(hv.holds) == 0 {
			hv.first, hv.last = 0, 0
		}
		t := heldNow(hv.tat, v.Now, lim, hv.marked)
		hv.tat = heldSettle(hv.tat, t, v.Est, v.Actual, lim)
		hv.marked = len(hv.holds) > 0 || hv.tat-t > lim.tau
		return 0, false, SettleApplied, hv.String()
	}
	panic("unknown op " + v.Op)
}

// TestHoldLayoutVectors checks the Go side of the golden vectors: each
// value decodes to what the vector says (and encodes back to itself), and
// the Go arithmetic on it gives the vector's outcome. The scripts check
// the same vectors on redis-server in TestHoldLayoutVectorsRedis.
func TestHoldLayoutVectors(t *testing.T) {
	for _, v := range holdVectors(t) {
		hv, ok := parseHeldValue(v.Value)
		switch {
		case v.Decoded == nil && ok:
			t.Errorf("%s: %q decodes to %+v, want not of the layout", v.Name, v.Value, hv)
		case v.Decoded != nil && (!ok || !reflect.DeepEqual(hv, v.decoded())):
			t.Errorf("%s: %q decodes to %+v (%v), want %+v", v.Name, v.Value, hv, ok, v.decoded())
		case ok && hv.String() != v.Value:
			t.Errorf("%s: %q encodes back to %q", v.Name, v.Value, hv.String())
		}
		if a, ok := parseHeldValue(v.After); v.After != "" && (!ok || a.String() != v.After) {
			t.Errorf("%s: after %q does not round-trip (%q, %v)", v.Name, v.After, a.String(), ok)
		}
		wait, allowed, res, after := v.apply()
		switch v.Op {
		case "decide", "reserve":
			if wait != v.Wait || allowed != v.Allowed {
				t.Errorf("%s: Go decides wait %d allowed %v, want %d %v", v.Name, wait, allowed, v.Wait, v.Allowed)
			}
		case "settle":
			if res.String() != v.Result {
				t.Errorf("%s: Go settles %v, want %s", v.Name, res, v.Result)
			}
		}
		if after != v.After {
			t.Errorf("%s: Go leaves %q, want %q", v.Name, after, v.After)
		}
	}
}

// TestHoldLayoutVectorsRedis runs the golden vectors through the scripts
// on redis-server: the key set to the vector's value, one call of
// ratelimit_token_bucket.lua (decide), ratelimit_hold.lua (reserve) or
// ratelimit_settle.lua (settle)
// with the vector's clock, and the reply and the key's value after
// checked against the vector.
func TestHoldLayoutVectorsRedis(t *testing.T) {
	_, c := redisServer(t)
	ctx := context.Background()
	for i, v := range holdVectors(t) {
		key := "v" + strconv.Itoa(i)
		if v.Value != "" {
			if err := c.Set(ctx, key, v.Value, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		now := strconv.FormatInt(v.Now, 10)
		switch v.Op {
		case "decide":
			wait, err := lua.Script("ratelimit_token_bucket").Run(ctx, c, []string{key}, now, v.T, v.Tau, v.N).Int64()
			if err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
			o := waitOutcome(wait, &limits{T: v.T, tau: v.Tau, B: v.Tau / v.T}, v.N)
			if wait != v.Wait || o.allowed != v.Allowed {
				t.Errorf("%s: the script replies wait %d (allowed %v), want %d %v", v.Name, wait, o.allowed, v.Wait, v.Allowed)
			}
		case "reserve":
			r, err := lua.Script("ratelimit_hold").Run(ctx, c, []string{key}, now, 1, 1, v.TTL,
				v.T, v.Tau, v.N, holdName(v.Member, v.N)).Int64Slice()
			if err != nil || len(r) != 3 {
				t.Fatalf("%s: %v %v", v.Name, r, err)
			}
			if r[2] != v.Wait || (r[1] == 1) != v.Allowed {
				t.Errorf("%s: the hold script replies %v, want wait %d allowed %v", v.Name, r, v.Wait, v.Allowed)
			}
		case "settle":
			r, err := lua.Script("ratelimit_settle").Run(ctx, c, []string{key}, now, 0,
				v.T, v.Tau, v.Est, v.Actual, holdName(v.Member, v.Est), v.End).Int64Slice()
			if err != nil || len(r) != 1 {
				t.Fatalf("%s: %v %v", v.Name, r, err)
			}
			res, err := settleResultOf(0, r[0])
			if err != nil || res.String() != v.Result {
				t.Errorf("%s: the script settles %v (%v), want %s", v.Name, res, err, v.Result)
			}
		default:
			t.Fatalf("%s: unknown op %q", v.Name, v.Op)
		}
		got, err := c.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			got, err = "", nil
		}
		if err != nil || got != v.After {
			t.Errorf("%s: the script leaves %q (%v), want %q", v.Name, got, err, v.After)
		}
	}
}
