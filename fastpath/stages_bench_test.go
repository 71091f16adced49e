package fastpath

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
)

// BenchmarkRouteStages times, in process and one at a time, the stages a
// route-only request goes through: parse the body, hash its blocks, look
// them up in the index, select a worker (query-only, with every worker's
// scores) and encode the JSON answer. Their sum is the routing work a
// request cannot do without; scripts/bench-issue15.sh frontend sets it
// beside the router's CPU per request under an external load generator,
// and the difference is what HTTP, the framework and the kernel cost.
// handler is the whole in-process handler (s.handle on a RequestCtx
// built in memory): the stages plus hints, metrics, headers and pooling,
// without connections or syscalls.
//
// The state is the one the script's router is in: four workers, one of
// which caches the whole prompt, and a body shaped as the script's (a
// completions request of random token ids).
func BenchmarkRouteStages(b *testing.B) {
	for _, tokens := range []int{1024, 4096} {
		b.Run("tokens="+strconv.Itoa(tokens), func(b *testing.B) {
			s := newRouteTestServer(b, 4, "")
			body := tokenBody(benchTokens(tokens, 151935), ", ", false)
			blocks := tokens / s.sched.BlockSize()
			fillRouteIndex(b, s, body, 0, blocks)
			seed := radix.NamespaceSeed(benchModel, "", "")

			ex := s.acquireExchange()
			defer s.releaseExchange(ex)
			ex.api = openai.APICompletions
			parse := func() {
				if err := s.parser.Parse(body, openai.APICompletions, &ex.req); err != nil {
					b.Fatal(err)
				}
			}
			hash := func() {
				ex.hashes = radix.AppendBlockHashes(ex.hashes[:0], seed, ex.req.Tokens, s.sched.BlockSize())
			}
			lookup := func() { s.index.FindMatches(ex.hashes, &ex.overlaps) }
			choose := func() {
				ex.sreq = sched.Request{Model: benchModel, Hashes: ex.hashes, Overlaps: &ex.overlaps,
					PromptTokens: len(ex.req.Tokens), QueryOnly: true, Scores: ex.scores}
				dec, err := s.sched.Select(b.Context(), &ex.sreq, nil)
				if err != nil {
					b.Fatal(err)
				}
				ex.dec = dec
			}
			encode := func() { ex.out = s.appendRouteJSON(ex.out[:0], ex) }
			// One pass in order sets up what each stage reads.
			parse()
			hash()
			lookup()
			choose()
			ex.exact = true
			encode()
			want := []byte(`"overlap_blocks":` + strconv.Itoa(blocks))
			if !bytes.Contains(ex.out, want) {
				b.Fatalf("want %s in %s", want, ex.out)
			}

			for _, st := range []struct {
				name string
				run  func()
			}{{"parse", parse}, {"hash", hash}, {"lookup", lookup}, {"select", choose}, {"encode", encode}} {
				b.Run(st.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						st.run()
					}
				})
			}
			b.Run("handler", func(b *testing.B) {
				ctx := newRouteCtx(PathRouteCompletions, body, nil)
				b.ReportAllocs()
				for b.Loop() {
					ctx.Response.Reset()
					s.handle(ctx)
				}
				if code := ctx.Response.StatusCode(); code != fasthttp.StatusOK || !bytes.Contains(ctx.Response.Body(), want) {
					b.Fatalf("status %d: %s", code, ctx.Response.Body())
				}
			})
		})
	}
}
