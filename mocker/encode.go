package mocker

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
)

// Encoder disaggregation, simulated as vLLM runs it (docs/mocker.md). An
// encode engine (Config.Role workers.RoleEncode, vLLM's ec_producer) answers a
// chat request by encoding its images: each costs Timing.EncodePerItem
// unless the engine's encoder cache (Config.EncoderCacheItems items,
// least recently used out first, keyed by the image's mm_hash, ImageHash)
// still holds it, and the encoder runs one item at a time, so a busy
// encoder queues. Every encoded image is saved to the encoder-cache
// connector's storage, Config.ECStore, under its mm_hash, and the
// request is answered with one token.
//
// Every other engine (vLLM's ec_consumer) looks each image of a request
// up in the same store before scheduling it: an image found there was
// handed over and costs nothing more; one not found is encoded locally,
// at Timing.EncodePerItem, as vLLM's engine encodes any item its
// connector does not have. A decode of a remote prefill encodes nothing:
// the prefill engine did. The store is shared in process (NewECStore) or
// across processes through a directory (OpenECStore), one entry per
// mm_hash as vLLM's example connector keeps one file per mm_hash under
// its shared_storage_path.

// ECStore is an encoder-cache connector's storage: which items'
// embeddings were saved. It is safe for concurrent use.
type ECStore struct {
	dir   string // "" in process
	mu    sync.Mutex
	items map[string]struct{}
}

// NewECStore returns an empty store shared by the engines of one process.
func NewECStore() *ECStore { return &ECStore{items: map[string]struct{}{}} }

// OpenECStore returns a store kept in dir (created if missing), which
// engines in other processes given the same dir share.
func OpenECStore(dir string) (*ECStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot open the encoder-cache store: %w", err)
	}
	return &ECStore{dir: dir, items: map[string]struct{}{}}, nil
}

// Put saves item mmHash's embeddings.
func (s *ECStore) Put(mmHash string) error {
	if s.dir != "" {
		if !validHash(mmHash) {
			return fmt.Errorf("cannot store item %q: not an mm_hash", mmHash)
		}
		if err := os.WriteFile(filepath.Join(s.dir, mmHash), nil, 0o644); err != nil {
			return fmt.Errorf("cannot store item %s: %w", mmHash, err)
		}
		return nil
	}
	s.mu.Lock()
	s.items[mmHash] = struct{}{}
	s.mu.Unlock()
	return nil
}

// Has reports whether item mmHash's embeddings were saved.
func (s *ECStore) Has(mmHash string) bool {
	if s == nil {
		return false
	}
	if s.dir != "" {
		if !validHash(mmHash) {
			return false
		}
		_, err := os.Stat(filepath.Join(s.dir, mmHash))
		return err == nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.items[mmHash]
	return ok
}

// validHash keeps a file-backed store's names to hex digits.
func validHash(h string) bool {
	if h == "" || len(h) > 128 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// DefaultEncoderCacheItems is an encode engine's encoder cache, in items.
const DefaultEncoderCacheItems = 256

// EncodeStats are an engine's multimodal counters.
type EncodeStats struct {
	// Encoded counts items this engine encoded: an encode engine's
	// encoder-cache misses, or another engine's items not handed over.
	Encoded int64 `json:"encoded_items"`
	// CacheHits counts an encode engine's items found in its encoder
	// cache, which cost nothing.
	CacheHits int64 `json:"encoder_cache_hits"`
	// HandedOver counts a prefill or aggregated engine's items found in
	// the encoder-cache store.
	HandedOver int64 `json:"handed_over_items"`
	// Encoding is how many items are being encoded now.
	Encoding int64 `json:"encoding_items"`
}

// encoder is an engine's encoder: its cache and its timeline.
type encoder struct {
	mu        sync.Mutex
	cache     map[string]*list.Element
	order     *list.List // of string mm_hashes, most recent first
	capacity  int
	busyUntil time.Time

	encoded, hits, handedOver, encoding atomic.Int64
}

func (c *encoder) stats() EncodeStats {
	return EncodeStats{Encoded: c.encoded.Load(), CacheHits: c.hits.Load(), HandedOver: c.handedOver.Load(), Encoding: c.encoding.Load()}
}

// cached looks id up in the encoder cache and remembers it as used.
func (c *encoder) cached(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cache == nil {
		c.cache, c.order = map[string]*list.Element{}, list.New()
	}
	if el := c.cache[id]; el != nil {
		c.order.MoveToFront(el)
		return true
	}
	if c.capacity <= 0 {
		return false
	}
	if c.order.Len() >= c.capacity {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.cache, old.Value.(string))
	}
	c.cache[id] = c.order.PushFront(id)
	return false
}

// encode spends n items' encoding time on the encoder's timeline, which
// runs one item at a time, and waits until they are done or the engine
// closes.
func (e *Engine) encode(n int) error {
	if n == 0 {
		return nil
	}
	c := &e.enc
	c.encoded.Add(int64(n))
	d := time.Duration(n) * e.cfg.Timing.EncodePerItem
	if d <= 0 || math.IsInf(e.cfg.Speedup, 1) {
		return nil
	}
	d = time.Duration(float64(d) / e.cfg.Speedup)
	c.mu.Lock()
	start := time.Now()
	if start.Before(c.busyUntil) {
		start = c.busyUntil
	}
	c.busyUntil = start.Add(d)
	end := c.busyUntil
	c.mu.Unlock()
	c.encoding.Add(int64(n))
	defer c.encoding.Add(-int64(n))
	t := time.NewTimer(time.Until(end))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-e.closing:
		return ErrClosed
	}
}

