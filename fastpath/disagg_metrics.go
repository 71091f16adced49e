package fastpath

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfast/kvfast/workers"
)

// disaggMetrics are the collectors of disaggregated serving: decisions,
// the split of time to first token, and the load each role carries.
type disaggMetrics struct {
	decisions       map[string]prometheus.Counter
	stages          map[string]prometheus.Observer
	prefillFailures prometheus.Counter
}

func newDisaggMetrics(reg *prometheus.Registry, s *Server) disaggMetrics {
	m := disaggMetrics{decisions: map[string]prometheus.Counter{}, stages: map[string]prometheus.Observer{}}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvfast_disagg_decisions_total",
		Help: "Disaggregated requests by where their prompt was prefilled: remote (a prefill worker), local_short (uncached remainder under --disagg-min-remote-tokens), " +
			"local_cached (the decode worker caches --disagg-local-cached-fraction of it), local_no_prefill_worker, fallback_local (every prefill attempt failed), " +
			"no_prefill_worker (refused: an SGLang decode engine cannot compute a prompt, and no prefill worker could take it), local_aggregated (SGLang: the chosen worker is an aggregated engine, which computes the prompt itself).",
	}, []string{"decision"})
	for _, d := range allDecisions {
		m.decisions[d] = decisions.WithLabelValues(d)
	}
	stages := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvfast_disagg_stage_seconds",
		Help: "Time to first token of disaggregated requests, by stage: prefill (the prefill request), transfer_wait (decode request sent until the decode engine answered, " +
			"which it does once it has pulled the KV), first_decode_token (decode engine answered until the first token).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms .. 65 s
	}, []string{"stage"})
	for _, st := range []string{stagePrefill, stageTransferWait, stageFirstDecode} {
		m.stages[st] = stages.WithLabelValues(st)
	}
	m.prefillFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvfast_disagg_prefill_failures_total",
		Help: "Prefill requests of disaggregated requests that failed (refused, broken, an error status); a vLLM prefill is retried on another prefill worker " +
			"or falls back to the decode worker, an SGLang one fails its request.",
	})
	reg.MustRegister(decisions, stages, m.prefillFailures, &roleLoadCollector{s: s})
	return m
}

// roleLoadCollector reports, at scrape time, the load the router booked
// on each role's workers.
type roleLoadCollector struct{ s *Server }

var (
	descRolePrefill = prometheus.NewDesc("kvfast_role_prefill_tokens",
		"Prompt tokens booked on the role's workers still awaiting their first token (a disaggregated decode stage books none).", []string{"role"}, nil)
	descRoleBlocks = prometheus.NewDesc("kvfast_role_active_blocks",
		"Prompt blocks of in-flight requests booked on the role's workers, plus tracked output blocks.", []string{"role"}, nil)
	descRoleRequests = prometheus.NewDesc("kvfast_role_active_requests",
		"Requests, or stages of disaggregated requests, in flight on the role's workers.", []string{"role"}, nil)
	descRoleWorkers = prometheus.NewDesc("kvfast_role_workers", "Workers of the role in the worker set.", []string{"role"}, nil)
)

func (c *roleLoadCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRolePrefill, descRoleBlocks, descRoleRequests, descRoleWorkers} {
		ch <- d
	}
}

func (c *roleLoadCollector) Collect(ch chan<- prometheus.Metric) {
	var prefill, blocks, requests, count [4]float64
	sc := c.s.sched
	for w := range sc.Workers().All() {
		info, ok := sc.Worker(w)
		if !ok || int(info.Role) >= len(count) {
			continue
		}
		l := sc.Load(workers.Slot(w))
		r := info.Role
		prefill[r] += float64(l.PrefillTokens)
		blocks[r] += float64(l.ActiveBlocks) + l.OutputBlocks
		requests[r] += float64(l.Requests)
		count[r]++
	}
	for _, r := range []workers.Role{workers.RoleBoth, workers.RolePrefill, workers.RoleDecode, workers.RoleEncode} {
		name := r.String()
		ch <- prometheus.MustNewConstMetric(descRolePrefill, prometheus.GaugeValue, prefill[r], name)
		ch <- prometheus.MustNewConstMetric(descRoleBlocks, prometheus.GaugeValue, blocks[r], name)
		ch <- prometheus.MustNewConstMetric(descRoleRequests, prometheus.GaugeValue, requests[r], name)
		ch <- prometheus.MustNewConstMetric(descRoleWorkers, prometheus.GaugeValue, count[r], name)
	}
}
