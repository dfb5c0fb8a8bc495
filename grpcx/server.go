package grpcx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/admission"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/spillway-go/spillway/internal/block"
	"github.com/spillway-go/spillway/internal/budget"
)

// Response metadata keys set on every call a limit applied to, allowed or
// denied, when the decision has a Limit.
const (
	HeaderLimit     = "x-ratelimit-limit"
	HeaderRemaining = "x-ratelimit-remaining"
	HeaderReset     = "x-ratelimit-reset" // Unix epoch seconds, rounded up
)

// ErrorDomain is the domain of the errdetails.ErrorInfo in denials.
const ErrorDomain = "spillway"

// UnaryServerInterceptor admits every unary call through l before the
// handler runs. See the package doc for the answers.
func UnaryServerInterceptor(l spillway.Limiter, set ServerSettings) grpc.UnaryServerInterceptor {
	s := &server{c: newServerConfig(set), l: l}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		if s.c.skip != nil && s.c.skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		ctx = budget.Request(ctx) // one budget for the call, however chains nest in the handler
		done, pri, hdr, usage, err := s.admit(ctx, info.FullMethod)
		if hdr != nil {
			_ = grpc.SetHeader(ctx, hdr)
		}
		if err != nil {
			return nil, err
		}
		if usage != nil {
			ctx = spillway.ContextWithUsage(ctx, usage)
		}
		if !s.c.noPropagate {
			ctx = spillway.ContextWithPriority(ctx, pri)
		}
		g := admission.Guard{Done: done}
		defer g.Release() // the handler panicked: release; the panic goes on
		resp, err = handler(ctx, req)
		g.Finish(outcome(ctx, err))
		return resp, err
	}
}

// StreamServerInterceptor admits every streaming call through l when the
// stream opens; the admission is released when the handler returns.
func StreamServerInterceptor(l spillway.Limiter, set ServerSettings) grpc.StreamServerInterceptor {
	s := &server{c: newServerConfig(set), l: l}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		ctx := ss.Context()
		if s.c.skip != nil && s.c.skip(ctx, info.FullMethod) {
			return handler(srv, ss)
		}
		ctx = budget.Request(ctx) // one budget for the call, however chains nest in the handler
		done, pri, hdr, usage, err := s.admit(ctx, info.FullMethod)
		if hdr != nil {
			_ = ss.SetHeader(hdr)
		}
		if err != nil {
			return err
		}
		if usage != nil {
			ctx = spillway.ContextWithUsage(ctx, usage)
		}
		if !s.c.noPropagate {
			// Outgoing calls made while serving carry the priority.
			ctx = spillway.ContextWithPriority(ctx, pri)
		}
		if ctx != ss.Context() {
			ss = &ctxStream{ServerStream: ss, ctx: ctx}
		}
		g := admission.Guard{Done: done}
		defer g.Release()
		err = handler(srv, ss)
		g.Finish(outcome(ctx, err))
		return err
	}
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

type server struct {
	c config
	l spillway.Limiter
}

func (s *server) priority(ctx context.Context, method string) spillway.Priority {
	p := spillway.Critical
	if s.c.priority != nil {
		p = s.c.priority(ctx, method)
	}
	if s.c.noReceived || !p.Valid() {
		return p
	}
	var received string
	if v := metadata.ValueFromIncomingContext(ctx, spillway.PriorityMetadataKey); len(v) > 0 {
		received = v[0]
	}
	return block.ReceivedPriority(p, received, s.c.trustPriority)
}

// admit returns the Done to call after the handler, the priority the call
// was admitted at (for propagation), the response metadata to set, and the
// status error of a denial.
func (s *server) admit(ctx context.Context, method string) (spillway.Done, spillway.Priority, metadata.MD, *spillway.Usage, error) {
	req := admission.NewRequest()
	req.Endpoint, req.Priority = method, s.priority(ctx, method)
	if s.c.cost != nil {
		req.Cost = s.c.cost(ctx, method)
	}
	if s.c.meter {
		req.Usage = new(spillway.Usage)
	}
	if s.c.estimateMD != "" {
		if v := metadata.ValueFromIncomingContext(ctx, s.c.estimateMD); len(v) > 0 {
			n, err := admission.ParseCost(v[0])
			if err == nil && len(v) > 1 {
				err = errors.New("more than one value")
			}
			if err != nil {
				return spillway.Noop, req.Priority, nil, nil, status.Errorf(codes.InvalidArgument, "grpcx: metadata %s: %v", s.c.estimateMD, err)
			}
			req.Cost = n
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ip, ok := peerIP(p.Addr); ok {
			if len(s.c.trusted) > 0 {
				ip = clientIP(ip, metadata.ValueFromIncomingContext(ctx, ForwardedForKey), s.c.trusted)
			}
			req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimIP, Value: ip.String()})
		}
	}
	user := ""
	if s.c.user != nil {
		user = s.c.user(ctx)
	}
	if user == "" && s.c.userMD != "" {
		if v := metadata.ValueFromIncomingContext(ctx, s.c.userMD); len(v) > 0 {
			user = v[0]
		}
	}
	if user != "" {
		req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimUser, Value: user})
	}
	if s.c.apiKeyMD != "" {
		if v := metadata.ValueFromIncomingContext(ctx, s.c.apiKeyMD); len(v) > 0 && v[0] != "" {
			req.Dims = append(req.Dims, spillway.Dimension{Name: spillway.DimAPIKey, Value: v[0]})
		}
	}
	res := admission.Admit(ctx, s.l, req, s.c.failMode)
	if res.Err != nil && s.c.onError != nil {
		s.c.onError(ctx, method, res.Err)
	}
	hdr := s.headers(res.Decision)
	if !res.Decision.Allowed {
		return spillway.Noop, req.Priority, hdr, nil, DenialStatus(res.Decision).Err()
	}
	return res.Done, req.Priority, hdr, req.Usage, nil
}

