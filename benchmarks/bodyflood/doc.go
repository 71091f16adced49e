// Command bodyflood measures the router's resident memory under a flood of
// large request bodies: it sends -n concurrent POSTs of -size bytes to a
// running router, samples the router's VmRSS (/proc/PID/status) while they
// run and for -settle afterwards, and prints the baseline, the peak, the
// final figure and how the requests were answered.
//
//	go run ./benchmarks/bodyflood -url http://127.0.0.1:8000 -pid $(pgrep -n kvfast) -n 25 -size 16777000
//
// It is a measuring tool run by hand (BENCHMARKS.md has the figures and
// the command), not part of the router: one process, one goroutine per
// request and one sampling the memory; it owns nothing it does not start.
package main
