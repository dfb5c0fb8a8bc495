package rls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// xDS config (CONFIG_TYPE=GRPC_XDS_SOTW): the server subscribes to
// RateLimitConfig resources over the aggregated discovery service of a
// management server (state of the world), as the reference does, and
// loads every response as a hot reload: a set that loads replaces the
// config and is ACKed; one that does not keeps the last good config and
// is NACKed with the error. A lost stream keeps the config and reconnects
// after a backoff.

// rateLimitConfigType is the xDS type of the reference's config resource.
const rateLimitConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

type xdsClient struct {
	set     Settings
	svc     *Service
	log     *slog.Logger
	opts    LoadOptions
	onLoad  func(*Config, error)
	version string // the last version ACKed
}

// xdsNode is the node the client presents: CONFIG_GRPC_XDS_NODE_ID and
// the key=value pairs of CONFIG_GRPC_XDS_NODE_METADATA.
func xdsNode(s Settings) *corev3.Node {
	md := map[string]*structpb.Value{}
	for _, kv := range strings.Split(s.XdsNodeMetadata, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			md[k] = structpb.NewStringValue(v)
		}
	}
	return &corev3.Node{Id: s.XdsNodeID, Metadata: &structpb.Struct{Fields: md}}
}

// xdsDialOptions: TLS when CONFIG_GRPC_XDS_SERVER_USE_TLS (a client
// certificate, the CA, the name to verify), the message size, the dial
// backoff.
func xdsDialOptions(s Settings) ([]grpc.DialOption, error) {
	creds := insecure.NewCredentials()
	if s.XdsServerUseTLS {
		c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.XdsServerTLSSAN}
		if (s.XdsClientTLSCert == "") != (s.XdsClientTLSKey == "") {
			return nil, errors.New("rls: CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
		}
		if s.XdsClientTLSCert != "" {
			pair, err := tls.LoadX509KeyPair(s.XdsClientTLSCert, s.XdsClientTLSKey)
			if err != nil {
				return nil, fmt.Errorf("rls: CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY: %w", err)
			}
			c.Certificates = []tls.Certificate{pair}
		}
		if s.XdsServerTLSCACert != "" {
			pool, err := caPool("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", s.XdsServerTLSCACert)
			if err != nil {
				return nil, err
			}
			c.RootCAs = pool
		}
		creds = credentials.NewTLS(c)
	}
	bc := backoff.DefaultConfig
	bc.BaseDelay = s.XdsConnectRetryInterval
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 5 * time.Second})}
	if s.XdsMaxMsgSize > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.XdsMaxMsgSize)))
	}
	return opts, nil
}

// run follows the management server until ctx ends.
func (x *xdsClient) run(ctx context.Context) {
	opts, err := xdsDialOptions(x.set)
	if err != nil { // checked at start; unreachable
		x.log.Error("rls: xDS", "err", err)
		return
	}
	attempt := 0
	for ctx.Err() == nil {
		got, err := x.stream(ctx, opts)
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt = 0
		}
		d := x.backoff(attempt)
		attempt++
		x.log.Warn("rls: xDS stream to the management server ended; the last config stays", "server", x.set.XdsServerURL, "err", err, "retry_in", d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// backoff is XDS_CLIENT_BACKOFF_*: the initial interval doubled per
// failed attempt up to the maximum, spread by the random factor when
// jitter is on.
func (x *xdsClient) backoff(attempt int) time.Duration {
	d := x.set.XdsBackoffInitial
	for range attempt {
		if d >= x.set.XdsBackoffMax {
			break
		}
		d *= 2
	}
	d = min(d, x.set.XdsBackoffMax)
	if x.set.XdsBackoffJitter && x.set.XdsBackoffRandomFactor > 0 {
		f := x.set.XdsBackoffRandomFactor
		d = time.Duration(float64(d) * (1 - f + 2*f*rand.Float64()))
	}
	return max(d, time.Millisecond)
}

// stream runs one ADS stream; got says a response arrived on it.
func (x *xdsClient) stream(ctx context.Context, opts []grpc.DialOption) (got bool, err error) {
	conn, err := grpc.NewClient(x.set.XdsServerURL, opts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(x.set.XdsHeaders) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(x.set.XdsHeaders))
	}
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := xdsNode(x.set)
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: rateLimitConfigType, VersionInfo: x.version}); err != nil {
		return false, err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		if resp.GetTypeUrl() != rateLimitConfigType {
			continue
		}
		req := &discoverypb.DiscoveryRequest{Node: node, TypeUrl: rateLimitConfigType, ResponseNonce: resp.GetNonce()}
		if err := x.apply(resp); err != nil {
			req.VersionInfo = x.version
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		} else {
			x.version = resp.GetVersionInfo()
			req.VersionInfo = x.version
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// apply loads a response's resources into the service.
func (x *xdsClient) apply(resp *discoverypb.DiscoveryResponse) error {
	files := make([]File, 0, len(resp.GetResources()))
	var err error
	for _, r := range resp.GetResources() {
		var c confpb.RateLimitConfig
		if err = r.UnmarshalTo(&c); err != nil {
			err = fmt.Errorf("rls: xDS resource of type %s: %w", r.GetTypeUrl(), err)
			break
		}
		var b []byte
		if b, err = yaml.Marshal(xdsYAML(&c)); err != nil {
			break
		}
		files = append(files, File{Name: "xds:" + c.GetName(), Content: b})
	}
	var c *Config
	if err == nil {
		c, err = Load(files, x.opts)
	}
	if err != nil {
		x.svc.stats.ConfigLoadError.Add(1)
		x.log.Error("rls: xDS config not loaded (NACKed); the last good config stays", "version", resp.GetVersionInfo(), "err", err)
	} else {
		x.svc.SetConfig(c)
		x.svc.stats.ConfigLoadSuccess.Add(1)
		x.log.Info("rls: xDS config loaded", "version", resp.GetVersionInfo(), "resources", len(files), "domains", strings.Join(c.domainNames(), ","))
	}
	if x.onLoad != nil {
		x.onLoad(c, err)
	}
	return err
}

// xdsYAML is a resource in the config file format, loaded as a file is.
func xdsYAML(c *confpb.RateLimitConfig) map[string]any {
	return map[string]any{"domain": c.GetDomain(), "descriptors": xdsDescriptors(c.GetDescriptors())}
}

func xdsDescriptors(ds []*confpb.RateLimitDescriptor) []any {
	out := make([]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"key": d.GetKey()}
		if d.GetValue() != "" {
			m["value"] = d.GetValue()
		}
		if d.GetShadowMode() {
			m["shadow_mode"] = true
		}
		if d.GetDetailedMetric() {
			m["detailed_metric"] = true
		}
		if p := d.GetRateLimit(); p != nil {
			rl := map[string]any{"requests_per_unit": p.GetRequestsPerUnit()}
			if p.GetUnit() != confpb.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
				rl["unit"] = p.GetUnit().String()
			}
			if p.GetUnlimited() {
				rl["unlimited"] = true
			}
			if p.GetName() != "" {
				rl["name"] = p.GetName()
			}
			if len(p.GetReplaces()) > 0 {
				rs := make([]any, len(p.GetReplaces()))
				for i, r := range p.GetReplaces() {
					rs[i] = map[string]any{"name": r.GetName()}
				}
				rl["replaces"] = rs
			}
			m["rate_limit"] = rl
		}
		if len(d.GetDescriptors()) > 0 {
			m["descriptors"] = xdsDescriptors(d.GetDescriptors())
		}
		out = append(out, m)
	}
	return out
}
