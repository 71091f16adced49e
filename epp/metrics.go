package epp

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the picker's Prometheus series, in a registry of its own
// (GET /metrics on the metrics listener).
type metrics struct {
	reg             *prometheus.Registry
	streams         prometheus.Gauge
	decisions       prometheus.Counter
	decisionSeconds prometheus.Histogram
	promptBlocks    prometheus.Counter
	cachedBlocks    prometheus.Counter
	refusals        *prometheus.CounterVec
	cancelled       prometheus.Counter
	servedElsewhere prometheus.Counter
	nodeQueryFails  prometheus.Counter
	// responseTimeouts: bookings the watchdog released.
	responseTimeouts prometheus.Counter
}

func newMetrics(p *Picker) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvfast_epp_streams",
			Help: "ext_proc streams open now (HTTP requests the gateway is processing)."}),
		decisions: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_decisions_total",
			Help: "Requests the picker chose an endpoint for."}),
		decisionSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvfast_epp_decision_seconds",
			Help:    "Time from the request's last needed message to its decision: parse, hash, lookup, select (queueing included).",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 20)}),
		promptBlocks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_prompt_blocks_total",
			Help: "Prompt blocks of routed requests."}),
		cachedBlocks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_cached_blocks_total",
			Help: "Of those, blocks the chosen endpoint already cached, by the index: the KV hit rate is their ratio."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfast_epp_refusals_total",
			Help: "Requests the picker answered itself (ImmediateResponse), by HTTP status."}, []string{"status"}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_cancelled_total",
			Help: "Requests whose stream ended while they waited for an endpoint."}),
		servedElsewhere: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_served_elsewhere_total",
			Help: "Requests the gateway reported served by a fallback endpoint (the booking moved there)."}),
		nodeQueryFails: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_node_query_failures_total",
			Help: "Node queries (--query-nodes) that failed or timed out: the request routed as if that node cached nothing."}),
		responseTimeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfast_epp_response_timeouts_total",
			Help: "Bookings released because the gateway left the routed request waiting past --response-timeout: no response headers came, or it did not take the picker's answer."}),
	}
	// Every status the picker answers with is a series from the start, so
	// that a rate over it, and an alert on it, need no first refusal.
	for _, status := range refusalStatuses {
		m.refusals.WithLabelValues(strconv.Itoa(status))
	}
	endpoints := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvfast_epp_endpoints",
		Help: "Endpoints the picker routes to."}, func() float64 { return float64(p.Endpoints()) })
	// The runtime's and the process's series too, as the router serves
	// them: goroutines and resident memory are what show a leak.
	m.reg.MustRegister(m.streams, m.decisions, m.decisionSeconds, m.promptBlocks, m.cachedBlocks, m.refusals,
		m.cancelled, m.servedElsewhere, m.nodeQueryFails, m.responseTimeouts, endpoints, feedCollector{p},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	return m
}

// feedCollector reports every endpoint's event feed and the load booked
// on it, read when scraped, and the requests booked and waiting in all:
// what an operator needs to see that nothing is left booked.
type feedCollector struct{ p *Picker }

var (
	feedConnected = prometheus.NewDesc("kvfast_epp_feed_connected",
		"1 while the picker's ZMQ subscriber to the endpoint's KV events is connected.", []string{"endpoint"}, nil)
	feedBatches = prometheus.NewDesc("kvfast_epp_feed_batches_total",
		"KV-event batches applied from the endpoint (live or replayed).", []string{"endpoint"}, nil)
	feedResyncs = prometheus.NewDesc("kvfast_epp_feed_resyncs_total",
		"Times the endpoint's entries were cleared to recover from lost events.", []string{"endpoint"}, nil)
	endpointRequests = prometheus.NewDesc("kvfast_epp_endpoint_active_requests",
		"Requests booked on the endpoint and not yet released.", []string{"endpoint"}, nil)
	endpointHealthy = prometheus.NewDesc("kvfast_epp_endpoint_healthy",
		"1 while the endpoint is routed to; 0 once it has not answered the picker's last polls of its /v1/models (refused, timed out, 5xx), until it answers.", []string{"endpoint"}, nil)
	endpointPrefill = prometheus.NewDesc("kvfast_epp_endpoint_prefill_tokens",
		"Prompt tokens booked on the endpoint that have not had their first token yet.", []string{"endpoint"}, nil)
	inFlight = prometheus.NewDesc("kvfast_epp_requests_in_flight",
		"Requests booked on an endpoint and not yet released, on every endpoint, including one that has since left.", nil, nil)
	waiting = prometheus.NewDesc("kvfast_epp_admission_waiting",
		"Requests waiting in the admission queue for an endpoint to be free.", nil, nil)
)

func (feedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- feedConnected
	ch <- feedBatches
	ch <- feedResyncs
	ch <- endpointRequests
	ch <- endpointHealthy
	ch <- endpointPrefill
	ch <- inFlight
	ch <- waiting
}

func (c feedCollector) Collect(ch chan<- prometheus.Metric) {
	for addr, st := range c.p.FeedStats() {
		connected := 0.0
		if st.Connected {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(feedConnected, prometheus.GaugeValue, connected, addr)
		ch <- prometheus.MustNewConstMetric(feedBatches, prometheus.CounterValue, float64(st.Batches), addr)
		ch <- prometheus.MustNewConstMetric(feedResyncs, prometheus.CounterValue, float64(st.Resyncs), addr)
	}
	for addr, slot := range *c.p.slots.Load() {
		ld := c.p.sched.Load(slot)
		healthy := 0.0
		if ld.Healthy {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(endpointRequests, prometheus.GaugeValue, float64(ld.Requests), addr)
		ch <- prometheus.MustNewConstMetric(endpointHealthy, prometheus.GaugeValue, healthy, addr)
		ch <- prometheus.MustNewConstMetric(endpointPrefill, prometheus.GaugeValue, float64(ld.PrefillTokens), addr)
	}
	st := c.p.sched.Stats()
	ch <- prometheus.MustNewConstMetric(inFlight, prometheus.GaugeValue, float64(st.Booked-min(st.Released, st.Booked)))
	ch <- prometheus.MustNewConstMetric(waiting, prometheus.GaugeValue, float64(st.Waiting))
}

func (m *metrics) decided(took time.Duration, cached uint32, prompt int) {
	m.decisions.Inc()
	m.decisionSeconds.Observe(took.Seconds())
	m.promptBlocks.Add(float64(prompt))
	m.cachedBlocks.Add(float64(cached))
}

// refusalStatuses are the statuses of the picker's own answers
// (exchange.go, server.go).
var refusalStatuses = []int{http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge,
	http.StatusTooManyRequests, http.StatusServiceUnavailable}

func (m *metrics) refused(status int) { m.refusals.WithLabelValues(strconv.Itoa(status)).Inc() }

// MetricsHandler serves the picker's metrics.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
}
