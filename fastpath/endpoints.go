package fastpath

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/kvfast/kvfast/feed"
	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/internal/jsonscan"
	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
)

// Paths the router serves. The route-only endpoints take the same bodies as
// their OpenAI twins and answer with the decision instead of forwarding.
const (
	PathCompletions          = "/v1/completions"
	PathChatCompletions      = "/v1/chat/completions"
	PathRouteCompletions     = "/v1/route/completions"
	PathRouteChatCompletions = "/v1/route/chat/completions"
	PathModels               = "/v1/models"
	PathMetrics              = "/metrics"
	PathHealth               = "/health"
	PathReady                = "/ready"
	PathAdminWorkers         = "/admin/workers"
)

var (
	errNotFound = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Code: "not_found",
		Message: "no such endpoint; see the README for the router's endpoints"}
	errAdminElsewhere = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Code: "not_found",
		Message: "/metrics and /admin/workers are served on the admin listener (--admin-listen), not on the API listener"}
	errAPIElsewhere = &openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Code: "not_found",
		Message: "the OpenAI endpoints are served on the API listener (--listen), not on the admin listener"}
)

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	if !s.active.enter() {
		// Shutdown has drained: what the handlers read may be freed.
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusServiceUnavailable, errShuttingDown)
		return
	}
	defer s.active.exit()
	// Checked as the handler returns, before fasthttp writes the header
	// (a stream's too): an error answer resets the response, flag and
	// all, and a request that began before Drain ends after it.
	defer s.closeIfDraining(ctx)
	if hasObsFold(ctx.Request.Header.RawHeaders()) {
		// A header fasthttp read but that a proxy may read another way:
		// refused before it is a request, like what fasthttp cannot read.
		s.metrics.transport[transportMalformed].Inc()
		lingerOnClose(ctx)
		writeError(ctx, fasthttp.StatusBadRequest, errObsFold)
		return
	}
	// ctx.Path is the normalised path (percent-decoded, dot segments and
	// repeated slashes resolved): routes match on what the path means, so
	// /v1/%2e%2e/admin/workers is /admin/workers, which the API listener
	// does not serve unless told to.
	admin := fromAdminListener(ctx)
	switch p := string(ctx.Path()); p {
	case PathCompletions, PathChatCompletions, PathRouteCompletions, PathRouteChatCompletions, PathModels:
		if admin {
			writeError(ctx, fasthttp.StatusNotFound, errAPIElsewhere)
			return
		}
		if !s.apiKeyAccepted(ctx) {
			return
		}
		switch p {
		case PathCompletions:
			s.serveOpenAI(ctx, openai.APICompletions, false)
		case PathChatCompletions:
			s.serveOpenAI(ctx, openai.APIChatCompletions, false)
		case PathRouteCompletions:
			s.serveOpenAI(ctx, openai.APICompletions, true)
		case PathRouteChatCompletions:
			s.serveOpenAI(ctx, openai.APIChatCompletions, true)
		default:
			s.serveModels(ctx)
		}
	case PathMetrics, PathAdminWorkers:
		if !admin && !s.cfg.AdminOnAPI {
			writeError(ctx, fasthttp.StatusNotFound, errAdminElsewhere)
			return
		}
		if !readOnly(ctx) {
			return
		}
		if s.adminToken != nil && !anyKeyMatches(bearer(ctx), s.adminToken) {
			ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
			writeError(ctx, fasthttp.StatusUnauthorized, errAdminUnauthorized)
			s.metrics.adminAuthRefused.Inc()
			return
		}
		if p == PathMetrics {
			s.serveMetrics(ctx)
		} else {
			s.serveAdminWorkers(ctx)
		}
	case PathHealth:
		if readOnly(ctx) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"status":"ok"}`)
		}
	case PathReady:
		if readOnly(ctx) {
			s.serveReady(ctx)
		}
	default:
		// GET /v1/models/{id}, as the OpenAI clients' models.retrieve
		// asks; an id may hold slashes (org/name).
		// ctx.Path, not p: p is only compared, so the switch makes no string.
		if id, ok := bytes.CutPrefix(ctx.Path(), modelsPrefix); ok && len(id) > 0 && !admin {
			if s.apiKeyAccepted(ctx) {
				s.serveModel(ctx, string(id))
			}
			return
		}
		writeError(ctx, fasthttp.StatusNotFound, errNotFound)
	}
}

var modelsPrefix = []byte(PathModels + "/")

// keyedPath reports whether a request to path is one the API key guards
// and carries a body: the completion endpoints.
func keyedPath(path []byte) bool {
	switch string(path) {
	case PathCompletions, PathChatCompletions, PathRouteCompletions, PathRouteChatCompletions:
		return true
	}
	return false
}

// apiKeyAccepted reports whether the request may use the OpenAI endpoints
// (any key, when --api-key sets none), and answers 401 if not.
func (s *Server) apiKeyAccepted(ctx *fasthttp.RequestCtx) bool {
	if len(s.apiKeys) > 0 && !anyKeyMatches(bearer(ctx), s.apiKeys) {
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		writeError(ctx, fasthttp.StatusUnauthorized, errUnauthorized)
		s.metrics.authRefused.Inc()
		return false
	}
	return true
}

// routeOnly answers with the decision and every eligible worker's terms,
// booking nothing. The JSON is appended by hand: this endpoint is what an
// external picker calls per request, so it allocates nothing either.
func (s *Server) routeOnly(ctx *fasthttp.RequestCtx, ex *exchange) {
	ex.sreq.QueryOnly = true
	// Rows are read only for the eligible set, which a selection that
	// scores nothing (a pinned or policy pick) leaves as it found it.
	ex.scores.Eligible, ex.scores.Busy = 0, 0
	ex.sreq.Scores = ex.scores
	ex.sreq.Stage = s.generatingStage()
	dec, err := s.sched.Select(ctx, &ex.sreq, nil)
	s.metrics.stageSched.Observe(seconds(clock.Since(ex.lastItem)))
	ex.traceRoute(&dec, err)
	if err != nil {
		ex.failSelect(ctx, err)
		return
	}
	ex.count(statusRouteOnly)
	ex.dec = dec
	ex.setDecisionHeaders(ctx) // uses ex.out as scratch: before the body is built there
	ex.out = s.appendRouteJSON(ex.out[:0], ex)
	if s.disaggregating() {
		ex.out = s.appendDisaggRoute(ctx, ex.out, ex)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(ex.out)
}

// appendRouteJSON appends the route-only answer for ex's decision (ex.dec)
// and scores to b.
func (s *Server) appendRouteJSON(b []byte, ex *exchange) []byte {
	dec := &ex.dec
	bs := uint64(s.sched.BlockSize())
	b = append(b, `{"worker_id":`...)
	b = strconv.AppendUint(b, dec.WorkerID, 10)
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendUint(b, uint64(dec.DPRank), 10)
	b = append(b, `,"endpoint":`...)
	b = jsonscan.AppendQuoted(b, dec.Endpoint)
	b = append(b, `,"overlap_blocks":`...)
	b = strconv.AppendUint(b, uint64(dec.OverlapBlocks), 10)
	b = append(b, `,"cached_tokens":`...)
	if ex.exact {
		// As the engine will count them: it computes at least the
		// prompt's last token, so a prompt cached whole, of whole blocks,
		// reuses all but its last block (vLLM's max_cache_hit_length).
		cached := uint64(dec.OverlapBlocks) * bs
		if most := uint64(max(ex.sreq.PromptTokens-1, 0)) / bs * bs; cached > most {
			cached = most
		}
		b = strconv.AppendUint(b, cached, 10)
	} else {
		b = append(b, "null"...) // overlap counted in text chunks, not tokens
	}
	b = append(b, `,"prompt_blocks":`...)
	b = strconv.AppendInt(b, int64(len(ex.hashes)), 10)
	b = append(b, `,"exact":`...)
	b = strconv.AppendBool(b, ex.exact)
	b = append(b, `,"busy":`...)
	b = strconv.AppendBool(b, dec.Busy)
	b = append(b, `,"workers":[`...)
	first := true
	for w := range ex.scores.Eligible.All() {
		info, ok := s.sched.Worker(w)
		if !ok {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		sc := ex.scores.Workers[w]
		b = append(b, `{"worker_id":`...)
		b = strconv.AppendUint(b, info.ID, 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(info.DPRank), 10)
		b = append(b, `,"overlap_blocks":`...)
		b = strconv.AppendUint(b, uint64(sc.OverlapBlocks), 10)
		// Of those, the ones credited from a lower tier (FindTieredMatches).
		b = append(b, `,"host_blocks":`...)
		b = strconv.AppendUint(b, uint64(sc.HostBlocks), 10)
		b = append(b, `,"disk_blocks":`...)
		b = strconv.AppendUint(b, uint64(sc.DiskBlocks), 10)
		b = append(b, `,"prefill_blocks":`...)
		b = strconv.AppendFloat(b, sc.PrefillBlocks, 'g', 6, 64)
		b = append(b, `,"decode_blocks":`...)
		b = strconv.AppendFloat(b, sc.DecodeBlocks, 'g', 6, 64)
		b = append(b, `,"cost":`...)
		b = strconv.AppendFloat(b, sc.Cost, 'g', 6, 64)
		b = append(b, `,"busy":`...)
		b = strconv.AppendBool(b, ex.scores.Busy.Has(w))
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

func (s *Server) serveModels(ctx *fasthttp.RequestCtx) {
	if !readOnly(ctx) {
		return
	}
	seeds := *s.seeds.Load()
	names := make([]string, 0, len(seeds))
	for n, ns := range seeds {
		if !ns.alias {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: make([]modelEntry, 0, len(names))}
	now := time.Now().Unix()
	for _, n := range names {
		out.Data = append(out.Data, entryOf(n, seeds[n], now))
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// serveModel answers GET /v1/models/{id}: the model's entry of the list,
// or 404 model_not_found.
func (s *Server) serveModel(ctx *fasthttp.RequestCtx, id string) {
	if !readOnly(ctx) {
		return
	}
	ns, ok := (*s.seeds.Load())[id]
	if !ok && s.refreshWorthy([]byte(id)) && s.refresh(s.cut) {
		// As a request naming it would: perhaps an adapter loaded since.
		ns, ok = (*s.seeds.Load())[id]
	}
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, errUnknownModel)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, entryOf(id, ns, time.Now().Unix()))
}

// readOnly answers 405 to a method other than GET or HEAD and reports
// whether the request may go on.
func readOnly(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	ctx.Response.Header.Set("Allow", "GET, HEAD")
	writeError(ctx, fasthttp.StatusMethodNotAllowed, errReadOnlyMethod)
	return false
}

// modelEntry is one model as GET /v1/models lists it: OpenAI's Model
// object, whose created vLLM also fills with the time of the answer.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Parent  string `json:"parent,omitempty"` // a LoRA adapter's base model, as vLLM lists it
}

func entryOf(name string, ns modelNamespace, created int64) modelEntry {
	m := modelEntry{ID: name, Object: "model", Created: created, OwnedBy: "kvfast"}
	if ns.lora != "" {
		m.Parent = ns.name
	}
	return m
}

// closeIfDraining makes the answer close its connection while the router
// drains (Drain), so that keep-alive clients dial again elsewhere.
func (s *Server) closeIfDraining(ctx *fasthttp.RequestCtx) {
	if s.draining.Load() {
		ctx.SetConnectionClose()
	}
}

// serveReady says whether the router can route at all: at least one
// healthy worker. Orchestrators hold traffic back until it does.
func (s *Server) serveReady(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if s.draining.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"draining","healthy_workers":` + strconv.Itoa(s.routable().Len()) + `}`)
		return
	}
	if !s.isSettled() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"starting","healthy_workers":0}`)
		return
	}
	n := s.routable().Len()
	if n == 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"not_ready","healthy_workers":0}`)
		return
	}
	ctx.SetBodyString(`{"status":"ready","healthy_workers":` + strconv.Itoa(n) + `}`)
}

