package spillway

// moreRestrictive reports whether the allowed decision d should replace
// best as an allowed chain's answer, the one whose Limit, Remaining and
// Window become the rate-limit headers:
//
//   - a decision that carries a Limit beats one that does not;
//   - a rate limit's decision (Window > 0) beats any other, so that a
//     concurrency limit or a shedder's capacity never overwrites, in the
//     headers, the rate limit the client is under;
//   - among the same kind, the lowest Remaining wins (the first on a tie).
func moreRestrictive(d, best Decision) bool {
	switch {
	case d.Limit <= 0:
		return false
	case best.Limit <= 0:
		return true
	case (d.Window > 0) != (best.Window > 0):
		return d.Window > 0
	}
	return d.Remaining < best.Remaining
}
