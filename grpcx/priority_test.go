package grpcx_test

import (
	"context"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/grpcx"
	"github.com/spillway-go/spillway/shedder"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fullForSheddable returns a worker shedder of capacity 5 whose in-flight
// work (4 Critical units, held until the test ends) fills what Sheddable
// work may use (5 × (1 − 0.2 reserve) = 4) and leaves one unit for
// Critical work. The clock is frozen, so no tick moves the shed level.
func fullForSheddable(t *testing.T) *shedder.Worker {
	t.Helper()
	w, err := shedder.NewWorker(5, shedder.WorkerSettings{Clock: fixedClock})
	require.NoError(t, err)
	d, done, err := w.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical, Cost: 4})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	t.Cleanup(func() { done(spillway.Success) })
	return w
}

// A custom classifier decides the priority of a call that carries none; a
// caller's lower propagated priority (spillway-priority: sheddable) still
// applies, so a shedder full for Sheddable work sheds it with Unavailable
// while a Critical call passes. ServerSettings.IgnoreReceivedPriority turns that off.
func TestPropagatedPriorityUnderCustomClassifier(t *testing.T) {
	classify := func(context.Context, string) spillway.Priority { return spillway.Critical }
	sheddable := func() context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), spillway.PriorityMetadataKey, "sheddable")
	}

	conn := start(t, fullForSheddable(t), grpcx.ServerSettings{Priority: classify})
	_, err := check(sheddable(), conn)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	_, err = check(context.Background(), conn)
	require.NoError(t, err)

	// A received priority never raises one, unless trusted.
	low := func(context.Context, string) spillway.Priority { return spillway.Sheddable }
	critPlus := metadata.AppendToOutgoingContext(context.Background(), spillway.PriorityMetadataKey, "critical_plus")
	conn = start(t, fullForSheddable(t), grpcx.ServerSettings{Priority: low})
	_, err = check(critPlus, conn)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	conn = start(t, fullForSheddable(t), grpcx.ServerSettings{Priority: low, TrustPriorityMetadata: true})
	_, err = check(critPlus, conn)
	require.NoError(t, err)

	// Turned off by name: the classifier alone decides.
	conn = start(t, fullForSheddable(t), grpcx.ServerSettings{Priority: classify, IgnoreReceivedPriority: true})
	_, err = check(sheddable(), conn)
	require.NoError(t, err)
}
