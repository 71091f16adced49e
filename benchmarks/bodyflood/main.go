package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8000", "the router")
	pid := flag.Int("pid", 0, "the router's process id")
	n := flag.Int("n", 25, "concurrent requests")
	rounds := flag.Int("rounds", 3, "floods, one after another")
	size := flag.Int("size", 16<<20-1024, "body bytes")
	model := flag.String("model", "mock", "model name in the bodies")
	settle := flag.Duration("settle", time.Minute, "how long to watch the memory after the floods")
	flag.Parse()
	if *pid == 0 {
		fmt.Fprintln(os.Stderr, "bodyflood: -pid is required")
		os.Exit(2)
	}
	prefix := `{"model":"` + *model + `","max_tokens":1,"prompt":"`
	body := []byte(prefix + strings.Repeat("a", *size-len(prefix)-2) + `"}`)
	base := rss(*pid)
	peak := base
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				peak = max(peak, rss(*pid))
			}
		}
	})
	statuses := map[int]int{}
	var mu sync.Mutex
	start := time.Now()
	for range *rounds {
		var wg sync.WaitGroup
		for range *n {
			wg.Go(func() {
				resp, err := http.Post(*url+"/v1/completions", "application/json", bytes.NewReader(body))
				code := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				statuses[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	close(stop)
	sampler.Wait()
	after := rss(*pid)
	deadline := time.Now().Add(*settle)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		after = rss(*pid)
	}
	fmt.Printf("requests %d x %d of %d bytes in %v; statuses (0: transport error) %v\n", *rounds, *n, len(body), elapsed.Round(time.Millisecond), statuses)
	fmt.Printf("VmRSS baseline %d MiB, peak %d MiB, after %v %d MiB\n", base>>20, peak>>20, *settle, after>>20)
}

// rss is the process's resident set size in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
