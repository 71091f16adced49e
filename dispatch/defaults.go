package dispatch

import "time"

// DefaultConfig is the pool configuration kvfast serve starts from; zero
// fields of a Config passed to NewPool take these values too.
func DefaultConfig() Config {
	return Config{
		Timeouts: Timeouts{
			Connect:   2 * time.Second,
			Write:     30 * time.Second,
			FirstByte: 10 * time.Minute,
			Idle:      2 * time.Minute,
		},
		Health: HealthConfig{
			Path:         "/health",
			Interval:     2 * time.Second,
			Timeout:      time.Second,
			FailAfter:    2,
			RecoverAfter: 1,
		},
		Outlier: OutlierConfig{
			Consecutive:       5,
			FailurePercent:    80,
			MinRequests:       20,
			Window:            10 * time.Second,
			BaseEjection:      30 * time.Second,
			MaxEjection:       5 * time.Minute,
			MaxEjectedPercent: 50,
		},
		MaxConnsPerEngine:   1024,
		MaxIdleConnDuration: 3 * time.Second,
		RelayBufferSize:     16 << 10,
		MaxResponseBodySize: 64 << 20,
		ResponseBudgetBytes: 256 << 20,
	}
}
