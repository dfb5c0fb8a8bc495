package demo

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spillway-go/spillway/tiers"
)

// The pretend model of the examples' generate calls: a request "generates"
// MinTokens to MaxTokens tokens, drawn from its seed. Their limit in tokens
// per minute is a tiers rule with cost: response (each example's
// limits.yaml).
const (
	MinTokens = 50
	MaxTokens = 500
)

// Tokens returns how many tokens the request with seed generates.
func Tokens(seed uint64) int64 {
	return MinTokens + rand.New(rand.NewPCG(seed, 0x5eed)).Int64N(MaxTokens-MinTokens+1)
}

// SetRate makes the rate of rule id of cfg limit per period (burst:
// limit), for a flag that overrides the config (-tokens). tiers.New
// validates the result (an estimate above the new burst is an error).
func SetRate(cfg *tiers.Config, id string, limit int64, period time.Duration) error {
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if r.ID != id {
			continue
		}
		if r.Plan != "" {
			return fmt.Errorf("rule %q takes its rate from plan bucket %q", id, r.Plan)
		}
		r.Bucket = tiers.Bucket{Limit: limit, Period: period}
		return nil
	}
	return fmt.Errorf("the config has no rule %q", id)
}
