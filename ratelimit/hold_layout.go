package ratelimit

import (
	"strconv"
	"strings"
)

// The layout of a bucket key's value on Redis (token bucket, GCRA, leaky
// bucket), in Go. lua/ratelimit_holds.lua's hparse and hvalue are the
// same codec in Lua; the golden vectors of lua/testdata/hold_layout.json
// (encoded values and the decisions they lead to) are checked by both
// (TestHoldLayoutVectors, TestHoldLayoutVectorsRedis):
//
//	value := tat                           plain: not marked
//	       | tat "h" first ":" last hold*  marked: holds outstanding or a debt
//	hold  := "," id "/" i "=" est "@" end
//
// All numbers are decimal integers, in µs but est (units). first is at
// most the earliest end of a live hold, last the latest; both 0 without
// holds (a debt alone, "<tat>h0:0"), and ignored then. With Redis TIME
// the scripts may write a plain TAT compact (a residual below 1000 whose
// key expires at the TAT's ms: ratelimit_holds.lua's tatof); heldValue
// takes the TAT as written.

// heldValue is a bucket key's value, decoded.
type heldValue struct {
	tat         int64
	marked      bool
	first, last int64 // see the layout; 0 without holds
	holds       []heldEntry
}

// heldEntry is one live hold in a key's value.
type heldEntry struct {
	member string // "<hold id>/<i>"
	est    int64  // the estimate held, in units
	end    int64  // its release time, µs
}

// holdName is the name of hold member with estimate est in a key's value
// (what the scripts take in ARGV as a hold's member): "<member>=<est>".
func holdName(member string, est int64) string {
	return member + "=" + strconv.FormatInt(est, 10)
}

// parseHeldValue decodes v; ok is false for a value that is not of the
// layout (the scripts read it as no state).
func parseHeldValue(v string) (hv heldValue, ok bool) {
	head, rest, marked := strings.Cut(v, "h")
	tat, err := strconv.ParseInt(head, 10, 64)
	if err != nil || tat < 0 {
		return heldValue{}, false
	}
	hv.tat = tat
	if !marked {
		return hv, true
	}
	hv.marked = true
	bounds, holds, _ := strings.Cut(rest, ",")
	fs, ls, ok := strings.Cut(bounds, ":")
	if !ok {
		return heldValue{}, false
	}
	if hv.first, err = strconv.ParseInt(fs, 10, 64); err != nil || hv.first < 0 {
		return heldValue{}, false
	}
	if hv.last, err = strconv.ParseInt(ls, 10, 64); err != nil || hv.last < 0 {
		return heldValue{}, false
	}
	if !strings.Contains(rest, ",") {
		return hv, true
	}
	for _, s := range strings.Split(holds, ",") {
		name, end, ok1 := cutLast(s, '@')
		member, est, ok2 := cutLast(name, '=')
		if !ok1 || !ok2 {
			return heldValue{}, false
		}
		e := heldEntry{member: member}
		if e.est, err = strconv.ParseInt(est, 10, 64); err != nil {
			return heldValue{}, false
		}
		if e.end, err = strconv.ParseInt(end, 10, 64); err != nil {
			return heldValue{}, false
		}
		hv.holds = append(hv.holds, e)
	}
	return hv, true
}

// cutLast cuts s around its last sep.
func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// String encodes hv: a value with holds is marked whatever hv.marked says,
// and one without writes first and last as 0.
func (hv heldValue) String() string {
	b := strconv.AppendInt(nil, hv.tat, 10)
	switch {
	case len(hv.holds) > 0:
		b = append(b, 'h')
		b = strconv.AppendInt(b, hv.first, 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, hv.last, 10)
		for _, e := range hv.holds {
			b = append(b, ',')
			b = append(b, holdName(e.member, e.est)...)
			b = append(b, '@')
			b = strconv.AppendInt(b, e.end, 10)
		}
	case hv.marked:
		b = append(b, "h0:0"...)
	}
	return string(b)
}
