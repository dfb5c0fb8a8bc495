//go:build race

package fallback_test

func init() { raceEnabled = true }
