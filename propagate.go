package spillway

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PriorityHeader is the HTTP header that carries a request's priority to
// downstream services, so a backend sheds the same way its caller would. Its
// value is the name returned by Priority.String ("critical_plus").
const PriorityHeader = "Spillway-Priority"

// PriorityMetadataKey is the gRPC metadata key that carries the priority;
// gRPC metadata keys are lowercase. The value is the same as
// PriorityHeader's.
const PriorityMetadataKey = "spillway-priority"

// TimeoutHeader is the HTTP header in which a client states how long it
// will wait for the answer, in whole milliseconds ("300"): the HTTP
// counterpart of gRPC's grpc-timeout, which arrives as the context's
// deadline. A server that reads it (httpx.Settings.DeadlineHeader) gives the
// request's context that deadline, so that blocks which queue
// (shedder.Queue, shedder.Pool) refuse at once a request they could not
// serve in time, and drop one whose client gave up while it waited.
const TimeoutHeader = "Spillway-Timeout"

// ParseTimeout reads the value of a TimeoutHeader header: whole
// milliseconds, 1 to 3 600 000 (an hour), spaces around it ignored.
func ParseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	ms, err := strconv.ParseUint(v, 10, 64)
	if err != nil || ms < 1 || ms > 3_600_000 {
		return 0, fmt.Errorf("spillway: timeout %q: want whole milliseconds from 1 to 3600000", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

type priorityKey struct{}

// ContextWithPriority returns a copy of ctx that carries priority p. The
// adapters store the priority of the request being served there, so that
// outgoing calls made while serving it (the httpx Transport, the grpcx
// client interceptors) carry it downstream.
func ContextWithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFromContext returns the priority stored by ContextWithPriority
// and whether there is a valid one.
func PriorityFromContext(ctx context.Context) (Priority, bool) {
	p, ok := ctx.Value(priorityKey{}).(Priority)
	return p, ok && p.Valid()
}
