package redistest

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// CommandStat is one command's line of INFO commandstats.
type CommandStat struct {
	Calls float64 // calls since the last CONFIG RESETSTAT
	Usec  float64 // µs spent in them (a script's commands are inside its own usec too)
}

// CommandStats parses the text of INFO commandstats: each command, named
// as Redis names it ("set", "evalsha", "config|resetstat"), with its
// stats.
func CommandStats(info string) map[string]CommandStat {
	out := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st CommandStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseFloat(v, 64)
			case "usec":
				st.Usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// ReadCommandStats reads INFO commandstats from c and parses it; an error
// fails the test.
func ReadCommandStats(t TB, c redis.Cmdable) map[string]CommandStat {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	return CommandStats(info)
}

// ServerCPU reads the server's own CPU time so far (used_cpu_sys +
// used_cpu_user of INFO cpu) from c; an error fails the test.
func ServerCPU(t TB, c redis.Cmdable) time.Duration {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatalf("INFO cpu: %v", err)
	}
	var secs float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("INFO cpu: %s: %v", line, err)
			}
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second))
}
