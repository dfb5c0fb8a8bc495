package fallback

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// What the external tests read of a Store and a Health.

// ScalePolicy is the policy the local share enforces for share.
var ScalePolicy = scaleToShare

// NewRedisLogger is the logger SetRedisLogger installs.
var NewRedisLogger = newRedisLogger

// HealthOf returns the Health NewHealth attached to client, or nil.
func HealthOf(client redis.UniversalClient) *Health { return healthOf(client) }

// Stats is what a Store did since it was created.
type Stats = counts

// Stats returns the Store's counters.
func (s *Store) Stats() Stats { return s.counts() }

// State returns the state of the Store's breaker.
func (s *Store) State() State { return s.br.state() }

// Health returns the breaker the Store uses: Settings.Health, or its own.
func (s *Store) Health() *Health { return s.br }

// Reconcile runs a reconcile pass now.
func (s *Store) Reconcile(ctx context.Context) error {
	if s.ledger == nil {
		return nil
	}
	return s.reconcile(ctx)
}
