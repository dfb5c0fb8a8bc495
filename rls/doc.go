// Package rls is Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) over spillway's stores: a
// drop-in for envoyproxy/ratelimit that reads its config files and
// environment variables, answers with the same fields and exports the same
// stats, and decides all descriptors of a request in one store call, all
// or nothing. cmd/spillway-ratelimit is the binary; docs/rls.md the
// reference of settings, config and answers.
//
// The layers, one file each: config.go parses the YAML descriptor trees
// (errors name file and line); settings.go reads the environment;
// service.go turns a request's descriptors into store items, decides them
// with one ratelimit.Store call and builds the answer and the stats;
// stats.go keeps the counters and writes the Prometheus text format;
// files.go reads and follows the config directory; server.go wires the
// Redis client, the store (a ratelimit.RedisStore behind a fallback.Store)
// and the gRPC and HTTP servers.
//
// The shortest use, in process:
//
//	import pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
//
//	cfg, err := rls.Load([]rls.File{{Name: "limits.yaml", Content: yaml}}, rls.LoadOptions{})
//	if err != nil { return err } // rls: limits.yaml:4: invalid rate limit unit 'fortnight'
//	svc := rls.NewService(store, rls.DefaultSettings(), nil)
//	svc.SetConfig(cfg)
//	pb.RegisterRateLimitServiceServer(grpcServer, svc)
//
// What is counted: each descriptor a rule matches charges its rule's
// limit one unit per call (hits_addend when Envoy sends one), in a fixed
// window of the rule's unit; all limits of a call are decided together, so
// a call denied by one limit charges none. The answer is OVER_LIMIT when
// any limit is exceeded, with the per-descriptor statuses and headers the
// reference sends.
//
// When Redis is slow or down: a call waits on Redis at most
// Settings.Budget (SPILLWAY_BUDGET, 50ms). A call Redis did not answer in
// time, and every call while the fallback's breaker is open (after a run
// of failures, until a probe succeeds), is decided at once by this server
// alone against Settings.LocalShare (SPILLWAY_LOCAL_SHARE, 20%) of each
// limit: an answer, not an error, counted as redis_error. With
// Settings.FailClosed (SPILLWAY_FAIL_MODE=closed) such a call is answered
// OVER_LIMIT instead. Errors: a malformed request or a server with no
// config is answered with the gRPC code UNKNOWN, as the reference does; a
// call whose deadline passed before it was decided is answered at once,
// undecided (Settings.LateAnswer: DEADLINE_EXCEEDED by default, for which
// Envoy applies its failure_mode_deny).
//
// Run is the whole binary (Env reads its settings): the Redis client,
// the store, the gRPC and HTTP servers, the config directory followed.
// Service, Config and Load are for serving the API in a process's own
// gRPC server; Load and ReadDir validate config files. Service and Config
// are safe for concurrent use.
package rls
