package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvfast/kvfast/benchmarks/replay"
	"github.com/kvfast/kvfast/internal/rig"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/workers"
)

// The multimodal workload (replay.WorkloadMultimodal) and the encoder
// comparison (Options.Encode). The engines tokenize with the mock's own
// tokenizer, the one that reads images (each becomes mocker.ImageTokens
// placeholder tokens under its mm_hash), so the router routes on exact
// token blocks by asking an engine to render each request (kv-remote),
// images' blocks included.

// MultimodalPolicies is the multimodal workload's default comparison.
var MultimodalPolicies = []string{PolicyKVRemote, "approx"}

// allMultimodalPolicies is "all" for the multimodal workload: the chat
// workload's but kv-builtin, which needs tokenizer files the mock's
// tokenizer does not have.
var allMultimodalPolicies = []string{PolicyKVRemote, "approx", "round-robin", "random", "least-loaded"}

// DefaultEncoderCacheItems is the demo's encoder cache per engine, in
// images. vLLM sizes an engine's encoder cache in embedding tokens, by
// default as many as a step's token budget (max_num_batched_tokens,
// 8192 for online serving), and a vision model's image takes a few hundred
// to a thousand of them: eight to a few dozen images. The mock's own
// default (mocker.DefaultEncoderCacheItems, 256) would hold most of the
// workload's popular images on every encoder, and then where an image is
// encoded would not matter.
const DefaultEncoderCacheItems = 32

// EncodeSpec is an encoder-disaggregated deployment: Encoders of the
// engines start as encode engines (vLLM's ec_producer), the rest
// aggregated (prefill and decode, ec_consumer). Written "2E". The zero
// value is aggregated serving only.
type EncodeSpec struct{ Encoders int }

// Enabled reports whether the spec names encoders.
func (e EncodeSpec) Enabled() bool { return e.Encoders > 0 }

func (e EncodeSpec) String() string { return strconv.Itoa(e.Encoders) + "E" }

// Roles is each of engines engines' role in rig slot order: the encoders
// first.
func (e EncodeSpec) Roles(engines int) []workers.Role {
	roles := make([]workers.Role, engines)
	for i := range min(e.Encoders, engines) {
		roles[i] = workers.RoleEncode
	}
	return roles
}

// ParseEncode reads "NE" or "N" (case-insensitive): N encode engines, at
// least one.
func ParseEncode(s string) (EncodeSpec, error) {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "E"))
	if err != nil || n < 1 {
		return EncodeSpec{}, fmt.Errorf("cannot read encoders %q: want NE, N encode engines, such as 2E", s)
	}
	return EncodeSpec{Encoders: n}, nil
}

// Names of the encoder comparison's runs, after the policy.
const (
	runAggregated  = "aggregated"
	runAffinity    = "affinity"
	runLoadOnly    = "by load"
	encodeRunCount = 3
)

// encodeRunSpecs lists the encoder comparison's replays: the policy on
// aggregated engines that encode their own images, then with Encode's
// encoders chosen by affinity, then by load alone.
func (o *Options) encodeRunSpecs() []runSpec {
	p, epd := o.Policies[0], o.Encode.Roles(o.Engines)
	return []runSpec{
		{name: p + " " + runAggregated, policy: p, roles: make([]workers.Role, o.Engines)},
		{name: fmt.Sprintf("%s %s %s", p, o.Encode, runAffinity), policy: p, roles: epd},
		{name: fmt.Sprintf("%s %s %s", p, o.Encode, runLoadOnly), policy: p, roles: epd, encodeByLoad: true},
	}
}

// validateMultimodal reports the first multimodal option the demo cannot
// run with.
func (o *Options) validateMultimodal() error {
	if o.Workload == replay.WorkloadMultimodal {
		if o.Tokenizer != "" {
			return errors.New("cannot use a tokenizer with the multimodal workload: the engines tokenize with the mock's own, which reads images")
		}
		if _, err := replay.NewImageSet(o.imageSynth()); err != nil {
			return err
		}
		if o.EncoderCacheItems < 0 {
			return fmt.Errorf("cannot give encoders a cache of %d items: want 0 or more", o.EncoderCacheItems)
		}
	}
	if !o.Encode.Enabled() {
		return nil
	}
	switch {
	case o.Workload != replay.WorkloadMultimodal:
		return errors.New("cannot compare encoders without images: use --workload multimodal")
	case o.Disagg.Enabled():
		return errors.New("cannot compare encoders and prefill/decode disaggregation at once: name one")
	case o.Encode.Encoders >= o.Engines:
		return fmt.Errorf("cannot make %d of %d engines encoders: some must generate", o.Encode.Encoders, o.Engines)
	case len(o.Policies) != 1:
		return fmt.Errorf("cannot compare encoders under %d policies: name one", len(o.Policies))
	}
	return nil
}

