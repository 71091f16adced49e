package demo

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/benchmarks/replay"
)

func TestParseEncode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		bad  bool
	}{
		{in: "2E", want: 2}, {in: " 1e ", want: 1}, {in: "3", want: 3},
		{in: "0E", bad: true}, {in: "E", bad: true}, {in: "2P", bad: true}, {in: "", bad: true},
	} {
		got, err := ParseEncode(tc.in)
		if (err != nil) != tc.bad || got.Encoders != tc.want {
			t.Errorf("ParseEncode(%q) = %v, %v", tc.in, got, err)
		}
	}
	if e := (EncodeSpec{2}); e.String() != "2E" || fmt.Sprint(e.Roles(4)) != "[encode encode both both]" {
		t.Errorf("%v: roles %v", e, e.Roles(4))
	}
}

func TestMultimodalOptions(t *testing.T) {
	mm := func(o *Options) {
		o.Workload, o.Policies, o.Encode = replay.WorkloadMultimodal, []string{PolicyKVRemote}, EncodeSpec{2}
	}
	o := DefaultOptions()
	mm(&o)
	if err := o.Validate(); err != nil {
		t.Fatalf("the encoder comparison does not validate: %v", err)
	}
	if got := DefaultPolicies(replay.WorkloadMultimodal); strings.Join(got, ",") != "kv-remote,approx" {
		t.Errorf("the multimodal workload compares %v by default", got)
	}
	if got, err := ParsePolicies("all", replay.WorkloadMultimodal); err != nil || strings.Join(got, ",") != "kv-remote,approx,round-robin,random,least-loaded" {
		t.Errorf("all multimodal policies: %v, %v", got, err)
	}
	for _, bad := range []func(*Options){
		func(o *Options) { o.Workload = replay.WorkloadChat },                           // no images
		func(o *Options) { o.Policies = []string{PolicyKVRemote, "approx"} },            // one policy
		func(o *Options) { o.Encode = EncodeSpec{8} },                                   // nobody generates
		func(o *Options) { o.Policies = []string{PolicyKVBuiltin} },                     // no tokenizer files
		func(o *Options) { o.Tokenizer = "/some/dir" },                                  // the mock's tokenizer reads images
		func(o *Options) { o.Disagg, o.Engines = DisaggSpec{2, 6}, 8 },                  // one comparison at a time
		func(o *Options) { o.Images.TurnRate = 2 },                                      // a fraction
		func(o *Options) { o.EncoderCacheItems = -1 },                                   // a size
		func(o *Options) { o.Workload, o.Encode = replay.WorkloadTokens, EncodeSpec{} }, // kv-remote tokenizes text
	} {
		o := DefaultOptions()
		mm(&o)
		bad(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%+v validates", o)
		}
	}
}

// TestEncodeRun replays a few requests with images aggregated, then with
// an encoder chosen by affinity and by load: every run completes and
// releases every booking, the aggregated engines encode the images
// themselves, the encoder's do so only on their cache misses and hand
// them over, and the table and the HTML report have the comparison's
// columns.
func TestEncodeRun(t *testing.T) {
	p, tr := tinyTrace(t)
	o := DefaultOptions()
	o.Trace, o.Workload, o.Policies, o.Engines, o.Encode = p, replay.WorkloadMultimodal, []string{PolicyKVRemote}, 3, EncodeSpec{2}
	// Every user turn carries one of two images: every request has two
	// images, and they repeat.
	o.Images = replay.ImageSynth{Images: 2, TurnRate: 1}
	o.BlockTokens, o.KVBlocks, o.EngineSpeedup, o.Concurrency = 16, 256, math.Inf(1), 2
	o.SegmentDir = t.TempDir()
	rep, err := Run(t.Context(), o, tr)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed || len(rep.Runs) != encodeRunCount || len(rep.Checks) != 0 {
		t.Fatalf("failed %v, %d runs, checks %+v", rep.Failed, len(rep.Runs), rep.Checks)
	}
	if l := rep.Images; l.Requests != 6 || l.WithImages != 6 || l.Items != 12 || l.Distinct > 2 {
		t.Errorf("images sent: %+v", l)
	}
	for i, want := range []string{"kv-remote aggregated", "kv-remote 2E affinity", "kv-remote 2E by load"} {
		run := &rep.Runs[i]
		if s := run.Result.Summary(); run.Policy != want || s.Succeeded != 6 || s.Errors != 0 || !run.Released {
			t.Errorf("run %d: %q, %d ok, %d errors, bookings released %v", i, run.Policy, s.Succeeded, s.Errors, run.Released)
		}
		e := run.EncodeTotals()
		if !e.RouterKnown {
			t.Errorf("%s: the router's metrics were not read", want)
		}
		if i == 0 {
			if e.EncoderItems != 0 || e.EncodedLocally == 0 || e.HandedOver != 0 {
				t.Errorf("%s: %+v, want every image encoded locally", want, e)
			}
			continue
		}
		// Each request's distinct images go to the encoders; the
		// generating engine finds them all handed over.
		if e.EncoderItems == 0 || e.EncoderHits+e.EncodedOnEncoders != e.EncoderItems || e.EncodedLocally != 0 ||
			e.HandedOver != e.EncoderItems || e.AffinityHits+e.AffinityMisses != e.EncoderItems || e.FallbackLocal != 0 {
			t.Errorf("%s: %+v", want, e)
		}
		if i == 2 && e.AffinityHits != 0 {
			t.Errorf("%s: %d affinity hits with affinity off", want, e.AffinityHits)
		}
	}
	// Two images on two encoders: an encoder encodes an image at most
	// once (its cache holds both), and every affinity hit finds the image
	// in the encoder's cache.
	if e := rep.Runs[1].EncodeTotals(); e.EncodedOnEncoders > 4 || e.EncoderHits < e.AffinityHits || e.AffinityHits == 0 {
		t.Errorf("affinity: %+v, want at most four encodings and a cache hit per affinity hit", e)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT p50", "TTFT p90", "encoder hit rate", "encoded locally", "router affinity hits",
		"kv-remote aggregated", "kv-remote 2E affinity", "kv-remote 2E by load", "6 of 6 requests carry images"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	var html strings.Builder
	if err := rep.WriteHTML(&html); err != nil || !strings.Contains(html.String(), "<th>encoder hit rate</th>") ||
		!strings.Contains(html.String(), "kv-remote 2E by load") {
		t.Errorf("HTML report (%v) lacks the encoder table", err)
	}
	var js strings.Builder
	if err := rep.WriteJSON(&js, ""); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Encode   string `json:"encode"`
		Policies []struct {
			Encode *EncodeTotals `json:"encode"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(js.String()), &out); err != nil || out.Encode != "2E" || len(out.Policies) != 3 || out.Policies[1].Encode == nil {
		t.Errorf("JSON report (%v): %s", err, js.String())
	}
}
