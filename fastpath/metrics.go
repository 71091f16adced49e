package fastpath

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/guard"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
)

// Request outcomes, the values of the status label of
// kvfast_requests_total. A fixed set keeps the label's cardinality bounded.
const (
	statusOK          = "ok"           // the engine's answer was relayed in full
	statusClientError = "client_error" // refused before routing: bad input
	statusOverloaded  = "overloaded"   // refused by admission control, or by the engine (429)
	statusUnavailable = "unavailable"  // no eligible worker, or none reachable
	statusEngineError = "engine_error" // the engine failed, or answered with a 5xx
	// statusEngineRejected: the engine refused the request (a 4xx other
	// than 429): the client's input, found out by the engine, so not
	// counted among the router's and engines' errors.
	statusEngineRejected = "engine_rejected"
	statusTimeout        = "timeout"    // an engine timeout
	statusCancelled      = "cancelled"  // the client went away
	statusRouteOnly      = "route_only" // answered a query-only request
)

var allStatuses = []string{statusOK, statusClientError, statusOverloaded, statusUnavailable,
	statusEngineError, statusEngineRejected, statusTimeout, statusCancelled, statusRouteOnly}

// Routing stages, the values of the stage label of
// kvfast_routing_duration_seconds.
const (
	stageTokenize = "tokenize"
	stageHash     = "hash"
	stageLookup   = "lookup"
	stageSchedule = "schedule"
	stageTotal    = "total"
)