var metricsHandler = func(s *Server) fasthttp.RequestHandler {
	return fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
}

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	s.metricsOnce.Do(func() { s.metricsHTTP = metricsHandler(s) })
	s.metricsHTTP(ctx)
}

// Snapshot is the router's state as operators see it: the body of
// GET /admin/workers and the source of /metrics' state gauges, so the two
// never disagree. The node builds it (State).
type Snapshot struct {
	Policy string `json:"policy"`
	// PrefillLoadScale is the prefill load scale the cost model applies
	// now; PrefillLoadScaleAuto says it is derived from the workers'
	// fitted timing (--prefill-load-scale auto: the median of their
	// calibration.prefill_load_scale, or a disaggregated pool's, as
	// docs/routing.md describes) rather than pinned.
	PrefillLoadScale     float64      `json:"prefill_load_scale"`
	PrefillLoadScaleAuto bool         `json:"prefill_load_scale_auto"`
	Workers              []WorkerView `json:"workers"`
	// Refused lists the registrations in the segment's registry that the
	// router does not route to, and why (a block size not the router's,
	// an endpoint it cannot use...): a worker missing from Workers.
	Refused []RefusedView `json:"refused_registrations,omitempty"`
	// Down lists the registrations whose engines the router presumes dead
	// (their heartbeat stopped) and that no engine has registered over
	// since: a worker missing from Workers that /metrics still reports
	// unhealthy, until its engine comes back or its slot is taken.
	Down  []RegistrationView `json:"down_registrations,omitempty"`
	Index IndexView          `json:"index"`
	Feed  *feed.Stats        `json:"feed,omitempty"` // the shm event feed, when there is a segment
	Queue QueueView          `json:"queue"`
	// Tokenizers is each model's tokenization: every model configured or
	// served, with its mode (a model with none routes its text and chat
	// prompts approximately) and its renderer's counters.
	Tokenizers []prompt.ModelStatus `json:"tokenizers"`
}