// imageSynth is the workload's images, keyed by the token seed.
func (o *Options) imageSynth() replay.ImageSynth {
	m := o.Images
	m.Seed = o.Seed
	return m
}

// images is the replay's image set: nil unless the workload is multimodal.
func (o *Options) images() *replay.ImageSet {
	if o.Workload != replay.WorkloadMultimodal {
		return nil
	}
	set, err := replay.NewImageSet(o.imageSynth())
	if err != nil {
		panic("BUG: demo: validated images do not compile: " + err.Error())
	}
	return set
}

// ImageLoad describes the images a replay sends.
type ImageLoad struct {
	Requests   int `json:"requests"`             // requests replayed
	WithImages int `json:"requests_with_images"` // requests with at least one
	Items      int `json:"items"`                // image parts sent
	Distinct   int `json:"distinct_images"`      // of the set
	MaxItems   int `json:"max_items"`            // in one request
}

// imageLoad counts the images the replay of tr sends.
func (o *Options) imageLoad(tr *replay.Trace) ImageLoad {
	set := o.images()
	replayed := tr.Head(o.MaxRequests)
	l := ImageLoad{Requests: replayed.Len()}
	if set == nil {
		return l
	}
	seen := map[int]bool{}
	var buf []int
	for i := range replayed.Records {
		buf = set.AppendImages(buf[:0], o.chat(tr), &replayed.Records[i])
		if len(buf) > 0 {
			l.WithImages++
		}
		l.Items += len(buf)
		l.MaxItems = max(l.MaxItems, len(buf))
		for _, k := range buf {
			seen[k] = true
		}
	}
	l.Distinct = len(seen)
	return l
}

// EncodeTotals is what one run did with images: the encode engines'
// caches, the other engines' local encoding and hand-overs, and the
// router's encoder choices.
type EncodeTotals struct {
	// EncoderItems is the items the encode engines were sent, EncoderHits
	// those their encoder caches held, EncoderHitRate the fraction.
	EncoderItems   int64   `json:"encoder_items"`
	EncoderHits    int64   `json:"encoder_cache_hits"`
	EncoderHitRate float64 `json:"encoder_cache_hit_rate"`
	// EncodedOnEncoders is the items the encoders computed (their misses),
	// EncodedLocally those the generating engines computed themselves
	// (not handed over), HandedOver those they found in the encoder-cache
	// store.
	EncodedOnEncoders int64 `json:"encoded_on_encoders"`
	EncodedLocally    int64 `json:"encoded_locally"`
	HandedOver        int64 `json:"handed_over"`
	// The router's encoder stage (kvfast_encoder_affinity_total,
	// kvfast_encode_items_total, kvfast_encode_stage_seconds).
	AffinityHits   int64         `json:"router_affinity_hits"`
	AffinityMisses int64         `json:"router_affinity_misses"`
	FallbackLocal  int64         `json:"router_fallback_local"`
	StageMean      time.Duration `json:"router_encode_stage_mean_ns"`
	// RouterKnown: the router's metrics were read.
	RouterKnown bool `json:"router_known"`
}

// EncodeTotals sums r's engines' multimodal counters by role, with the
// router's numbers.
func (r *PolicyRun) EncodeTotals() EncodeTotals {
	t := r.routerEncode
	for i, s := range r.Encode {
		if r.Roles[i] == workers.RoleEncode {
			t.EncoderItems += s.CacheHits + s.Encoded
			t.EncoderHits += s.CacheHits
			t.EncodedOnEncoders += s.Encoded
			continue
		}
		t.EncodedLocally += s.Encoded
		t.HandedOver += s.HandedOver
	}
	if t.EncoderItems > 0 {
		t.EncoderHitRate = float64(t.EncoderHits) / float64(t.EncoderItems)
	}
	return t
}

// collectEncode records the engines' multimodal counters and the
// router's encoder-stage metrics once r's replay has ended.
func (run *PolicyRun) collectEncode(ctx context.Context, r *rig.Rig) error {
	for _, e := range r.Engines {
		run.Encode = append(run.Encode, e.EncodeStats())
	}
	t, err := scrapeEncode(ctx, r.URL+"/metrics")
	if err != nil {
		return fmt.Errorf("cannot read the router's encoder metrics: %w", err)
	}
	run.routerEncode = t
	return nil
}

// scrapeEncode reads the encoder stage's counters from the router's
// Prometheus text exposition at url.
func scrapeEncode(ctx context.Context, url string) (EncodeTotals, error) {
	var t EncodeTotals
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return t, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return t, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return t, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	var stageSum, stageCount float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case `kvfast_encoder_affinity_total{result="hit"}`:
			t.AffinityHits = int64(v)
		case `kvfast_encoder_affinity_total{result="miss"}`:
			t.AffinityMisses = int64(v)
		case `kvfast_encode_items_total{outcome="fallback_local"}`:
			t.FallbackLocal = int64(v)
		case "kvfast_encode_stage_seconds_sum":
			stageSum = v
		case "kvfast_encode_stage_seconds_count":
			stageCount = v
		}
	}
	if err := sc.Err(); err != nil {
		return t, err
	}
	if stageCount > 0 {
		t.StageMean = time.Duration(stageSum / stageCount * 1e9)
	}
	t.RouterKnown = true
	return t, nil
}

