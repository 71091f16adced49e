package fastpath

import "github.com/prometheus/client_golang/prometheus"

// encodeMetrics are the collectors of the encoder stage: its time, the
// items per request, how each item was served and how often the encoder
// that had an item got it again.
type encodeMetrics struct {
	stage        prometheus.Observer
	items        prometheus.Observer
	outcomes     map[string]prometheus.Counter
	affinityHit  prometheus.Counter
	affinityMiss prometheus.Counter
}

func newEncodeMetrics(reg *prometheus.Registry) encodeMetrics {
	m := encodeMetrics{outcomes: map[string]prometheus.Counter{}}
	stage := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvfast_encode_stage_seconds",
		Help:    "Time of the encoder stage of multimodal requests, from the first item's selection until every item was encoded or given up.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms .. 65 s
	})
	items := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvfast_encode_items_per_request",
		Help:    "Multimodal items (images, audio, video) per request that went through the encoder stage.",
		Buckets: []float64{1, 2, 3, 4, 6, 8, 16, 32, 64},
	})
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_encode_items_total",
		Help: "Multimodal items by outcome: encoded (on an encoder), duplicate (the same item earlier in the request), fallback_local (every encoder attempt failed; the prefill engine encodes it), refused (an encoder answered 4xx; not retried, the prefill engine gets the item as sent).",
	}, []string{"outcome"})
	for _, o := range []string{encodeEncoded, encodeDuplicate, encodeFallback, encodeRefused} {
		m.outcomes[o] = outcomes.WithLabelValues(o)
	}
	affinity := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_encoder_affinity_total",
		Help: "Encoder choices by whether the item went to the encoder that encoded it recently (hit: its encoder cache likely has it) or was placed by load (miss).",
	}, []string{"result"})
	m.affinityHit = affinity.WithLabelValues("hit")
	m.affinityMiss = affinity.WithLabelValues("miss")
	reg.MustRegister(stage, items, outcomes, affinity)
	m.stage, m.items = stage, items
	return m
}
