package replay

import (
	"strings"
	"testing"
)

// handTrace has 4-token blocks. Expected hits, by record:
//
//	r0 [1 2 3]   10 tokens (4 4 2)   cold: 0
//	r1 [1 2 4]   12 tokens           1,2 seen: 2 blocks, 8 tokens
//	r2 [5 2 3]   12 tokens           2 and 3 follow a new prefix: 0
//	r3 [1 2 3]   10 tokens           all of r0: 3 blocks, 10 tokens
//	r4 [1 2 3 6] 13 tokens (4 4 4 1) 1,2 seen whole, of 3 only the 2 tokens
//	                                  r0 and r3 had: 2 blocks, 10 tokens
const handTrace = `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1,2,3]}
{"timestamp":1,"input_length":12,"output_length":1,"hash_ids":[1,2,4]}
{"timestamp":2,"input_length":12,"output_length":1,"hash_ids":[5,2,3]}
{"timestamp":3,"input_length":10,"output_length":1,"hash_ids":[1,2,3]}
{"timestamp":4,"input_length":13,"output_length":1,"hash_ids":[1,2,3,6]}
`

func TestHitBound(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader(handTrace), "hand", TraceOptions{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][2]int{{0, 0}, {2, 0}, {0, 0}, {3, 0}, {2, 2}} {
		if blocks, partial := tr.PrefixHits(i); blocks != want[0] || partial != want[1] {
			t.Errorf("record %d: %d prefix blocks and %d tokens, want %d and %d", i, blocks, partial, want[0], want[1])
		}
	}
	tests := []struct {
		name        string
		trace       *Trace
		blockTokens int
		want        Bound
	}{
		{"native", tr, 0, Bound{PromptTokens: 57, HitTokens: 28, TotalBlocks: 16, HitBlocks: 7}},
		{"native explicit", tr, 4, Bound{PromptTokens: 57, HitTokens: 28, TotalBlocks: 16, HitBlocks: 7}},
		// At 2 tokens per block the last blocks become ceil(2*2/4)=1 and
		// ceil(1*2/4)=1 tokens: prompts 5,6,6,5,7; hits 0,4,0,5,5.
		{"scaled down", tr, 2, Bound{PromptTokens: 29, HitTokens: 14, TotalBlocks: 16, HitBlocks: 7}},
		{"scaled up", tr, 8, Bound{PromptTokens: 20 + 24 + 24 + 20 + 26, HitTokens: 16 + 20 + 20, TotalBlocks: 16, HitBlocks: 7}},
		{"head", tr.Head(2), 0, Bound{PromptTokens: 22, HitTokens: 8, TotalBlocks: 6, HitBlocks: 2}},
		{"hand-built", &Trace{BlockSize: 4, Records: tr.Records}, 0, Bound{PromptTokens: 57, HitTokens: 28, TotalBlocks: 16, HitBlocks: 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.trace.HitBound(tt.blockTokens)
			want := tt.want
			want.Tokens = float64(want.HitTokens) / float64(want.PromptTokens)
			want.Blocks = float64(want.HitBlocks) / float64(want.TotalBlocks)
			if got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
			// The bound must agree with the prompts TokenSynth builds.
			synth := TokenSynth{TraceBlockSize: 4, BlockTokens: tt.blockTokens}
			var total int64
			for i := range tt.trace.Records {
				total += int64(len(synth.AppendPrompt(nil, &tt.trace.Records[i])))
			}
			if total != got.PromptTokens {
				t.Fatalf("synthesised %d tokens, bound counts %d", total, got.PromptTokens)
			}
		})
	}
}

func TestScaledBlockLen(t *testing.T) {
	tests := []struct{ tokens, traceBS, bt, want int }{
		{512, 512, 512, 512},
		{7, 512, 512, 7},
		{512, 512, 32, 32},
		{256, 512, 32, 16},
		{1, 512, 32, 1},  // never rounds to nothing
		{17, 512, 32, 2}, // rounds up
		{3, 4, 8, 6},
	}
	for _, tt := range tests {
		if got := scaledBlockLen(tt.tokens, tt.traceBS, tt.bt); got != tt.want {
			t.Errorf("scaledBlockLen(%d, %d, %d) = %d, want %d", tt.tokens, tt.traceBS, tt.bt, got, tt.want)
		}
	}
}