func (s *server) headers(d spillway.Decision) metadata.MD {
	v := admission.RateValues(d, s.c.now())
	if v == nil {
		return nil
	}
	return metadata.MD{
		HeaderLimit:     v[0:1:1],
		HeaderRemaining: v[1:2:2],
		HeaderReset:     v[2:3:3],
	}
}

func peerIP(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case nil:
		return netip.Addr{}, false
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// code returns the gRPC code of a denial: InvalidArgument for a malformed
// request, Unavailable for shedding, the ceiling and a failed-closed store
// (Reason.IsShed), ResourceExhausted for rate and concurrency limits. It
// returns OK for an allowed decision.
func code(d spillway.Decision) codes.Code {
	switch admission.ClassOf(d) {
	case admission.Allowed:
		return codes.OK
	case admission.Invalid:
		return codes.InvalidArgument
	case admission.Unavailable:
		return codes.Unavailable
	}
	return codes.ResourceExhausted
}

// DenialStatus builds the status of a denial: its code (InvalidArgument for
// a malformed request, Unavailable for shedding, the ceiling and a
// failed-closed store (Reason.IsShed), ResourceExhausted for rate and
// concurrency limits), a message, and the
// details errdetails.ErrorInfo (domain "spillway", reason the upper-case
// spillway.Reason, metadata limiter), errdetails.QuotaFailure (one violation:
// subject the limiter, description the reason) and, unless retrying can
// never succeed, errdetails.RetryInfo with d.RetryAfter (at least 1s when
// the decision gives none).
func DenialStatus(d spillway.Decision) *status.Status {
	c := code(d)
	st := status.New(c, fmt.Sprintf("spillway: %s by %q", d.Reason, d.Limiter))
	details := []protoadapt.MessageV1{
		&errdetails.ErrorInfo{Reason: upper(d.Reason.String()), Domain: ErrorDomain, Metadata: map[string]string{"limiter": d.Limiter}},
	}
	if c != codes.InvalidArgument {
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: d.Limiter, Description: d.Reason.String(),
		}}})
	}
	if delay, ok := admission.RetryAfter(d); ok {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		return withDetails
	}
	return st
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// outcome maps a handler's error to what adaptive limiters learn: overload
// and server faults are Dropped; a cancelled call, or one whose client's
// deadline (grpc-timeout, the incoming context's) passed, is Ignored: the
// client gave up, which says how long it would wait, not how loaded the
// server is.
func outcome(ctx context.Context, err error) spillway.Outcome {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return spillway.Ignored
	}
	switch status.Code(err) {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.Aborted, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return spillway.Success
	case codes.Canceled:
		return spillway.Ignored
	}
	return spillway.Dropped // Unknown, DeadlineExceeded, ResourceExhausted, Internal, Unavailable, DataLoss
}

// ReasonUsageSpent is the ErrorInfo reason of UsageStatus when err carries
// no decision.
const ReasonUsageSpent = "USAGE_SPENT"

// UsageStatus is what a handler returns when spillway.ReportUsage refused
// a step (err): the call's limit is spent and the work stops. When err
// carries the refusing block's decision (a Decision() method), it is
// DenialStatus of that decision; otherwise ResourceExhausted with the
// ErrorInfo (domain "spillway", reason ReasonUsageSpent) and err's text.
// A nil err gives nil.
func UsageStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	var dd interface{ Decision() spillway.Decision }
	if errors.As(err, &dd) {
		if d := dd.Decision(); !d.Allowed {
			return DenialStatus(d)
		}
	}
	st := status.New(codes.ResourceExhausted, "spillway: usage refused: "+err.Error())
	if withDetails, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonUsageSpent, Domain: ErrorDomain}); derr == nil {
		return withDetails
	}
	return st
}
