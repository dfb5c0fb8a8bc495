package ratelimit

import (
	"fmt"
	"strings"
)

// prefixedError is an error of this package that adds context (an item's
// index, a limiter's scope) to another error and wraps it.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// wrapf returns the error "ratelimit: <context>: <err>", where context is
// format applied to args, that wraps err (errors.Is and errors.As see
// through it). When err's text already starts with "ratelimit: " (the
// sentinels ErrInvalidCost and ErrInvalidPolicy, the RedisStore's errors),
// that prefix is dropped from the middle, so the message says "ratelimit:"
// once: "ratelimit: item 0: invalid cost: cost -2 is negative", not
// "ratelimit: item 0: ratelimit: invalid cost: …".
func wrapf(err error, format string, args ...any) error {
	return &prefixedError{
		msg: "ratelimit: " + fmt.Sprintf(format, args...) + ": " + strings.TrimPrefix(err.Error(), "ratelimit: "),
		err: err,
	}
}
