package mocker

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkMockCacheAllocate measures one block's life in a full cache:
// allocate (evicting the LRU block), commit under a new hash, release. The
// baseline is the obvious design: a mutex, a map to list elements, and
// container/list for LRU order.
func BenchmarkMockCacheAllocate(b *testing.B) {
	const nblocks, seqLen = 4096, 8
	toks := seq(0, 16)
	b.Run("paged", func(b *testing.B) {
		b.ReportAllocs()
		c := newKVCache(&Config{KVBlocks: nblocks, BlockSize: 16}, &eventSink{})
		ids := make([]int32, 0, seqLen)
		h := uint64(0)
		b.ResetTimer()
		for i := 0; i < b.N; i += seqLen {
			ids = ids[:0]
			for range seqLen {
				id, _ := c.allocate()
				h++
				c.commit(id, h, h-1, true, toks, "", "", blockMM{})
				ids = append(ids, id)
			}
			for j := len(ids) - 1; j >= 0; j-- {
				c.release(ids[j], false)
			}
			c.ev.flush()
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blockops/s")
	})
	b.Run("baseline-mutex-map-list", func(b *testing.B) {
		b.ReportAllocs()
		c := newListCache(nblocks)
		ids := make([]*listBlock, 0, seqLen)
		h := uint64(0)
		b.ResetTimer()
		for i := 0; i < b.N; i += seqLen {
			ids = ids[:0]
			for range seqLen {
				h++
				ids = append(ids, c.allocateCommit(h))
			}
			for j := len(ids) - 1; j >= 0; j-- {
				c.release(ids[j])
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blockops/s")
	})
}

type listBlock struct {
	hash uint64
	ref  int
	elem *list.Element
}

type listCache struct {
	mu     sync.Mutex
	free   int
	byHash map[uint64]*listBlock
	lru    *list.List
}

func newListCache(n int) *listCache {
	return &listCache{free: n, byHash: map[uint64]*listBlock{}, lru: list.New()}
}

func (c *listCache) allocateCommit(h uint64) *listBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.free > 0 {
		c.free--
	} else {
		old := c.lru.Remove(c.lru.Front()).(*listBlock)
		delete(c.byHash, old.hash)
	}
	blk := &listBlock{hash: h, ref: 1}
	c.byHash[h] = blk
	return blk
}

func (c *listCache) release(blk *listBlock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	blk.ref--
	if blk.ref == 0 {
		blk.elem = c.lru.PushBack(blk)
	}
}

// BenchmarkMockCoreStep is one decode step of a 64-sequence batch, blocks
// filling and being stored as the sequences grow.
func BenchmarkMockCoreStep(b *testing.B) {
	b.ReportAllocs()
	c := newTestCore(b, Config{BlockSize: 16, KVBlocks: 1 << 16, MaxBatchedTokens: 8192}, nil)
	refill := func() {
		for i := 0; c.waiting.len()+len(c.running) < 64; i++ {
			addReq(b, c, seq(int(c.stats.Requests)*1000, 512), 2048)
		}
	}
	refill()
	c.Step()
	b.ResetTimer()
	tokens := 0
	for range b.N {
		rep := c.Step()
		tokens += rep.DecodeSeqs + rep.PrefillTokens
		if len(c.running) < 64 {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
}

// BenchmarkMockCoreRequest pushes whole requests through a core, one at a
// time: 64 distinct 2,048-token prompts sharing a 1,536-token prefix,
// cycled (so after the first round mostly cache hits), 8 tokens out. It is
// the scheduler's CPU cost of one request, excluding HTTP and parsing.
func BenchmarkMockCoreRequest(b *testing.B) {
	b.ReportAllocs()
	c := newTestCore(b, Config{BlockSize: 16, KVBlocks: 1 << 14}, nil)
	shared := seq(0, 1536)
	prompts := make([][]uint32, 64)
	for i := range prompts {
		prompts[i] = concat(shared, seq(1_000_000+i*1000, 512))
	}
	b.ResetTimer()
	for i := range b.N {
		c.Add(&Request{Prompt: prompts[i%len(prompts)], MaxTokens: 8})
		for !c.Idle() {
			c.Step()
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	b.ReportMetric(c.Stats().PrefixHitRate(), "hit-rate")
}

// BenchmarkMockParseRequest parses a 4,096-token completions body. The
// baseline lets encoding/json decode the token array by reflection.
func BenchmarkMockParseRequest(b *testing.B) {
	body := []byte(`{"model":"mock","prompt":` + idsJSON(seq(100000, 4096)) + `,"max_tokens":64,"stream":true}`)
	b.Run("hand-parsed-ids", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		var r apiRequest
		for range b.N {
			if err := parseRequest(context.Background(), body, false, nil, &r); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*4096)/b.Elapsed().Seconds(), "tokens/s")
	})
	b.Run("baseline-encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			var r struct {
				Model     string   `json:"model"`
				Prompt    []uint32 `json:"prompt"`
				MaxTokens int      `json:"max_tokens"`
				Stream    bool     `json:"stream"`
			}
			if err := json.Unmarshal(body, &r); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*4096)/b.Elapsed().Seconds(), "tokens/s")
	})
}

// BenchmarkMockHTTPCompletion is a non-streaming 512-token, 4-token-reply
// completion over loopback with no simulated time: the engine's HTTP and
// JSON overhead per request.
func BenchmarkMockHTTPCompletion(b *testing.B) {
	b.ReportAllocs()
	e, err := Start(Config{Speedup: math.Inf(1)})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	client := &fasthttp.Client{}
	body := []byte(fmt.Sprintf(`{"prompt":%s,"max_tokens":4}`, idsJSON(seq(1, 512))))
	url := e.URL() + "/v1/completions"
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(url)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBody(body)
		for pb.Next() {
			if err := client.DoTimeout(req, resp, 10*time.Second); err != nil || resp.StatusCode() != 200 {
				b.Errorf("status %d: %v", resp.StatusCode(), err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}
