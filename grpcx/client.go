package grpcx

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrThrottled is returned by the client interceptors when client-side
// throttling rejected a call locally; it was not sent. Its code is
// Unavailable; compare with errors.Is.
var ErrThrottled = status.Error(codes.Unavailable, "grpcx: call throttled locally: the backend is rejecting most calls")

type client struct {
	c config
}

func newClient(opts []Option) *client {
	c := newConfig(opts)
	if c.throttle == nil && !c.noThrottle {
		th, err := clientside.NewThrottle()
		if err != nil {
			panic(err) // defaults are valid; unreachable
		}
		c.throttle = th
	}
	if c.budget == nil && !c.noBudget {
		b, err := clientside.NewRetryBudget()
		if err != nil {
			panic(err)
		}
		c.budget = b
	}
	return &client{c: c}
}

// UnaryClientInterceptor returns a client interceptor that sends the
// context's priority downstream (spillway.PriorityMetadataKey), rejects calls
// locally when adaptive throttling says the backend is rejecting most of
// them (ErrThrottled), and retries a ResourceExhausted or Unavailable
// answer that carries errdetails.RetryInfo after the delay it asks (plus
// jitter), under a retry budget, at most WithMaxRetries times, and only when
// the context's deadline leaves time for the wait. Defaults: the clientside
// Throttle and RetryBudget, DefaultMaxRetries retries.
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	cl := newClient(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		c := &cl.c
		ctx = cl.propagate(ctx)
		if c.skip != nil && c.skip(ctx, method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		r := clientside.Retries{Throttle: c.throttle, Budget: c.budget, Backoff: c.backoff, Max: c.maxRetries}
		if c.retryable != nil && !c.retryable(method) {
			r.Max = 0
		}
		if !r.Begin() {
			return ErrThrottled
		}
		for attempt := 0; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if !overloaded(err) {
				r.Accepted()
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok {
				return err // overloaded, but the server did not say when to come back
			}
			wait, ok := r.Next(ctx, attempt, delay)
			if !ok {
				return err
			}
			if serr := clientside.Sleep(ctx, wait); serr != nil {
				return status.FromContextError(serr).Err()
			}
		}
	}
}

// StreamClientInterceptor returns a client interceptor for streams that
// propagates the priority and applies adaptive throttling. Streams are not
// retried: a server denies a stream on its first receive, after the
// caller may already have sent messages.
func StreamClientInterceptor(opts ...Option) grpc.StreamClientInterceptor {
	cl := newClient(opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		c := &cl.c
		ctx = cl.propagate(ctx)
		if (c.skip != nil && c.skip(ctx, method)) || c.throttle == nil {
			return streamer(ctx, desc, cc, method, callOpts...)
		}
		if !c.throttle.Allow() {
			return nil, ErrThrottled
		}
		cs, err := streamer(ctx, desc, cc, method, callOpts...)
		if err != nil {
			if !overloaded(err) {
				c.throttle.Accepted()
			}
			return nil, err
		}
		return &watchedStream{ClientStream: cs, th: c.throttle}, nil
	}
}

// watchedStream tells the throttle whether the server accepted the stream,
// judged by how the first receive ends.
type watchedStream struct {
	grpc.ClientStream
	th   Throttle
	once sync.Once
}

func (s *watchedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	s.once.Do(func() {
		if err == nil || err == io.EOF || !overloaded(err) {
			s.th.Accepted()
		}
	})
	return err
}

func (cl *client) propagate(ctx context.Context) context.Context {
	if cl.c.noPropagate {
		return ctx
	}
	p, ok := spillway.PriorityFromContext(ctx)
	if !ok {
		return ctx
	}
	if md, has := metadata.FromOutgoingContext(ctx); has && len(md.Get(spillway.PriorityMetadataKey)) > 0 {
		return ctx // the caller chose one
	}
	return metadata.AppendToOutgoingContext(ctx, spillway.PriorityMetadataKey, p.String())
}

func overloaded(err error) bool {
	switch status.Code(err) {
	case codes.ResourceExhausted, codes.Unavailable:
		return true
	}
	return false
}

// RetryDelay returns the delay of the errdetails.RetryInfo in err's status
// and whether there is one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			delay := ri.GetRetryDelay().AsDuration()
			return max(delay, time.Millisecond), true
		}
	}
	return 0, false
}
