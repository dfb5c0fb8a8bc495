package grpcx_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/internal/cchook"
	"github.com/spillway-go/spillway/internal/keys"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// done never delays a response: with Redis stopped (SIGSTOP) while the
// handler works, the concurrency release that done sends leaves the
// response path. Before, the release waited its 50 ms timeout before the
// answer went out; the bound (20 ms after the handler returned) fails
// then. Once Redis is back the release lands: the slot is free.
func TestDoneDoesNotDelayResponse(t *testing.T) {
	rs := redistest.Start(t)
	// The release timeout reaches the socket.
	client := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	store, err := concurrency.NewRedisStore(client, concurrency.RedisSettings{})
	require.NoError(t, err)
	lim, err := concurrency.New(store, 1, concurrency.Settings{Name: "inflight"})
	require.NoError(t, err)

	const work = 50 * time.Millisecond
	var pause atomic.Bool
	var returned atomic.Int64 // when the handler returned, UnixNano
	slow := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if pause.Load() {
			require.NoError(t, rs.Pause()) // Redis stops mid-request
		}
		time.Sleep(work)
		defer func() { returned.Store(time.Now().UnixNano()) }()
		return handler(ctx, req)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcx.UnaryServerInterceptor(concurrency.PerKey(lim, spillway.DimIP), grpcx.ServerSettings{}), slow))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	t.Cleanup(func() { _ = rs.Resume() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })

	_, err = check(context.Background(), conn) // warm: the connections, the script loaded
	require.NoError(t, err)
	lim.WaitReleases()
	pause.Store(true)
	_, err = check(context.Background(), conn)
	added := time.Since(time.Unix(0, returned.Load()))
	require.NoError(t, err)
	// The bug added the release timeout (50 ms); nothing else runs after
	// the handler but sending the answer.
	t.Logf("the answer came %v after the handler returned", added)
	require.Less(t, added, 20*time.Millisecond, "the answer waited for done's release")

	require.NoError(t, rs.Resume())
	lim.WaitReleases()
	n, err := client.ZCard(context.Background(), keys.Concurrency("spillway:", "inflight", "127.0.0.1")).Result()
	require.NoError(t, err)
	pending, _ := cchook.PendingReleases(lim)
	require.Equal(t, int64(0), n+pending, "the release is neither lost nor left behind")
}
