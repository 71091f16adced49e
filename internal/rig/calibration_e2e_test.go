package rig_test

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvfast/kvfast/fastpath"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/internal/rig/rigtest"
	"github.com/kvfast/kvfast/mocker"
)

// TestAutoPrefillLoadScaleLearnsTheEnginesTiming streams requests through
// a router with the default --prefill-load-scale auto to mock engines of a
// known timing, in waves of varying concurrency so that both the prefill
// queue and the decode batch vary, and checks that every engine's fit
// found the timing (to within what the wall clock and the router's own
// overhead allow) and that the scale the cost model applies is the one
// that timing gives, not the prior's.
func TestAutoPrefillLoadScaleLearnsTheEnginesTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("streams about 200 requests in real time")
	}
	// Decode is made dear against prefill, so that the learnt decode
	// slope (400 µs a sequence) is told apart from its prior (three
	// prefill tokens, 60 µs).
	timing := mocker.Timing{
		StepOverhead:      2 * time.Millisecond,
		PrefillPerToken:   20 * time.Microsecond,
		DecodePerSequence: 400 * time.Microsecond,
	}
	const (
		engines = 2
		output  = 24
	)
	cfg := rigtest.Config()
	if !cfg.Sched.Cost.AutoPrefillLoadScale {
		t.Fatal("kvfast serve's default is not --prefill-load-scale auto")
	}
	r := rigtest.Start(t, rig.Config{Node: cfg, Engines: engines,
		Engine: mocker.Config{Model: "mock", Timing: timing, KVBlocks: 4096}})

	rng := rand.New(rand.NewPCG(11, 12))
	stream := func(tokens []uint32) {
		body, _ := json.Marshal(map[string]any{"model": "mock", "prompt": tokens, "max_tokens": output,
			"stream": true, "ignore_eos": true})
		resp, err := http.Post(r.URL+fastpath.PathCompletions, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("status %d, %v", resp.StatusCode, err)
		}
	}
	sent := 0
	for wave := range 24 {
		// 1 to 12 requests at once, of 64 to 2,048 fresh tokens each.
		n := 1 + wave%12
		prompts := make([][]uint32, n)
		for i := range prompts {
			p := make([]uint32, 64+rng.IntN(1985))
			for j := range p {
				p[j] = rng.Uint32N(30000)
			}
			prompts[i] = p
		}
		var wg sync.WaitGroup
		for _, p := range prompts {
			wg.Go(func() { stream(p) })
		}
		wg.Wait()
		sent += n
	}
	if t.Failed() {
		t.FailNow()
	}

	var scales []float64
	for _, w := range r.Node.Snapshot().Workers {
		c := w.Calibration
		if c == nil || !c.InUse {
			t.Fatalf("worker %d: calibration %+v, want one in use", w.WorkerID, c)
		}
		if c.PrefillSamples < 20 || c.DecodeSamples != c.PrefillSamples {
			t.Fatalf("worker %d learnt from %d first tokens and %d completions of %d requests", w.WorkerID, c.PrefillSamples, c.DecodeSamples, sent)
		}
		if c.OutputTokens < output*0.8 || c.OutputTokens > output*1.2 {
			t.Errorf("worker %d: %.1f output tokens a request, want about %d", w.WorkerID, c.OutputTokens, output)
		}
		t.Logf("worker %d: %+v", w.WorkerID, *c)
		// The wall clock only adds (the router, the race detector, a busy
		// machine): the fits may run slow, not fast. A machine so busy
		// that it adds more to every first token than ten of the engine's
		// steps (its fitted overhead; about 7 steps under the race
		// detector on an idle machine) adds noise the slopes cannot be
		// judged through: a CI run beside other load fitted 1.3e-5 s a
		// prefill token at 18 steps of overhead. Its fit is not judged.
		if over := c.PrefillOverheadSeconds / timing.StepOverhead.Seconds(); over > 10 {
			t.Logf("worker %d: the machine added %.0f steps to every first token: its fit is not judged", w.WorkerID, over)
			scales = append(scales, c.PrefillLoadScale)
			continue
		}
		prefill, decode := timing.PrefillPerToken.Seconds(), timing.DecodePerSequence.Seconds()
		if c.PrefillSecondsPerToken < 0.7*prefill || c.PrefillSecondsPerToken > 2*prefill {
			t.Errorf("worker %d: %.3g s a prefill token, want about %.3g", w.WorkerID, c.PrefillSecondsPerToken, prefill)
		}
		if c.DecodeSecondsPerSequence < 0.5*decode || c.DecodeSecondsPerSequence > 2.5*decode {
			t.Errorf("worker %d: %.3g s a decoding sequence, want about %.3g", w.WorkerID, c.DecodeSecondsPerSequence, decode)
		}
		// The scale the engine's true timing gives, at the context the
		// router measured.
		want := prefill * c.ContextTokens / (output * decode)
		if c.PrefillLoadScale < want/3 || c.PrefillLoadScale > want*3 {
			t.Errorf("worker %d: scale %.3g, want about %.3g (from %+v)", w.WorkerID, c.PrefillLoadScale, want, *c)
		}
		t.Logf("worker %d: the timing's scale %.3g", w.WorkerID, want)
		scales = append(scales, c.PrefillLoadScale)
	}
	if len(scales) != engines {
		t.Fatalf("%d workers calibrated, want %d", len(scales), engines)
	}
}
