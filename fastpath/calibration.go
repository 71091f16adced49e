package fastpath

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvfast/kvfast/sched"
)

// CalibrationView is a worker's fitted engine timing (sched.Calibration)
// as /admin/workers shows it, in seconds and tokens.
type CalibrationView struct {
	PrefillOverheadSeconds   float64 `json:"prefill_overhead_seconds"`
	PrefillSecondsPerToken   float64 `json:"prefill_seconds_per_token"`
	DecodeStepSeconds        float64 `json:"decode_step_seconds"`
	DecodeSecondsPerSequence float64 `json:"decode_seconds_per_sequence"`
	ContextTokens            float64 `json:"context_tokens"`
	OutputTokens             float64 `json:"output_tokens"`
	PrefillSamples           uint64  `json:"prefill_samples"`
	DecodeSamples            uint64  `json:"decode_samples"`
	// PrefillLoadScale is the scale this worker's fit gives.
	PrefillLoadScale float64 `json:"prefill_load_scale"`
	// InUse reports whether the fits feed the cost model
	// (--prefill-load-scale auto) rather than a pinned number. Costs are
	// compared across workers, so they share one scale, derived from all
	// the workers' fits: Snapshot.PrefillLoadScale.
	InUse bool `json:"in_use"`
}

// NewCalibrationView converts a worker's calibration for the snapshot.
func NewCalibrationView(c sched.Calibration, inUse bool) *CalibrationView {
	return &CalibrationView{
		PrefillOverheadSeconds:   c.PrefillOverhead.Seconds(),
		PrefillSecondsPerToken:   c.PrefillPerToken.Seconds(),
		DecodeStepSeconds:        c.DecodeStep.Seconds(),
		DecodeSecondsPerSequence: c.DecodePerSequence.Seconds(),
		ContextTokens:            c.ContextTokens,
		OutputTokens:             c.OutputTokens,
		PrefillSamples:           c.PrefillSamples,
		DecodeSamples:            c.DecodeSamples,
		PrefillLoadScale:         c.PrefillLoadScale,
		InUse:                    inUse,
	}
}

var (
	descCalibPrefill = prometheus.NewDesc("kvfast_worker_prefill_seconds_per_token",
		"Fitted time to first token per prefill token booked on the worker (its own uncached prompt and the prefill queued ahead).", []string{"worker", "dp_rank"}, nil)
	descCalibDecode = prometheus.NewDesc("kvfast_worker_decode_seconds_per_sequence",
		"Fitted inter-token gap per sequence decoding on the worker.", []string{"worker", "dp_rank"}, nil)
	descCalibStep = prometheus.NewDesc("kvfast_worker_decode_step_seconds",
		"Fitted inter-token gap of the worker with an empty batch.", []string{"worker", "dp_rank"}, nil)
	descCalibScale = prometheus.NewDesc("kvfast_worker_prefill_load_scale",
		"Prefill load scale the worker's fitted timing gives; with --prefill-load-scale auto the cost model applies the workers' median (kvfast_prefill_load_scale).", []string{"worker", "dp_rank"}, nil)
	descScaleInUse = prometheus.NewDesc("kvfast_prefill_load_scale",
		"Prefill load scale the cost model applies: the pinned number, or with --prefill-load-scale auto the one derived from the workers' fitted timing.", nil, nil)
	descCalibSamples = prometheus.NewDesc("kvfast_worker_calibration_samples_total",
		"Requests the worker's timing fit has learnt from, by what: first_token (prefill) or completion (decode).", []string{"worker", "dp_rank", "kind"}, nil)
)

func describeCalibration(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCalibPrefill, descCalibDecode, descCalibStep, descCalibScale, descCalibSamples, descScaleInUse} {
		ch <- d
	}
}

func collectCalibration(ch chan<- prometheus.Metric, c *CalibrationView, id, rank string) {
	if c == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descCalibPrefill, prometheus.GaugeValue, c.PrefillSecondsPerToken, id, rank)
	ch <- prometheus.MustNewConstMetric(descCalibDecode, prometheus.GaugeValue, c.DecodeSecondsPerSequence, id, rank)
	ch <- prometheus.MustNewConstMetric(descCalibStep, prometheus.GaugeValue, c.DecodeStepSeconds, id, rank)
	ch <- prometheus.MustNewConstMetric(descCalibScale, prometheus.GaugeValue, c.PrefillLoadScale, id, rank)
	ch <- prometheus.MustNewConstMetric(descCalibSamples, prometheus.CounterValue, float64(c.PrefillSamples), id, rank, "first_token")
	ch <- prometheus.MustNewConstMetric(descCalibSamples, prometheus.CounterValue, float64(c.DecodeSamples), id, rank, "completion")
}
