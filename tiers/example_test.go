package tiers_test

import (
	"context"
	"fmt"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

func Example() {
	cfg, err := tiers.Parse("limits.yaml", []byte(`
limits:
  - endpoint: POST /api/v1/login
    by: ip
    bucket: 10/minute
    fail: closed
  - endpoint: /api/v1/login
    by: user
    bucket: 2/minute
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	lim, err := tiers.New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), tiers.Settings{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < 3; i++ {
		r := &spillway.Request{Endpoint: "/api/v1/login", Method: "POST", Priority: spillway.Critical}
		r.Set("ip", "203.0.113.7")
		r.Set("user", "ann")
		d, done, err := lim.Admit(context.Background(), r)
		if err != nil {
			fmt.Println(err)
			return
		}
		done(spillway.Success)
		fmt.Printf("allowed=%v rule=%q remaining=%d\n", d.Allowed, d.Limiter, d.Remaining)
	}
	// Output:
	// allowed=true rule="/api/v1/login:user" remaining=1
	// allowed=true rule="/api/v1/login:user" remaining=0
	// allowed=false rule="/api/v1/login:user" remaining=0
}

func ExampleParse_error() {
	_, err := tiers.Parse("limits.yaml", []byte(`limits:
  - endpoint: /api/v1/search
    by: api_key
    bucket: 1000/minute, burst 200
  - endpoint: /api/v1/login
    by: ip
    bucket: 10/minit
`))
	fmt.Println(err)
	// Output:
	// tiers: limits.yaml:7: bucket "10/minit": unknown unit "minit"
}

func ExampleSettings_planResolver() {
	cfg, err := tiers.Parse("limits.yaml", []byte(`
plans:
  free:       {api: 1/minute}
  pro:        {api: 100/minute}
  enterprise: {api: unlimited}
default_plan: free
limits:
  - id: api
    endpoint: /api/*
    by: api_key
    plan: api
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	plans := map[string]string{"k-pro": "pro", "k-ent": "enterprise"}
	resolve := func(_ context.Context, key string) (string, error) { return plans[key], nil }
	lim, _ := tiers.New(cfg, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), tiers.Settings{PlanResolver: resolve})
	for _, key := range []string{"k-free", "k-free", "k-pro", "k-ent"} {
		r := &spillway.Request{Endpoint: "/api/items", Priority: spillway.Critical}
		r.Set("api_key", key)
		d, _, _ := lim.Admit(context.Background(), r)
		fmt.Printf("%s allowed=%v limit=%d\n", key, d.Allowed, d.Limit)
	}
	// Output:
	// k-free allowed=true limit=1
	// k-free allowed=false limit=1
	// k-pro allowed=true limit=100
	// k-ent allowed=true limit=0
}
