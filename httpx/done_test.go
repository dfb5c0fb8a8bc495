package httpx_test

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/httpx"
	"github.com/spillway-go/spillway/internal/cchook"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
)

// done never delays a response: with Redis stopped (SIGSTOP) while the
// handler works, the concurrency release that done sends leaves the
// response path. Before, the release waited its 50 ms timeout before the
// response went out; the bound (work + 20 ms) fails then. Once Redis is
// back the release lands: the slot is free.
func TestDoneDoesNotDelayResponse(t *testing.T) {
	rs := redistest.Start(t)
	opt := &redis.Options{Addr: rs.Addr}
	fallback.TuneOptions(opt) // the release timeout reaches the socket
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	store, err := concurrency.NewRedisStore(client, concurrency.RedisSettings{})
	require.NoError(t, err)
	lim, err := concurrency.New(store, 1, concurrency.Settings{Name: "inflight"})
	require.NoError(t, err)

	const work = 50 * time.Millisecond
	var pause atomic.Bool
	var returned atomic.Int64 // when the handler returned, UnixNano
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pause.Load() {
			require.NoError(t, rs.Pause()) // Redis stops mid-request
		}
		time.Sleep(work)
		io.WriteString(w, "ok")
		returned.Store(time.Now().UnixNano())
	})
	srv := serve(t, httpx.Middleware(concurrency.PerKey(lim, spillway.DimIP), httpx.Settings{})(handler))
	t.Cleanup(func() { _ = rs.Resume() })

	resp, _ := get(t, srv.URL, nil) // warm: the pool's connection, the script loaded
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lim.WaitReleases()
	pause.Store(true)
	resp, body := get(t, srv.URL, nil)
	added := time.Since(time.Unix(0, returned.Load()))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok", body)
	// The bug added the release timeout (50 ms); nothing else runs after
	// the handler but writing the response.
	t.Logf("the response came %v after the handler returned", added)
	require.Less(t, added, 20*time.Millisecond, "the response waited for done's release")

	require.NoError(t, rs.Resume())
	lim.WaitReleases()
	n, err := client.ZCard(context.Background(), keys.Concurrency("spillway:", "inflight", "127.0.0.1")).Result()
	require.NoError(t, err)
	pending, _ := cchook.PendingReleases(lim)
	require.Equal(t, int64(0), n+pending, "the release is neither lost nor left behind")
}
