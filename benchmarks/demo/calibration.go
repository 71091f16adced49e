package demo

import (
	"slices"
	"strconv"

	"github.com/kvfast/kvfast/fastpath"
)

// prefillLoadScaleText is the cost model's prefill load scale as the
// report names it: auto, or the number that pinned it.
func (o *Options) prefillLoadScaleText() string {
	if o.AutoPrefillLoadScale {
		return "auto"
	}
	return strconv.FormatFloat(o.PrefillLoadScale, 'g', -1, 64)
}

// noteCalibration notes the prefill load scale each engine's timing fit
// reached by the end of a run (the router fits it whether or not the cost
// model uses it), so a sweep of pinned scales can be read against it.
func (o *Options) noteCalibration(policy string, v *fastpath.Snapshot) {
	var scales []float64
	var prefill, decode, context, output float64
	for _, w := range v.Workers {
		if c := w.Calibration; c != nil && c.PrefillSamples > 0 {
			scales = append(scales, c.PrefillLoadScale)
			prefill += c.PrefillSecondsPerToken
			decode += c.DecodeSecondsPerSequence
			context += c.ContextTokens
			output += c.OutputTokens
		}
	}
	if len(scales) == 0 {
		return
	}
	slices.Sort(scales)
	n := float64(len(scales))
	o.notef("%s: fitted prefill load scale %.3g (min %.3g, max %.3g over %d engines; used: %s, applying %.3g at the end): "+
		"%.1f us per prefill token, %.0f us per decoding sequence, %.0f context tokens a sequence, %.0f output tokens a request",
		policy, scales[len(scales)/2], scales[0], scales[len(scales)-1], len(scales), o.prefillLoadScaleText(), v.PrefillLoadScale,
		prefill/n*1e6, decode/n*1e6, context/n, output/n)
}
