package fastpath_test

import (
	"strings"
	"testing"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/mocker"
	"github.com/kvfast/kvfast/node"
)

// TestCalibrationIsExposed: streamed requests feed the worker's timing
// fit, which /admin/workers and /metrics both show; a non-streamed one
// has no first token to learn from and is not counted.
func TestCalibrationIsExposed(t *testing.T) {
	m := startMock(t, mocker.Config{WorkerID: 1})
	r := startE2ERouter(t, e2eConfig(node.StaticWorker{ID: 1, Endpoint: m.Addr(), Model: e2eModel}))
	for i := range 3 {
		resp := r.post(t, fastpath.PathCompletions, completionBody(e2eTokens(uint32(30+i), 40), i < 2, 4), nil)
		if resp.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.status, resp.body)
		}
	}
	waitReleased(t, r.node)

	var admin fastpath.Snapshot
	decodeJSON(t, r.get(t, fastpath.PathAdminWorkers).body, &admin)
	if len(admin.Workers) != 1 || admin.Workers[0].Calibration == nil {
		t.Fatalf("/admin/workers has no calibration: %+v", admin.Workers)
	}
	c := admin.Workers[0].Calibration
	if !c.InUse || c.PrefillSamples != 2 || c.DecodeSamples != 2 || !(c.PrefillLoadScale > 0) ||
		!(c.PrefillSecondsPerToken > 0) || !(c.DecodeSecondsPerSequence > 0) || c.OutputTokens > 32 {
		t.Errorf("calibration %+v: want in use, 2 first tokens and 2 completions learnt from, output pulled toward 4", *c)
	}
	// Too few first tokens for the worker's own scale to count: the one
	// applied is still the prior's.
	if !admin.PrefillLoadScaleAuto || !(admin.PrefillLoadScale > 0) {
		t.Errorf("/admin/workers: prefill load scale %v, auto %v; want a positive scale, auto", admin.PrefillLoadScale, admin.PrefillLoadScaleAuto)
	}
	metrics := r.metrics(t)
	for _, series := range []string{
		`kvfast_worker_prefill_load_scale{dp_rank="0",worker="1"} `,
		"\nkvfast_prefill_load_scale ",
		`kvfast_worker_prefill_seconds_per_token{dp_rank="0",worker="1"} `,
		`kvfast_worker_decode_seconds_per_sequence{dp_rank="0",worker="1"} `,
		`kvfast_worker_decode_step_seconds{dp_rank="0",worker="1"} `,
		`kvfast_worker_calibration_samples_total{dp_rank="0",kind="first_token",worker="1"} 2`,
		`kvfast_worker_calibration_samples_total{dp_rank="0",kind="completion",worker="1"} 2`,
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
