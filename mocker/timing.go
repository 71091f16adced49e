package mocker

import (
	"fmt"
	"time"
)

// Timing is the cost model of one engine step, in simulated time. A step
// that schedules anything costs
//
//	StepOverhead
//	+ Σ over prefill chunks (n new tokens after c tokens already in KV):
//	    n·PrefillPerToken + PrefillAttentionPer1K · n·(c + (n+1)/2) / 1024
//	+ Σ over decoding sequences (context c):
//	    DecodePerSequence + DecodeAttentionPer1K · (c+1) / 1024
//	+ HostLoadPerBlock · blocks loaded back from the host pool
//
// Prefill is linear in the tokens computed (the MLP and projection work)
// plus an attention term that grows with how far into the sequence each new
// token sits, so a prompt's prefill time grows with its uncached tokens,
// and cached tokens are free except for the attention that new tokens pay
// over them. A decode step grows with the batch (per-sequence work) and
// with the total context it reads. Engine.Config.Speedup divides all of it
// when the server maps simulated time onto the wall clock.
type Timing struct {
	StepOverhead          time.Duration // per non-empty step: scheduling, sampling, launches
	PrefillPerToken       time.Duration // per token computed in a prefill chunk
	PrefillAttentionPer1K time.Duration // per prefill token, per 1024 tokens it attends to
	DecodePerSequence     time.Duration // per sequence in the decode batch
	DecodeAttentionPer1K  time.Duration // per 1024 context tokens read by decoding sequences
	// HostLoadPerBlock is the cost of loading one block back from the
	// host pool (Config.HostBlocks) instead of computing it.
	HostLoadPerBlock time.Duration
	// TransferPerBlock is the cost of pulling one block's KV from a
	// remote prefill engine (disaggregated serving, disagg.go), paid by
	// the decode engine before it schedules the request.
	TransferPerBlock time.Duration
	// EncodePerItem is the cost of encoding one multimodal item (an
	// image through the vision encoder), paid by an encode engine for an
	// item its encoder cache lacks, and by any other engine for an item
	// not handed over through the encoder-cache store (encode.go).
	EncodePerItem time.Duration
}

// DefaultTiming is roughly an 8B-parameter model on one H100-class GPU:
// about 20k prefill tokens/s on short prompts, slower on long ones, and a
// 64-sequence decode step of 10–15 ms. It is not calibrated against a real
// engine; it only has the right shape.
//
// HostLoadPerBlock is a copy over PCIe: such a model keeps 128 KiB of
// keys and values per token (32 layers × 8 KV heads × 128 dims × K and V
// × 2 bytes), 2 MiB per block of radix.DefaultBlockSize (16) tokens, and
// a PCIe 5.0 x16 link moves about 50 GB/s, so 40 µs a block: twenty
// times less than prefilling its 16 tokens (800 µs at PrefillPerToken),
// which is why engines offload at all.
var DefaultTiming = Timing{
	StepOverhead:          3 * time.Millisecond,
	PrefillPerToken:       50 * time.Microsecond,
	PrefillAttentionPer1K: 750 * time.Nanosecond,
	DecodePerSequence:     120 * time.Microsecond,
	DecodeAttentionPer1K:  4 * time.Microsecond,
	HostLoadPerBlock:      40 * time.Microsecond,
	TransferPerBlock:      80 * time.Microsecond,
	EncodePerItem:         20 * time.Millisecond, // a ViT over one image of a few hundred patches
}

func (t Timing) validate() error {
	for _, d := range [...]time.Duration{t.StepOverhead, t.PrefillPerToken, t.PrefillAttentionPer1K, t.DecodePerSequence, t.DecodeAttentionPer1K, t.HostLoadPerBlock, t.TransferPerBlock, t.EncodePerItem} {
		if d < 0 {
			return fmt.Errorf("cannot use timing %+v: durations must not be negative", t)
		}
	}
	return nil
}

// Prefill is the cost of computing n tokens that follow c tokens already in
// the KV cache.
func (t Timing) Prefill(c, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	// Token k (0-based within the chunk) attends to c+k+1 tokens; the sum
	// over the chunk is n·c + n(n+1)/2.
	attended := int64(n)*int64(c) + int64(n)*int64(n+1)/2
	return time.Duration(n)*t.PrefillPerToken + time.Duration(attended*int64(t.PrefillAttentionPer1K)/1024)
}

// Decode is the cost one sequence with c tokens of context adds to a decode
// step.
func (t Timing) Decode(c int) time.Duration {
	return t.DecodePerSequence + time.Duration(int64(c+1)*int64(t.DecodeAttentionPer1K)/1024)
}
