package grpcx

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/clientside"
	"github.com/spillway-go/spillway/internal/sleep"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/spillway-go/spillway/internal/clienthook"
)

// throttled is clientside.ErrThrottled with the gRPC code Unavailable.
type throttled struct{}

func (throttled) Error() string { return clientside.ErrThrottled.Error() }
func (throttled) Unwrap() error { return clientside.ErrThrottled }
func (throttled) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, clientside.ErrThrottled.Error())
}

type client struct {
	c  config
	cl *clientside.Client
}

// UnaryClientInterceptor returns a client interceptor that sends the
// context's priority downstream (spillway.PriorityMetadataKey), rejects calls
// locally when adaptive throttling says the backend is rejecting most of
// them (ErrThrottled), and retries a ResourceExhausted or Unavailable
// answer that carries errdetails.RetryInfo after the delay it asks (plus
// jitter), under a retry budget, at most c.MaxRetries times, and only when
// the context's deadline leaves time for the wait, as c (its throttle,
// budget, backoff and MaxRetries; clientside.NewClient() for the defaults,
// nil for none) says. A call rejected locally fails with an error that is
// clientside.ErrThrottled (errors.Is) and has the code Unavailable; s
// (ClientSettings{} for the defaults) skips methods, restricts retries or
// stops the priority's propagation. Share c between the unary and stream interceptors of a
// connection: the throttle learns that backend's rejections.
func UnaryClientInterceptor(c *clientside.Client, s ClientSettings) grpc.UnaryClientInterceptor {
	cl := &client{c: newClientConfig(s), cl: c}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		c := &cl.c
		ctx = cl.propagate(ctx)
		if c.skip != nil && c.skip(ctx, method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		r := cl.cl
		retry := c.retryable == nil || c.retryable(method)
		if !r.Begin() {
			return throttled{}
		}
		for attempt := 0; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if !overloaded(err) {
				r.Accepted()
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok || !retry {
				return err // overloaded, but the server did not say when to come back
			}
			wait, ok := r.Next(ctx, attempt, delay)
			if !ok {
				return err
			}
			if serr := sleep.Sleep(ctx, wait); serr != nil {
				return status.FromContextError(serr).Err()
			}
		}
	}
}

// StreamClientInterceptor returns a client interceptor for streams that
// propagates the priority and applies adaptive throttling. Streams are not
// retried: a server denies a stream on its first receive, after the
// caller may already have sent messages. Of c only the Throttle applies
// (nil c or Throttle: none).
func StreamClientInterceptor(c *clientside.Client, s ClientSettings) grpc.StreamClientInterceptor {
	cl := &client{c: newClientConfig(s), cl: c}
	th := clienthook.Throttle(c)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		c := &cl.c
		ctx = cl.propagate(ctx)
		if (c.skip != nil && c.skip(ctx, method)) || th == nil {
			return streamer(ctx, desc, cc, method, callOpts...)
		}
		if !th.Allow() {
			return nil, throttled{}
		}
		cs, err := streamer(ctx, desc, cc, method, callOpts...)
		if err != nil {
			if !overloaded(err) {
				th.Accepted()
			}
			return nil, err
		}
		return &watchedStream{ClientStream: cs, th: th}, nil
	}
}

// watchedStream tells the throttle whether the server accepted the stream,
// judged by how the first receive ends.
type watchedStream struct {
	grpc.ClientStream
	th   clienthook.Throttler
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
