// Command hungclient measures examples/httpserver -redis while its Redis
// is stopped: sequential GETs of /api/v1/search on one keep-alive
// connection for -for with Redis healthy (a control), then with the
// redis-server of -pid stopped (SIGSTOP) for as long, then SIGCONT and
// the time until /healthz says closed. See docs/fallback.md#measured.
//
//	redis-server --port 16391 --save '' &
//	go -C examples run ./httpserver -addr 127.0.0.1:18091 -redis 127.0.0.1:16391 -metrics=false &
//	go run ./fallback/internal/hungclient -url http://127.0.0.1:18091 -pid $(pgrep -f 'redis-server .*16391') -for 10s
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:8080", "server")
	pid := flag.Int("pid", 0, "redis-server pid")
	dur := flag.Duration("for", 12*time.Second, "time stopped")
	flag.Parse()
	// A 1 ms sleeper: when it wakes late, this process (and, on a loaded
	// machine, likely the server too) was not running.
	type wake struct {
		at   time.Time
		late time.Duration
	}
	var lagMu sync.Mutex
	var lags []wake
	go func() {
		for {
			b := time.Now()
			time.Sleep(time.Millisecond)
			if late := time.Since(b) - time.Millisecond; late > 500*time.Microsecond {
				lagMu.Lock()
				lags = append(lags, wake{time.Now(), late})
				lagMu.Unlock()
			}
		}
	}()
	lateDuring := func(from, to time.Time) bool {
		lagMu.Lock()
		defer lagMu.Unlock()
		for _, w := range lags {
			if !w.at.Before(from) && !w.at.After(to.Add(2*time.Millisecond)) {
				return true
			}
		}
		return false
	}
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	get := func(i int) (time.Duration, int) {
		req, _ := http.NewRequest("GET", *base+"/api/v1/search?q=x", nil)
		req.Header.Set("X-API-Key", fmt.Sprintf("k%d", i))
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode
	}
	state := func() string {
		resp, err := c.Get(*base + "/healthz")
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		var b struct {
			Redis struct{ State string } `json:"redis"`
		}
		json.NewDecoder(resp.Body).Decode(&b)
		return b.Redis.State
	}
	for i := range 200 { // warm, healthy
		get(-1 - i)
	}
	fmt.Println("healthy, state", state())
	// Control: the same requests with Redis healthy, as long.
	var healthy []time.Duration
	for i, start := 0, time.Now(); time.Since(start) < *dur; i++ {
		d, _ := get(1_000_000 + i)
		healthy = append(healthy, d)
	}
	syscall.Kill(*pid, syscall.SIGSTOP)
	stopped := time.Now()
	var lat []time.Duration
	overOpen, overOpenLate := 0, 0
	var openLat []time.Duration
	var openedAt time.Duration = -1
	codes := map[int]int{}
	slow := []string{}
	for i := 0; time.Since(stopped) < *dur; i++ {
		at := time.Since(stopped)
		reqStart := time.Now()
		d, code := get(i)
		codes[code]++
		lat = append(lat, d)
		if openedAt < 0 && i%10 == 0 && state() == "open" {
			openedAt = time.Since(stopped)
		}
		if openedAt >= 0 && at > openedAt {
			openLat = append(openLat, d)
			if d > time.Millisecond {
				overOpen++
				if lateDuring(reqStart, time.Now()) {
					overOpenLate++
				}
			}
		}
		if d > 20*time.Millisecond {
			slow = append(slow, fmt.Sprintf("#%d at %v: %v", i, at.Round(time.Millisecond), d.Round(10*time.Microsecond)))
		}
	}
	syscall.Kill(*pid, syscall.SIGCONT)
	cont := time.Now()
	for state() != "closed" {
		time.Sleep(5 * time.Millisecond)
	}
	back := time.Since(cont)
	summary := func(name string, l []time.Duration) {
		s := slices.Clone(l)
		slices.Sort(s)
		n := len(s)
		var over [4]int
		for _, d := range s {
			for j, b := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 45 * time.Millisecond} {
				if d > b {
					over[j]++
				}
			}
		}
		fmt.Printf("%s: %d requests, p50 %v, p99 %v, p99.9 %v, max %v, over 1/5/20/45 ms: %v\n", name, n,
			s[n/2].Round(time.Microsecond), s[n*99/100].Round(time.Microsecond), s[n*999/1000].Round(time.Microsecond), s[n-1].Round(time.Microsecond), over)
	}
	summary("control, Redis healthy", healthy)
	summary("stopped (all)", lat)
	summary(fmt.Sprintf("after the health opened (%v after SIGSTOP)", openedAt.Round(time.Millisecond)), openLat)
	fmt.Println("status codes", codes)
	fmt.Printf("after the health opened, over 1 ms: %d, of which %d while a 1 ms sleeper in the client woke > 0.5 ms late\n", overOpen, overOpenLate)
	fmt.Println("stopped, over 20 ms:", slow)
	fmt.Printf("SIGCONT → /healthz closed: %v\n", back.Round(time.Millisecond))
}