// encodeRows is the encoder table's header and rows: per run, TTFT p50
// and p90 beside where the images were encoded.
func (rep *Report) encodeRows() (header []string, rows [][]string) {
	header = []string{"run", "TTFT p50", "TTFT p90", "encoder items", "encoder cache hits", "encoder hit rate",
		"encoded on encoders", "encoded locally", "handed over", "router affinity hits", "encode stage mean"}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		s, t := r.Result.Summary(), r.EncodeTotals()
		rate, affinity, stage := "-", "-", "-"
		if t.EncoderItems > 0 {
			rate = fmt.Sprintf("%.3f", t.EncoderHitRate)
		}
		if t.RouterKnown && t.AffinityHits+t.AffinityMisses > 0 {
			affinity = fmt.Sprintf("%d of %d", t.AffinityHits, t.AffinityHits+t.AffinityMisses)
			stage = millis(t.StageMean)
		}
		rows = append(rows, []string{r.Policy, millis(s.TTFTP50), millis(s.TTFTP90), strconv.FormatInt(t.EncoderItems, 10),
			strconv.FormatInt(t.EncoderHits, 10), rate, strconv.FormatInt(t.EncodedOnEncoders, 10),
			strconv.FormatInt(t.EncodedLocally, 10), strconv.FormatInt(t.HandedOver, 10), affinity, stage})
	}
	return header, rows
}

// writeEncode writes the encoder table.
func (rep *Report) writeEncode(w io.Writer) error {
	header, rows := rep.encodeRows()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// encodeHTMLTables is the encoder table for the HTML report.
func (rep *Report) encodeHTMLTables() []replay.HTMLTable {
	header, rows := rep.encodeRows()
	return []replay.HTMLTable{{Title: "Images and encoders", Note: rep.imagesLine() + " Encoder hit rate: the items " +
		"the encode engines found in their encoder caches over the items they were sent. Encoded locally: items a " +
		"generating engine encoded itself, not finding them in the encoder-cache store.", Header: header, Rows: rows}}
}

// imagesLine describes the workload's images and the deployments.
func (rep *Report) imagesLine() string {
	o, l := &rep.Options, rep.Images
	m := o.images().Synth()
	line := fmt.Sprintf("%d of %d requests carry images, %d in all (%.2f per request, at most %d), %d distinct of a set of %d "+
		"drawn with Zipf exponent %g, one user turn in %.0f carrying one; each costs the engine %s to encode (%s wall).",
		l.WithImages, l.Requests, l.Items, float64(l.Items)/math.Max(1, float64(l.Requests)), l.MaxItems, l.Distinct,
		m.Images, m.Exponent, 1/m.TurnRate, millis(o.Timing.EncodePerItem), wallMillis(o.Timing.EncodePerItem, o.EngineSpeedup))
	if o.Encode.Enabled() {
		line += fmt.Sprintf(" Aggregated: %d engines encode their own images. %s: %d encode engines with an encoder cache of %d images "+
			"and %d aggregated engines; affinity: the router sends an image to the encoder that encoded it last (remembering "+
			"as many per encoder as it caches) unless busy; by load: to the least loaded encoder.",
			o.Engines, o.Encode, o.Encode.Encoders, o.EncoderCacheItems, o.Engines-o.Encode.Encoders)
	}
	return line
}

func wallMillis(d time.Duration, speedup float64) string {
	if math.IsInf(speedup, 1) {
		return "0ms"
	}
	return millis(time.Duration(float64(d) / speedup))
}

// policyFitsWorkload reports whether policy p, tokenizing with tok, can
// run on the workload.
func policyFitsWorkload(p, tok, workload string) error {
	switch {
	case tok == "":
	case workload == replay.WorkloadTokens:
		return fmt.Errorf("cannot run %s on the token workload, which sends token ids: it tokenizes text, use the chat workload", p)
	case tok == prompt.ModeBuiltin && workload == replay.WorkloadMultimodal:
		return fmt.Errorf("cannot run %s on the multimodal workload: the engines' tokenizer (the mock's, which reads images) has no files to load; use %s", p, PolicyKVRemote)
	}
	return nil
}

// multimodalPolicies is "all" for workload, or nil if not multimodal.
func multimodalPolicies(workload string) []string {
	if workload == replay.WorkloadMultimodal {
		return slices.Clone(allMultimodalPolicies)
	}
	return nil
}