// handleEncode serves an encode engine's chat request: its images are
// encoded, or found in the encoder cache, and saved to the store.
func (e *Engine) handleEncode(ctx *fasthttp.RequestCtx, chat bool) {
	if !chat {
		writeError(ctx, badRequest("prompt", "an encode engine encodes the multimodal items of chat requests only"))
		return
	}
	var req apiRequest
	if _, ok := e.admit(ctx, chat, &req); !ok {
		return
	}
	misses := 0
	for _, it := range req.mm {
		if e.enc.cached(string(it.ID)) {
			e.enc.hits.Add(1)
		} else {
			misses++
		}
	}
	if err := e.encode(misses); err != nil {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusServiceUnavailable, Message: err.Error(), Type: openai.TypeServerError})
		return
	}
	for _, it := range req.mm {
		if err := e.cfg.ECStore.Put(string(it.ID)); err != nil {
			writeError(ctx, &openai.Error{Status: fasthttp.StatusInternalServerError, Message: err.Error(), Type: openai.TypeServerError})
			return
		}
	}
	h := &respHead{created: time.Now().Unix(), model: e.modelJSON, chat: true}
	h.id = "chatcmpl-" + e.idTag + strconv.FormatUint(e.nextID.Add(1), 10)
	ctx.SetContentType("application/json")
	ctx.SetBody(h.appendFull(nil, 0, len(req.tokens), 1, 0, "length"))
}

// encodeLocally pays for a consumer engine's images that were not handed
// over, before the request is scheduled. A decode of a remote prefill
// has none to encode.
func (e *Engine) encodeLocally(req *apiRequest) error {
	if len(req.mm) == 0 || req.disagg.kv != nil && req.disagg.kv.DoRemotePrefill ||
		req.disagg.bootstrap && !e.isBootstrap(req.disagg.host, req.disagg.port) {
		return nil
	}
	missing := 0
	for i, it := range req.mm {
		if dupItem(req, i) {
			continue
		}
		if e.cfg.ECStore.Has(string(it.ID)) {
			e.enc.handedOver.Add(1)
		} else {
			missing++
		}
	}
	return e.encode(missing)
}

func dupItem(req *apiRequest, i int) bool {
	for j := range i {
		if string(req.mm[j].ID) == string(req.mm[i].ID) {
			return true
		}
	}
	return false
}

// EncodeStats returns the engine's multimodal counters.
func (e *Engine) EncodeStats() EncodeStats { return e.enc.stats() }

var errEncodeStore = errors.New("an encode engine needs Config.ECStore, where it saves what it encodes")