// RegistrationView is a registration in the segment's registry, in a
// Snapshot: one presumed dead (Snapshot.Down), or a refused one's
// identity.
type RegistrationView struct {
	Slot       int    `json:"slot"`
	WorkerID   uint64 `json:"worker_id"`
	DPRank     uint32 `json:"dp_rank"`
	Model      string `json:"model"`
	Endpoint   string `json:"endpoint"` // credentials redacted
	Generation uint32 `json:"generation"`
}

// RefusedView is a registration the router refused, and why, in a
// Snapshot.
type RefusedView struct {
	RegistrationView
	Reason string `json:"reason"`
}

// WorkerView is one worker in a Snapshot.
type WorkerView struct {
	Slot     int    `json:"slot"`
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
	Model    string `json:"model"`
	Endpoint string `json:"endpoint"`
	Source   string `json:"source"` // "registry" or "static"
	// Role is the worker's part in disaggregated serving: both, prefill,
	// decode or encode.
	Role    string `json:"role"`
	Healthy bool   `json:"healthy"`
	// ModelUnlisted: the engine's GET /v1/models does not list Model, so
	// the model's requests go to other workers while one can take them.
	ModelUnlisted bool `json:"model_unlisted,omitempty"`
	// KeyRefused: the engine refused the router's credentials
	// (--engine-api-key-file) when last asked for its models, so it
	// would refuse every request: it is not counted ready and is routed
	// requests only while no other worker can take them.
	KeyRefused       bool   `json:"key_refused,omitempty"`
	KVCapacityBlocks uint64 `json:"kv_capacity_blocks"`
	// Adapters is the LoRA adapters of Model the engine listed when last
	// asked, sorted: the requests naming one go to the workers listing it.
	Adapters []string `json:"adapters,omitempty"`
	// SGLangSpellings: the engine may read SGLang's spellings of an
	// adapter (lora_path, "base:adapter"), which are sent to such engines
	// alone: its model list does not say it is vLLM or the mock.
	SGLangSpellings bool `json:"sglang_adapter_spellings,omitempty"`

	// Passive health (dispatch.OutlierConfig): whether the worker is
	// ejected now, for how many more seconds, and how often it was.
	Ejected        bool    `json:"ejected"`
	EjectedSeconds float64 `json:"ejected_seconds,omitempty"`
	Ejections      uint64  `json:"ejections"`
	// The engine's 429s (dispatch.Pool.Throttled): for how many more
	// seconds its last ones asked not to be sent requests, during which
	// requests go to it only when no other worker can take them, and how
	// many it answered.
	ThrottledSeconds float64 `json:"throttled_seconds,omitempty"`
	Throttles        uint64  `json:"throttles"`
	// Stalled: requests have waited on the worker without an answer for
	// longer than the stall time; its in-flight prompts earn no credit.
	Stalled bool `json:"stalled"`

	ActiveBlocks  int64   `json:"active_blocks"`
	OutputBlocks  float64 `json:"output_blocks"`
	PrefillTokens int64   `json:"prefill_tokens"`
	Requests      int64   `json:"active_requests"`

	EngineRunning uint32 `json:"engine_running"`
	EngineWaiting uint32 `json:"engine_waiting"`
	EngineKVUsed  uint64 `json:"engine_kv_used_blocks"`
	EngineKVTotal uint64 `json:"engine_kv_total_blocks"`

	IndexBlocks uint64 `json:"index_blocks"`
	// IndexRefused counts the worker's blocks the index refused for want
	// of room: a full table, or the worker's share of it
	// (--index-worker-share). Counted by the router that ingests.
	IndexRefused uint64 `json:"index_refused_blocks"`
	FeedLagBytes uint64 `json:"feed_lag_bytes"`
	Generation   uint32 `json:"generation,omitempty"`

	ZMQ *feed.ZMQStats `json:"zmq,omitempty"` // a static worker's ZMQ event feed

	Calibration *CalibrationView `json:"calibration,omitempty"` // the worker's fitted timing (calibration.go)
}

// IndexView is the exact index's occupancy.
type IndexView struct {
	Entries     uint64 `json:"entries"`
	Capacity    uint64 `json:"capacity"`
	Overflow    uint64 `json:"overflow"`
	MapEntries  uint64 `json:"engine_map_entries"`
	MapCapacity uint64 `json:"engine_map_capacity"`
	// MapOverflow counts engine-hash mappings refused for lack of room:
	// their blocks were not stored, as nothing could remove them.
	MapOverflow uint64 `json:"engine_map_overflow"`
	// SegmentRetired says the segment file this router reads was
	// recreated by another router (--recreate-segment), deleted or
	// replaced, so that engines leave it for the file at the path, or
	// truncated, so that the router detached from it: either way this
	// router must be restarted.
	SegmentRetired bool `json:"segment_retired"`
}

// QueueView is admission control and booking.
type QueueView struct {
	Waiting  int    `json:"waiting"`
	Refused  uint64 `json:"refused"`
	Booked   uint64 `json:"booked"`
	Released uint64 `json:"released"`
}

func (s *Server) serveAdminWorkers(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusOK, s.state.Snapshot())
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, errInternal)
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