// metrics holds every collector the router updates on the request path.
// Label values are resolved to child collectors once, at construction, so
// the request path only calls Inc/Observe (atomic adds, no allocation).
type metrics struct {
	reg *prometheus.Registry

	requests      map[string]prometheus.Counter
	duration      [2]prometheus.Observer // by endpoint: completions, chat_completions
	ttft          prometheus.Observer
	itl           prometheus.Observer
	isl           prometheus.Observer
	osl           prometheus.Observer
	promptBlocks  prometheus.Counter
	cachedBlocks  prometheus.Counter
	stageTokenize prometheus.Observer
	stageHash     prometheus.Observer
	stageLookup   prometheus.Observer
	stageSched    prometheus.Observer
	stageTotal    prometheus.Observer
	retries       prometheus.Counter
	// unattributed counts 5xx answers held against no engine: every
	// engine the request tried answered 5xx (dispatch.Attempts).
	unattributed prometheus.Counter
	// authRefused counts requests refused for a missing or wrong key, on
	// the API listener's endpoints and on the admin endpoints.
	authRefused, adminAuthRefused prometheus.Counter
	// multimodalExact and multimodalApprox count requests with images,
	// audio or video by how they routed (kvfast_multimodal_requests_total).
	multimodalExact, multimodalApprox prometheus.Counter
	transport                         map[string]prometheus.Counter // by reason: connections refused before a request was read
	dis                               disaggMetrics                 // disaggregated serving (disagg_metrics.go)
	enc                               encodeMetrics                 // the encoder stage (encode_metrics.go)
}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg, requests: map[string]prometheus.Counter{}}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_requests_total",
		Help: "Requests handled on the OpenAI endpoints, by endpoint and outcome.",
	}, []string{"endpoint", "status"})
	for _, st := range allStatuses {
		m.requests[st] = requests.WithLabelValues("completions", st)
	}
	// Chat shares the counters' status label set; endpoint distinguishes.
	for _, st := range allStatuses {
		m.requests["chat/"+st] = requests.WithLabelValues("chat_completions", st)
	}
	latency := prometheus.ExponentialBuckets(0.001, 2, 16) // 1 ms .. 33 s
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvfast_request_duration_seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 20), // 1 ms .. 524 s
		Help: "From the request's arrival at the router to the end of its answer (a stream's last byte relayed), for every request kvfast_requests_total counts, streamed or not.",
	}, []string{"endpoint"})
	m.duration = [2]prometheus.Observer{duration.WithLabelValues("completions"), duration.WithLabelValues("chat_completions")}
	ttft := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvfast_time_to_first_token_seconds", Buckets: latency,
		Help: "From the request's arrival at the router to the first output token relayed, for streamed requests (a plain answer's first token is its last: kvfast_request_duration_seconds).",
	})
	itl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvfast_inter_token_latency_seconds", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		Help: "Gap between consecutive streamed output items (streamed requests only).",
	})
	tokens := prometheus.ExponentialBuckets(16, 2, 14) // 16 .. 131072
	isl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvfast_input_sequence_tokens", Buckets: tokens,
		Help: "Prompt length in tokens of requests that reached an engine (text and chat prompts of models without a tokenizer: estimated at 4 bytes per token).",
	})
	osl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvfast_output_sequence_tokens", Buckets: tokens,
		Help: "Output items relayed per streamed request (one per token for engines that stream per token).",
	})
	m.promptBlocks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvfast_prompt_blocks_total",
		Help: "Full prompt blocks of routed requests. KV hit rate = rate(kvfast_cached_blocks_total) / rate(this).",
	})
	m.cachedBlocks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvfast_cached_blocks_total",
		Help: "Prompt blocks the chosen worker was estimated to hold already (its prefix overlap).",
	})
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvfast_routing_duration_seconds",
		Help:    "Time the router spends deciding, by stage: tokenize (text and chat prompts of models with a tokenizer), hash, lookup, schedule (including any admission wait), total.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20), // 1 µs .. 0.5 s
	}, []string{"stage"})
	m.stageTokenize = stages.WithLabelValues(stageTokenize)
	m.stageHash = stages.WithLabelValues(stageHash)
	m.stageLookup = stages.WithLabelValues(stageLookup)
	m.stageSched = stages.WithLabelValues(stageSchedule)
	m.stageTotal = stages.WithLabelValues(stageTotal)
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvfast_dispatch_retries_total",
		Help: "Requests re-routed to another worker before any byte reached the client, because the chosen engine refused or broke the connection, sent something that is not HTTP, answered 5xx or 429, opened its stream with an error event, or had every connection in use (--max-conns-per-engine).",
	})
	m.unattributed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvfast_dispatch_unattributed_5xx_total",
		Help: "Engine 5xx answers not counted against their engines by passive health, because no engine served the request they failed: one every engine it was tried on answered 5xx, which looks like the request's fault (a prompt that crashes the model), not the engines'.",
	})
	auth := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_auth_refused_total",
		Help: "Requests refused with 401 for a missing or wrong bearer token: scope api (--api-key-file, the OpenAI endpoints) or admin (--admin-token-file, /metrics and /admin).",
	}, []string{"scope"})
	m.authRefused, m.adminAuthRefused = auth.WithLabelValues("api"), auth.WithLabelValues("admin")
	multimodal := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_multimodal_requests_total",
		Help: "Requests with images, audio or video, by routing: exact when the engine's render endpoint named each input's hash and placeholders, " +
			"so its blocks are hashed as the engine hashes them; approximate otherwise (no renderer, /tokenize, a built-in tokenizer, " +
			"a failed render): blocks from the first input on cannot match.",
	}, []string{"routing"})
	m.multimodalExact = multimodal.WithLabelValues("exact")
	m.multimodalApprox = multimodal.WithLabelValues("approximate")
	transport := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_http_transport_errors_total",
		Help: "Connections answered before a request could be read, by reason: header_timeout (idle or slow header), header_too_large (431), body_too_large (413 from the Content-Length of an Expect: 100-continue request, before its body; other 413s are client_error in kvfast_requests_total), malformed, too_many_connections (over --max-conns-per-ip, answered 429, or over --max-conns, answered 503, and closed), tls_handshake (a client spoke TLS to the plain-HTTP listener: answered 400 and closed). Not counted in kvfast_requests_total.",
	}, []string{"reason"})
	m.transport = map[string]prometheus.Counter{}
	for _, r := range []string{transportTimeout, transportHeaderTooLarge, transportTooLarge, transportMalformed, transportConnLimit, transportTLS} {
		m.transport[r] = transport.WithLabelValues(r)
	}
	bodyBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvfast_request_body_bytes_in_flight",
		Help: "Request body bytes held in memory now, against the body budget (--body-budget-bytes).",
	}, func() float64 { return float64(s.budget.used.Load()) })
	responseBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvfast_engine_response_bytes_in_flight",
		Help: "Bytes of non-streaming engine responses held in memory now, beyond the relay buffers, against the response budget (--response-budget-bytes).",
	}, func() float64 { return float64(s.engines.ResponseBytes()) })
	m.ttft, m.itl, m.isl, m.osl = ttft, itl, isl, osl
	m.dis = newDisaggMetrics(reg, s)
	m.enc = newEncodeMetrics(reg)
	reg.MustRegister(bodyBytes, responseBytes, requests, duration, ttft, itl, isl, osl, m.promptBlocks, m.cachedBlocks, stages, m.retries, m.unattributed, auth, transport, multimodal,
		&stateCollector{s: s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	return m
}

// count counts ex's outcome, once per request, and keeps it for its trace.
func (ex *exchange) count(status string) {
	ex.outcome = status
	ex.s.metrics.count(ex.api, status)
}

func (m *metrics) count(api openai.API, status string) {
	if api == openai.APIChatCompletions {
		m.requests["chat/"+status].Inc()
		return
	}
	m.requests[status].Inc()
}

// observeFinished is the guard's Finished hook: it only fires for requests
// that reached an engine, as the lifecycle rules require.
func (m *metrics) observeFinished(ev guard.Event) {
	if ev.PromptTokens > 0 {
		m.isl.Observe(float64(ev.PromptTokens))
	}
	if ev.OutputTokens > 0 {
		m.osl.Observe(float64(ev.OutputTokens))
	}
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// stateCollector reads the router's state at scrape time, so that per-worker
// gauges cost the request path nothing.
type stateCollector struct{ s *Server }

var (
	descWorkerActiveBlocks = prometheus.NewDesc("kvfast_worker_active_blocks",
		"Distinct prompt blocks of in-flight requests booked on the worker, plus tracked output blocks.", []string{"worker", "dp_rank"}, nil)
	descWorkerPrefill = prometheus.NewDesc("kvfast_worker_prefill_tokens",
		"Prompt tokens booked on the worker still waiting for their first output token.", []string{"worker", "dp_rank"}, nil)
	descWorkerRequests = prometheus.NewDesc("kvfast_worker_active_requests",
		"Requests in flight on the worker, as booked by the router.", []string{"worker", "dp_rank"}, nil)
	descWorkerHealthy = prometheus.NewDesc("kvfast_worker_healthy",
		"1 if the worker is eligible for routing (registered, up and passing health checks); 0 also for a registered engine presumed dead (its heartbeat stopped) until it or another engine registers in its slot.", []string{"worker", "dp_rank"}, nil)
	descWorkerEjected = prometheus.NewDesc("kvfast_worker_ejected",
		"1 while passive health checking has ejected the worker for failing requests.", []string{"worker", "dp_rank"}, nil)
	descWorkerStalled = prometheus.NewDesc("kvfast_worker_stalled",
		"1 while requests have waited on the worker without an answer (a first token, or a whole answer when not streamed) for longer than the stall time (--stall-after); its in-flight prompts then earn no cache credit and its free cache memory does not count.", []string{"worker", "dp_rank"}, nil)
	descWorkerEjections = prometheus.NewDesc("kvfast_worker_ejections_total",
		"Times passive health checking ejected the worker since it joined.", []string{"worker", "dp_rank"}, nil)
	descWorkerThrottled = prometheus.NewDesc("kvfast_worker_throttled",
		"1 while the worker's engine, having answered 429, is avoided for the time its Retry-After asked (at most 30s; 1s without one): requests go to it only when no other worker can take them.", []string{"worker", "dp_rank"}, nil)
	descWorkerThrottles = prometheus.NewDesc("kvfast_worker_throttles_total",
		"429 answers of the worker's engine since it joined.", []string{"worker", "dp_rank"}, nil)
	descWorkerIndexBlocks = prometheus.NewDesc("kvfast_worker_index_blocks",
		"Blocks the index holds for the worker.", []string{"worker", "dp_rank"}, nil)
	descWorkerIndexRefused = prometheus.NewDesc("kvfast_worker_index_refused_total",
		"The worker's blocks (and their engine-hash mappings) the index refused for want of room, in the table or in the worker's share of it (--index-worker-share); counted by the router that ingests. The router then under-claims the worker's cache.", []string{"worker", "dp_rank"}, nil)
	descWorkerRingLag = prometheus.NewDesc("kvfast_feed_ring_lag_bytes",
		"Committed event-ring bytes not yet applied to the index.", []string{"worker", "dp_rank"}, nil)
	descIndexEntries  = prometheus.NewDesc("kvfast_index_entries", "Distinct blocks in the index.", nil, nil)
	descIndexCapacity = prometheus.NewDesc("kvfast_index_capacity", "Distinct blocks the index can hold.", nil, nil)
	descIndexOverflow = prometheus.NewDesc("kvfast_index_overflow_total",
		"Block stores refused: the index was full, or the block's worker held its --index-worker-share of the index (kvfast_worker_index_refused_total names it).", nil, nil)
	descIndexMapEntries = prometheus.NewDesc("kvfast_index_engine_map_entries",
		"Engine-hash mappings the index holds (each stored block's name on its worker).", nil, nil)
	descIndexMapCapacity = prometheus.NewDesc("kvfast_index_engine_map_capacity",
		"Engine-hash mappings the index can hold.", nil, nil)
	descIndexMapOverflow = prometheus.NewDesc("kvfast_index_engine_map_overflow_total",
		"Engine-hash mappings refused (their blocks were not stored): the map was full, or the worker held its --index-worker-share of it (kvfast_worker_index_refused_total names it).", nil, nil)
	descSegmentRetired = prometheus.NewDesc("kvfast_segment_retired",
		"1 when this router's segment file was recreated by another router (--recreate-segment), deleted or replaced (engines leave it), or truncated (the router detached from it): restart this router.", nil, nil)
	descFeedEvents = prometheus.NewDesc("kvfast_feed_events_total",
		"Event-feed records and blocks by outcome.", []string{"status"}, nil)
	descFeedIngesting = prometheus.NewDesc("kvfast_feed_ingesting",
		"1 while this router applies the segment's KV-event rings to the index (one router per segment does; the others stand by, route on the index it keeps, and take over if it dies).", nil, nil)
	descFeedHolderStalled = prometheus.NewDesc("kvfast_feed_ingester_stalled",
		"1 on a standby router that has seen the router holding the ingester role apply none of the events waiting in the rings for 30s: hung alive, it keeps the role and every router on the segment routes on a stale index. Stop it and a standby takes over.", nil, nil)
	descZMQConnected = prometheus.NewDesc("kvfast_zmq_connected",
		"1 while the router is subscribed to the worker's ZMQ KV-event socket.", []string{"worker", "dp_rank"}, nil)
	descZMQEvents = prometheus.NewDesc("kvfast_zmq_events_total",
		"A worker's ZMQ KV-event feed: batches and blocks by outcome.", []string{"worker", "dp_rank", "status"}, nil)
	descQueueWaiting = prometheus.NewDesc("kvfast_admission_waiting", "Requests waiting in the admission queue.", nil, nil)
	descRoutable     = prometheus.NewDesc("kvfast_routable_workers",
		"Healthy workers that can answer a request whole, as /ready counts them (encoders and prefill-only workers do not; under SGLang disaggregation, decode workers only while a prefill-capable one is healthy; not an engine refusing the router's engine key): at 0 every request is refused (503) or fails (502 engine_auth_failed).", nil, nil)
	descInFlight = prometheus.NewDesc("kvfast_requests_in_flight",
		"Bookings on workers not yet released, on every worker, including one that has since left the worker set: one per request, and one more for each of its stages on another worker (a disaggregated prefill, each image an encoder encodes).", nil, nil)
	descRefused = prometheus.NewDesc("kvfast_admission_refused_total", "Requests refused as overloaded.", nil, nil)

	descTokenizerInfo = prometheus.NewDesc("kvfast_tokenizer_info",
		"1 per model: how its text and chat prompts become token ids (mode builtin or remote: exact routing; none: approximate).",
		[]string{"model", "mode"}, nil)
	descTokenize = prometheus.NewDesc("kvfast_tokenize_total",
		"Text and chat prompts a model's tokenizer was asked for, by outcome; every outcome but ok routed approximately.",
		[]string{"model", "mode", "outcome"}, nil)
	descPrefixCacheSegments = prometheus.NewDesc("kvfast_prefix_cache_segments_total",
		"Prompt segments the built-in tokenizer's prefix cache copied (hit) or encoded (miss).", []string{"model", "result"}, nil)
	descPrefixCacheEvictions = prometheus.NewDesc("kvfast_prefix_cache_evictions_total",
		"Segments the prefix cache dropped to stay within its budget.", []string{"model"}, nil)
	descPrefixCacheBytes = prometheus.NewDesc("kvfast_prefix_cache_bytes", "Bytes the prefix cache holds.", []string{"model"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWorkerActiveBlocks, descWorkerPrefill, descWorkerRequests,
		descWorkerHealthy, descWorkerEjected, descWorkerStalled, descWorkerEjections, descWorkerThrottled, descWorkerThrottles, descWorkerIndexBlocks, descWorkerIndexRefused, descWorkerRingLag, descIndexEntries, descIndexCapacity,
		descIndexOverflow, descIndexMapEntries, descIndexMapCapacity, descIndexMapOverflow, descSegmentRetired, descFeedEvents, descFeedIngesting, descFeedHolderStalled, descZMQConnected, descZMQEvents, descQueueWaiting, descRoutable, descInFlight, descRefused,
		descTokenizerInfo, descTokenize, descPrefixCacheSegments, descPrefixCacheEvictions, descPrefixCacheBytes} {
		ch <- d
	}
	describeCalibration(ch)
}

// collectDown reports each registration presumed dead as an unhealthy
// worker: the scheduler has dropped it, and without this its series would
// vanish with it, so that an alert on kvfast_worker_healthy == 0 never
// fired for an engine that crashed. A worker listed live under the same
// labels (its engine back in another slot) speaks for itself, and a pair
// is reported once: a registry may hold it down in two slots.
func collectDown(ch chan<- prometheus.Metric, snap *Snapshot) {
	type key struct {
		id   uint64
		rank uint32
	}
	seen := make(map[key]bool, len(snap.Workers)+len(snap.Down))
	for i := range snap.Workers {
		seen[key{snap.Workers[i].WorkerID, snap.Workers[i].DPRank}] = true
	}
	for _, d := range snap.Down {
		if k := (key{d.WorkerID, d.DPRank}); !seen[k] {
			seen[k] = true
			ch <- prometheus.MustNewConstMetric(descWorkerHealthy, prometheus.GaugeValue, 0,
				strconv.FormatUint(d.WorkerID, 10), strconv.FormatUint(uint64(d.DPRank), 10))
		}
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.s.state.Snapshot()
	if fs := snap.Feed; fs != nil {
		for _, kv := range []struct {
			status string
			v      uint64
		}{
			{"records_applied", fs.Records}, {"blocks_stored", fs.StoredBlocks}, {"blocks_removed", fs.RemovedBlocks},
			{"cleared", fs.Cleared}, {"stale", fs.Stale}, {"duplicate", fs.Duplicate}, {"skipped_down", fs.SkippedDown},
			{"rejected", fs.Rejected}, {"unresolved_parent", fs.UnresolvedParent}, {"unknown_removed", fs.UnknownRemoved},
			{"block_size_mismatch", fs.BlockSizeMismatch}, {"garbage", fs.Garbage}, {"gaps", fs.Gaps}, {"resyncs", fs.Resyncs},
		} {
			ch <- prometheus.MustNewConstMetric(descFeedEvents, prometheus.CounterValue, float64(kv.v), kv.status)
		}
		ch <- prometheus.MustNewConstMetric(descFeedIngesting, prometheus.GaugeValue, boolGauge(fs.Ingesting))
		ch <- prometheus.MustNewConstMetric(descFeedHolderStalled, prometheus.GaugeValue, boolGauge(fs.IngesterStalled))
	}
	for i := range snap.Workers {
		wv := &snap.Workers[i]
		id, rank := strconv.FormatUint(wv.WorkerID, 10), strconv.FormatUint(uint64(wv.DPRank), 10)
		healthy, ejected, stalled := 0.0, 0.0, 0.0
		if wv.Healthy {
			healthy = 1
		}
		if wv.Stalled {
			stalled = 1
		}
		if wv.Ejected {
			ejected = 1
		}
		ch <- prometheus.MustNewConstMetric(descWorkerActiveBlocks, prometheus.GaugeValue, float64(wv.ActiveBlocks)+wv.OutputBlocks, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerPrefill, prometheus.GaugeValue, float64(wv.PrefillTokens), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerRequests, prometheus.GaugeValue, float64(wv.Requests), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerHealthy, prometheus.GaugeValue, healthy, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerEjected, prometheus.GaugeValue, ejected, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerStalled, prometheus.GaugeValue, stalled, id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerEjections, prometheus.CounterValue, float64(wv.Ejections), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerThrottled, prometheus.GaugeValue, boolGauge(wv.ThrottledSeconds > 0), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerThrottles, prometheus.CounterValue, float64(wv.Throttles), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerIndexBlocks, prometheus.GaugeValue, float64(wv.IndexBlocks), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerIndexRefused, prometheus.CounterValue, float64(wv.IndexRefused), id, rank)
		ch <- prometheus.MustNewConstMetric(descWorkerRingLag, prometheus.GaugeValue, float64(wv.FeedLagBytes), id, rank)
		if wv.ZMQ != nil {
			collectZMQ(ch, *wv.ZMQ, id, rank)
		}
		collectCalibration(ch, wv.Calibration, id, rank)
	}
	collectDown(ch, &snap)
	ch <- prometheus.MustNewConstMetric(descIndexEntries, prometheus.GaugeValue, float64(snap.Index.Entries))
	ch <- prometheus.MustNewConstMetric(descIndexCapacity, prometheus.GaugeValue, float64(snap.Index.Capacity))
	ch <- prometheus.MustNewConstMetric(descIndexOverflow, prometheus.CounterValue, float64(snap.Index.Overflow))
	ch <- prometheus.MustNewConstMetric(descIndexMapEntries, prometheus.GaugeValue, float64(snap.Index.MapEntries))
	ch <- prometheus.MustNewConstMetric(descIndexMapCapacity, prometheus.GaugeValue, float64(snap.Index.MapCapacity))
	ch <- prometheus.MustNewConstMetric(descIndexMapOverflow, prometheus.CounterValue, float64(snap.Index.MapOverflow))
	retired := 0.0
	if snap.Index.SegmentRetired {
		retired = 1
	}
	ch <- prometheus.MustNewConstMetric(descSegmentRetired, prometheus.GaugeValue, retired)
	ch <- prometheus.MustNewConstMetric(descQueueWaiting, prometheus.GaugeValue, float64(snap.Queue.Waiting))
	ch <- prometheus.MustNewConstMetric(descRoutable, prometheus.GaugeValue, float64(c.s.routable().Len()))
	ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(snap.Queue.Booked-min(snap.Queue.Released, snap.Queue.Booked)))
	ch <- prometheus.MustNewConstMetric(descScaleInUse, prometheus.GaugeValue, snap.PrefillLoadScale)
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(snap.Queue.Refused))
	for i := range snap.Tokenizers {
		collectTokenizer(ch, &snap.Tokenizers[i])
	}
}

func collectTokenizer(ch chan<- prometheus.Metric, st *prompt.ModelStatus) {
	ch <- prometheus.MustNewConstMetric(descTokenizerInfo, prometheus.GaugeValue, 1, st.Model, st.Mode)
	if o := st.Outcomes; o != nil {
		for _, kv := range []struct {
			outcome string
			v       uint64
		}{
			{"ok", o.OK}, {"timeout", o.Timeout}, {"engine_error", o.EngineError}, {"rejected", o.Rejected},
			{"unsupported", o.Unsupported}, {"bad_response", o.BadResponse}, {"no_engine", o.NoEngine}, {"cancelled", o.Cancelled}, {"backoff", o.Backoff}, {"busy", o.Busy},
		} {
			ch <- prometheus.MustNewConstMetric(descTokenize, prometheus.CounterValue, float64(kv.v), st.Model, st.Mode, kv.outcome)
		}
	}
	if c := st.PrefixCache; c != nil {
		ch <- prometheus.MustNewConstMetric(descPrefixCacheSegments, prometheus.CounterValue, float64(c.Hits), st.Model, "hit")
		ch <- prometheus.MustNewConstMetric(descPrefixCacheSegments, prometheus.CounterValue, float64(c.Misses), st.Model, "miss")
		ch <- prometheus.MustNewConstMetric(descPrefixCacheEvictions, prometheus.CounterValue, float64(c.Evictions), st.Model)
		ch <- prometheus.MustNewConstMetric(descPrefixCacheBytes, prometheus.GaugeValue, float64(c.Bytes), st.Model)
	}
}

func collectZMQ(ch chan<- prometheus.Metric, st feed.ZMQStats, id, rank string) {
	up := 0.0
	if st.Connected {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descZMQConnected, prometheus.GaugeValue, up, id, rank)
	for _, kv := range []struct {
		status string
		v      uint64
	}{
		{"batches_applied", st.Batches}, {"batches_replayed", st.Replayed}, {"blocks_stored", st.StoredBlocks},
		{"blocks_removed", st.RemovedBlocks}, {"cleared", st.Cleared}, {"gaps", st.Gaps}, {"replays", st.Replays},
		{"replay_failures", st.ReplayFailures}, {"replay_holes", st.ReplayHoles}, {"replay_rejected", st.ReplayRejected}, {"resyncs", st.Resyncs}, {"restarts", st.Restarts}, {"rejoins", st.Rejoins},
		{"duplicates", st.Duplicates}, {"garbage", st.Garbage}, {"disconnects", st.Disconnects},
		{"bad_events", st.BadEvents}, {"unknown_events", st.UnknownEvents}, {"skipped_lora", st.SkippedLoRA},
		{"skipped_medium", st.SkippedMedium}, {"skipped_group", st.SkippedGroup}, {"skipped_extra_keys", st.SkippedExtraKeys},
		{"block_size_mismatch", st.BlockSizeMismatch}, {"unresolved_parent", st.UnresolvedParent},
		{"unknown_removed", st.UnknownRemoved}, {"multimodal_blocks", st.MultimodalBlocks},
		{"reused_engine_hash", st.ReusedEngineHash}, {"other_rank_batches", st.OtherRankBatches},
	} {
		ch <- prometheus.MustNewConstMetric(descZMQEvents, prometheus.CounterValue, float64(kv.v), id, rank, kv.status)
	}
}

// boolGauge is a gauge's value for a condition: 1 while it holds.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
