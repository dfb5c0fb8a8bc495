package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// TestRun runs the demo (simulated clock, so its output is the same on
// every run) and checks decisions that show each algorithm's character.
func TestRun(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() { b, _ := io.ReadAll(r); out <- string(b) }()
	runErr := run()
	os.Stdout = stdout
	w.Close()
	got := <-out
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, got)
	}
	for _, want := range []string{
		// token bucket: burst 3, then one every 200ms
		"t=500ms  DENIED  remaining=0 reset_after=500ms  retry_after=100ms",
		// fixed window: denied until the window ends
		"t=300ms  DENIED  remaining=0 reset_after=700ms  retry_after=700ms",
		// sliding window counter: the previous window still weighs
		"t=300ms  DENIED  remaining=0 reset_after=1.367s retry_after=701ms",
		"== cost 11 against token_bucket 10/1s: allowed=false reason=cost_exceeds_limit retry_after=0s",
		"== invalid policy: ratelimit: invalid policy: limit 0 must be positive",
		"ip=192.0.2.1  429  limiter=per-ip:ip remaining=0 retry_after=500ms",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("output lacks %q\n--- output:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "DENIED"); n != 24 {
		t.Errorf("%d denials, want 24 (3 token bucket + 7 each for the three windows)", n)
	}
}
