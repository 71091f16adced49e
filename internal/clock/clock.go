package clock

import "time"

var epoch = time.Now()

// Now is monotonic nanoseconds since the process started. time.Since reads
// the monotonic clock, so wall-clock steps never move it.
func Now() int64 { return int64(time.Since(epoch)) }

// Since is the time elapsed from t, a value of Now.
func Since(t int64) time.Duration { return time.Duration(Now() - t) }

// Time is the wall-clock time of t, a value of Now: for the few consumers
// that need a time.Time, such as a trace span's start, without the request
// path reading the wall clock.
func Time(t int64) time.Time { return epoch.Add(time.Duration(t)) }
