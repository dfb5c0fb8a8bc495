package demo

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// The server spans below stand in for what otelhttp.NewHandler and
// otelgrpc's stats handler start in a service, so that telemetry.Instrument
// has a span to add its spillway.decision event to.

// TraceHTTP wraps h in a server span named after route.
func TraceHTTP(tracer trace.Tracer, route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.route", route)))
		defer span.End()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// TraceUnary starts a server span per unary call; it goes before grpcx's
// interceptor.
func TraceUnary(tracer trace.Tracer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tracer.Start(ctx, info.FullMethod, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		return h(ctx, req)
	}
}

// TraceStream starts a server span per stream; it goes before grpcx's
// interceptor.
func TraceStream(tracer trace.Tracer) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := tracer.Start(ss.Context(), info.FullMethod, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		return h(srv, &tracedStream{ss, ctx})
	}
}

type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }
