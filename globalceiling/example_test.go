package globalceiling_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/globalceiling"
)

// A fleet-wide ceiling of 5000 statements per second in front of a
// database; while Redis cannot answer the ceiling decides at this server's
// share by itself. (Not run: it needs a Redis; see examples/dbpool for a
// runnable program.)
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	ceil, err := globalceiling.New(rdb, "orders-db", 5000, time.Second, globalceiling.Settings{Mode: globalceiling.Cached})
	if err != nil {
		panic(err)
	}
	defer ceil.Close()
	guard, _ := globalceiling.NewGuard(ceil)

	db, _ := sql.Open("postgres", "…")
	gdb := &globalceiling.DB{DB: db, Guard: guard}
	_, err = gdb.ExecContext(context.Background(), "UPDATE orders SET state = $1 WHERE id = $2", "paid", 42)
	var rej *globalceiling.RejectedError
	if errors.As(err, &rej) {
		fmt.Println("503, Retry-After:", rej.Decision.RetryAfter)
	}
}

// full is a stand-in limiter that always denies.
type full struct{}

func (full) Admit(context.Context, *spillway.Request) (spillway.Decision, spillway.Done, error) {
	return spillway.Decision{Reason: spillway.ReasonCeiling, Limiter: "orders-db", RetryAfter: 300 * time.Millisecond}, spillway.Noop, nil
}

// A Guard accepts any spillway.Limiter: here a stand-in that always
// denies, to show the rejection a caller matches.
func ExampleGuard_Do() {
	guard, _ := globalceiling.NewGuard(full{})
	err := guard.Do(context.Background(), nil, func(context.Context) error { return nil })
	fmt.Println(errors.Is(err, globalceiling.ErrCeilingReached))
	fmt.Println(err)
	// Output:
	// true
	// globalceiling: "orders-db" denied (ceiling); retry after 300ms
}
