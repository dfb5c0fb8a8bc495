// Package retryafter reads the Retry-After header of an HTTP answer for
// the client side of the adapters (httpx.Transport).
package retryafter

import (
	"strconv"
	"strings"
	"time"
)

// httpDateLayouts are the three date formats RFC 9110 allows in
// Retry-After (IMF-fixdate, RFC 850, asctime).
var httpDateLayouts = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

// Parse parses a Retry-After header value: delay-seconds or an
// HTTP date, taken relative to now (a date in the past is 0). It reports
// false for an empty or malformed value.
func Parse(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			return 0, false
		}
		if n > uint64(1<<63-1)/uint64(time.Second) {
			n = uint64(1<<63-1) / uint64(time.Second)
		}
		return time.Duration(n) * time.Second, true
	}
	for _, layout := range httpDateLayouts {
		if t, err := time.Parse(layout, v); err == nil {
			return max(t.Sub(now), 0), true
		}
	}
	return 0, false
}
