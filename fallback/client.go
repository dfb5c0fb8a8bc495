package fallback

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Optional go-redis settings for a client behind a fallback. go-redis's
// defaults are built for patience (5s dials retried 5 times 100ms apart, 3s
// reads, a pool wait of ReadTimeout + 1s, three command retries with
// backoff), and by default it ignores context deadlines for socket I/O.
// The budget holds without them (NewHealth turns ContextTimeoutEnabled on);
// they shorten the backstops: what a call without a deadline waits, and
// how long an abandoned call holds its connection.
const (
	// ClientDialTimeout bounds a new connection.
	ClientDialTimeout = 250 * time.Millisecond
	// ClientDialerRetries is 1: a refused dial fails at once instead of
	// being retried 5 times 100ms apart.
	ClientDialerRetries = 1
	// ClientIOTimeout is the read/write backstop when a caller passes no
	// deadline; the Budget's context deadline normally ends calls first.
	ClientIOTimeout = 250 * time.Millisecond
	// ClientPoolTimeout bounds the wait for a free pooled connection.
	ClientPoolTimeout = 250 * time.Millisecond
	// ClientMaxRetries is 1: one immediate retry heals a pooled connection
	// that died with a restarted server, within the budget; more retries
	// only spend the budget on a sick server.
	ClientMaxRetries = 1
)

// tunable points at the fields the three option structs share.
type tunable struct {
	ctxTimeout                                    *bool
	dial, read, write, pool, minBackoff, dialWait *time.Duration
	retries, dialRetries                          *int
}

func (t tunable) apply() {
	*t.ctxTimeout = true
	setDur(t.dial, ClientDialTimeout)
	setDur(t.read, ClientIOTimeout)
	setDur(t.write, ClientIOTimeout)
	setDur(t.pool, ClientPoolTimeout)
	setDur(t.dialWait, 10*time.Millisecond)
	if *t.minBackoff == 0 {
		*t.minBackoff = -1 // no backoff: retry at once
	}
	if *t.retries == 0 {
		*t.retries = ClientMaxRetries
	}
	if *t.dialRetries == 0 {
		*t.dialRetries = ClientDialerRetries
	}
}

func setDur(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

// TuneOptions sets o — the options of redis.NewClient, of
// redis.NewFailoverClient (Sentinel) or of redis.NewUniversalClient (a
// single-node, Sentinel or Cluster client) — for use behind a fallback:
// ContextTimeoutEnabled (so the Budget's deadline reaches the socket; this
// one is always set), and, where still zero, the Client* timeouts and
// retries above, with no retry backoff.
func TuneOptions[O redis.Options | redis.FailoverOptions | redis.UniversalOptions](o *O) {
	switch o := any(o).(type) {
	case *redis.Options:
		tunable{&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MinRetryBackoff, &o.DialerRetryTimeout, &o.MaxRetries, &o.DialerRetries}.apply()
	case *redis.FailoverOptions:
		tunable{&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MinRetryBackoff, &o.DialerRetryTimeout, &o.MaxRetries, &o.DialerRetries}.apply()
	case *redis.UniversalOptions:
		tunable{&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MinRetryBackoff, &o.DialerRetryTimeout, &o.MaxRetries, &o.DialerRetries}.apply()
	}
}
