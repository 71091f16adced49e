package feed

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// ErrMalformedBatch is wrapped by every DecodeError.
var ErrMalformedBatch = errors.New("kvfast: malformed KV-event batch")

// DecodeError says where and why a KV-event batch could not be decoded.
type DecodeError struct {
	Offset int    // byte offset in the payload
	Reason string // a constant, so that failing costs one allocation

	// limit: the batch exceeds a decoder limit. Such a batch is refused
	// whole, even where the excess is one event's, so that the limits
	// bound the work a batch can cause, not only the memory.
	limit bool
}

func (e *DecodeError) Error() string {
	return "cannot decode KV-event batch at byte " + strconv.Itoa(e.Offset) + ": " + e.Reason
}

func (e *DecodeError) Unwrap() error { return ErrMalformedBatch }

// VLLMEventKind is the tag of one event in a batch.
type VLLMEventKind uint8

const (
	// VLLMUnknown is an event whose tag this version does not know; it is
	// counted and skipped.
	VLLMUnknown VLLMEventKind = iota
	VLLMBlockStored
	VLLMBlockRemoved
	VLLMAllBlocksCleared
)

func (k VLLMEventKind) String() string {
	switch k {
	case VLLMBlockStored:
		return "BlockStored"
	case VLLMBlockRemoved:
		return "BlockRemoved"
	case VLLMAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// VLLMEvent is one decoded event. Its slices alias the decoder's buffers
// (Hashes, Tokens; valid until the next Decode) or the payload (the byte
// fields; valid as long as the payload is). Fields the router does not
// route on yet (LoRA, salt, tier, group metadata, extra keys) are decoded
// and carried all the same, so that skipping them is the subscriber's
// policy, not the decoder's loss.
type VLLMEvent struct {
	Kind VLLMEventKind
	// Hashes are the engine's block hashes: an int hash as its 64 bits
	// (SGLang's negative int64s as their two's complement), a bytes hash
	// (vLLM's sha256 digests) as vLLM's own int form of it: the low 64
	// bits, big-endian.
	Hashes    []uint64
	Parent    uint64 // engine hash of the first block's parent, if HasParent
	HasParent bool
	Tokens    []uint32 // BlockStored: every block's tokens, back to back
	BlockSize int64    // BlockStored: as the engine sent it, unchecked
	// BadTokens: a token id was negative or above 2^32-1, or a bigram pair
	// was empty, so Tokens is unusable.
	BadTokens bool
	// Bigram: token_ids came as SGLang's EAGLE bigram pairs [[t0,t1],
	// [t1,t2], …]; Tokens holds each pair's first element, which are the
	// block's own tokens.
	Bigram bool

	LoRA     bool   // lora_id or lora_name set: not in the base model's namespace
	LoRAID   int64  // lora_id (vLLM deprecated it for lora_name); 0 when absent
	LoRAName []byte // lora_name; nil when absent
	// Salt is the cache salt of the sequence the blocks belong to: SGLang's
	// BlockStoredWithMetadata metadata.cache_salt or its map events'
	// cache_salt, or vLLM's, which is the first block's last extra key
	// when the event starts a sequence (no parent). nil when absent.
	Salt []byte

	Medium []byte // medium as sent ("GPU", "CPU", "CPU_PINNED", "DISK", …); nil when absent
	// Tier is the tier Medium names (mediumTier); the GPU when Medium is
	// absent. UnknownMedium: Medium names no tier this decoder knows.
	Tier          workers.Tier
	UnknownMedium bool
	Locality      []byte // locality ("LOCAL", "REMOTE"); nil when absent

	Group         int64  // KV-cache group (hybrid models); 0 when absent
	SpecKind      []byte // kv_cache_spec_kind ("full_attention", …); nil when absent
	SlidingWindow int64  // kv_cache_spec_sliding_window; 0 when absent

	// ExtraKeys is extra_keys as raw msgpack (an array with one entry per
	// block: nil, or what else the block's hash covers), nil when absent.
	ExtraKeys []byte
	// ExtraKeysFrom is the first block whose hash also covers extra keys
	// that kvfast cannot reproduce (prompt embeddings, shapes it does not
	// know); len(Hashes) when none does. The keys it reproduces are vLLM's
	// LoRA name (on every block, first), multimodal (identifier, offset)
	// pairs (after it) and the cache salt (on a sequence's first block,
	// last): see blockKeys.
	ExtraKeysFrom int
	// MMExtra holds, per block before ExtraKeysFrom, the digest of the
	// block's multimodal keys (radix.FoldMMKey; 0 for a block without),
	// which the block's kvfast hash folds in (radix.ChainBlockHashExtra).
	// nil when no block has any.
	MMExtra []uint64

	// Undecodable: the event is well-formed msgpack but not a well-formed
	// event (a field of the wrong type, a required field missing). Reason
	// says why; Kind is known if the tag could be read, and nothing else
	// is meaningful.
	Undecodable bool
	Reason      string

	hashLo, hashHi, tokLo, tokHi, mmLo, mmHi int
}

// VLLMBatch is one decoded KVEventBatch.
type VLLMBatch struct {
	TS        float64
	DPRank    int64 // data_parallel_rank, if HasDPRank
	HasDPRank bool
	Events    []VLLMEvent
}

// Default decoder limits. One engine step stores the blocks of at most
// max_num_batched_tokens new tokens (tens of thousands; a million-token
// prompt prefilled in one step stays under the token bound) and evicts
// about as many blocks as it allocates, so these are far above any honest
// batch and bound what a hostile one can make us hold: with the frame
// bound they fix (maxZMQFrameBytes), a feed's socket queue (zmq4 holds
// ten messages) is at most 200 MiB, where 64 MiB frames made it 640.
const (
	DefaultMaxBatchBlocks = 1 << 17
	DefaultMaxBatchTokens = 1 << 21
	// An event costs the decoder some 360 bytes however few it takes on
	// the wire (a nil is one byte): 4M of them in a 4 MB batch held
	// 1.6 GB. A step's events number in the hundreds.
	DefaultMaxBatchEvents = 1 << 16
)

// The decoder keeps its buffers between batches so that steady decoding
// allocates nothing, but not past these: one outsized batch must not pin
// its memory for the life of the feed.
const (
	retainEvents = 4096
	retainHashes = 1 << 15
	retainTokens = 1 << 18
)

// VLLMDecoder decodes vLLM's and SGLang's KV-event batches (msgpack, as
// msgspec writes them) in every shape the engines have shipped; the
// conformance specs (testdata/conformance) pin each shape to the engine
// source it comes from. The batch is an array [ts, events, rank] or a map;
// each event is an array with its tag first (array_like structs) or a map
// with the tag under "type". Trailing fields newer than this decoder, and
// unknown map keys, are skipped. An event that is well-formed msgpack but
// not a well-formed event comes back flagged Undecodable, so that one bad
// event does not cost its batch; only a payload that is not msgpack, not a
// batch, or over a limit fails whole. The decoder keeps its buffers
// between calls, so steady-state decoding allocates nothing. Not safe for
// concurrent use.
type VLLMDecoder struct {
	MaxBlocks int // block hashes per batch; 0 = DefaultMaxBatchBlocks
	MaxTokens int // token ids per batch; 0 = DefaultMaxBatchTokens
	MaxEvents int // events per batch; 0 = DefaultMaxBatchEvents

	batch  VLLMBatch
	hashes []uint64
	tokens []uint32
	mm     []uint64 // the events' MMExtra, back to back
	r      mpReader
}

// Release drops what the decoder holds of the last payload: its reader and
// the last batch's events, whose byte fields alias the payload, so that a
// large payload (up to the frame bound, 20 MiB) is not kept alive until
// the next one arrives. The batch Decode returned is no longer valid. It
// keeps the decoder's buffers and allocates nothing.
func (d *VLLMDecoder) Release() {
	d.r = mpReader{}
	clear(d.batch.Events)
	d.batch.Events = d.batch.Events[:0]
}

// Decode decodes payload. The batch and its slices are the decoder's own
// and are overwritten by the next call. A payload that is not a batch, or
// exceeds the limits, yields a *DecodeError; an event that cannot be used
// (undecodable, bad token ids, an unknown tag) is returned flagged for the
// caller to count and skip.
func (d *VLLMDecoder) Decode(payload []byte) (*VLLMBatch, error) {
	d.r = mpReader{b: payload}
	d.hashes, d.tokens, d.mm = trimmed(d.hashes, retainHashes), trimmed(d.tokens, retainTokens), trimmed(d.mm, retainHashes)
	b := &d.batch
	*b = VLLMBatch{Events: trimmed(b.Events, retainEvents)}
	if err := d.decodeBatch(); err != nil {
		return nil, err
	}
	if d.r.off != len(payload) {
		return nil, d.r.fail("trailing bytes after the batch")
	}
	for i := range b.Events {
		ev := &b.Events[i]
		ev.Hashes = d.hashes[ev.hashLo:ev.hashHi:ev.hashHi]
		ev.Tokens = d.tokens[ev.tokLo:ev.tokHi:ev.tokHi]
		// Derived here, once every field of a map event has been read in
		// whatever order it came.
		ev.LoRA = ev.LoRAID != 0 || len(ev.LoRAName) > 0
		if ev.ExtraKeys != nil && !ev.Undecodable {
			ev.ExtraKeysFrom = d.blockKeys(ev)
		}
		ev.ExtraKeysFrom = min(ev.ExtraKeysFrom, len(ev.Hashes))
		ev.Tier, ev.UnknownMedium = mediumTier(ev.Medium)
	}
	// Sliced once d.mm has stopped growing.
	for i := range b.Events {
		if ev := &b.Events[i]; ev.mmHi > ev.mmLo {
			ev.MMExtra = d.mm[ev.mmLo:ev.mmHi:ev.mmHi]
		}
	}
	return b, nil
}

// mediumTier maps the media the engines name to tiers:
//
//	GPU                          vLLM, SGLang: the engine's KV cache
//	CPU, CPU_PINNED              vLLM's OffloadingConnector (CPU), SGLang HiCache's host pool
//	STORAGE, FS, OBJ, DISK,      vLLM's storage offloading (FS and OBJ in its first
//	EXTERNAL                     shape), SGLang HiCache's disk and external storage
//
// Case is ignored; anything else is unknown and reported so. No medium at
// all is the GPU: engines before tiers sent none.
func mediumTier(medium []byte) (workers.Tier, bool) {
	if medium == nil {
		return workers.TierGPU, false
	}
	switch m := string(medium); {
	case strings.EqualFold(m, "GPU"):
		return workers.TierGPU, false
	case strings.EqualFold(m, "CPU"), strings.EqualFold(m, "CPU_PINNED"):
		return workers.TierHost, false
	case strings.EqualFold(m, "STORAGE"), strings.EqualFold(m, "FS"), strings.EqualFold(m, "OBJ"),
		strings.EqualFold(m, "DISK"), strings.EqualFold(m, "EXTERNAL"):
		return workers.TierDisk, false
	}
	return workers.TierGPU, true
}

func (d *VLLMDecoder) decodeBatch() error {
	r := &d.r
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		seen := false
		for range n {
			key, err := r.str()
			if err != nil {
				return err
			}
			switch string(key) {
			case "ts":
				d.batch.TS, err = r.number()
			case "events":
				err, seen = d.decodeEvents(), true
			case "data_parallel_rank", "attn_dp_rank":
				err = d.dpRank()
			default:
				err = r.skip()
			}
			if err != nil {
				return err
			}
		}
		if !seen {
			return r.fail("batch has no events")
		}
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.fail("batch array shorter than [ts, events]")
	}
	if d.batch.TS, err = r.number(); err != nil {
		return err
	}
	if err := d.decodeEvents(); err != nil {
		return err
	}
	if n > 2 {
		if err := d.dpRank(); err != nil {
			return err
		}
	}
	return r.skipN(max(n-3, 0))
}

func (d *VLLMDecoder) dpRank() error {
	if d.r.null() {
		return nil
	}
	v, err := d.r.int()
	d.batch.DPRank, d.batch.HasDPRank = v, err == nil
	return err
}

// trimmed empties a buffer for reuse, or drops it if it grew past
// retain.
func trimmed[T any](buf []T, retain int) []T {
	if cap(buf) > retain {
		return nil
	}
	return buf[:0]
}

func (d *VLLMDecoder) decodeEvents() error {
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	if len(d.batch.Events)+n > orDefault(d.MaxEvents, DefaultMaxBatchEvents) {
		return d.r.failLimit("batch exceeds the event limit")
	}
	for range n {
		d.batch.Events = append(d.batch.Events, VLLMEvent{})
		ev := &d.batch.Events[len(d.batch.Events)-1]
		start := d.r.off
		err := d.decodeEvent(ev)
		if err == nil {
			continue
		}
		de, ok := err.(*DecodeError)
		if !ok || de.limit {
			return err
		}
		if err := d.skipUndecodable(ev, start, de.Reason); err != nil {
			return err
		}
	}
	return nil
}

// skipUndecodable rewinds to the start of an event that failed to decode
// and skips it whole, keeping what its tag said. An event that cannot even
// be skipped (truncated, nested too deep, an unused type byte) means the
// batch is not msgpack, and fails it.
func (d *VLLMDecoder) skipUndecodable(ev *VLLMEvent, start int, reason string) error {
	d.hashes, d.tokens = d.hashes[:ev.hashLo], d.tokens[:ev.tokLo]
	d.r.off, d.r.depth = start, 0
	if err := d.r.skip(); err != nil {
		return err
	}
	*ev = VLLMEvent{Kind: ev.Kind, Undecodable: true, Reason: reason, ExtraKeysFrom: math.MaxInt,
		hashLo: len(d.hashes), hashHi: len(d.hashes), tokLo: len(d.tokens), tokHi: len(d.tokens)}
	return nil
}

// Fields a BlockStored must carry (in map form; array form has them by
// position).
const (
	hasHashes = 1 << iota
	hasTokens
	hasBlockSize
	storedNeeds = hasHashes | hasTokens | hasBlockSize
)

func (d *VLLMDecoder) decodeEvent(ev *VLLMEvent) error {
	r := &d.r
	ev.ExtraKeysFrom = math.MaxInt
	ev.hashLo, ev.hashHi = len(d.hashes), len(d.hashes)
	ev.tokLo, ev.tokHi = len(d.tokens), len(d.tokens)
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.decodeEventMap(ev)
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return r.fail("event array has no tag")
	}
	if ev.Kind, err = d.tag(); err != nil {
		return err
	}
	order := arrayFields(ev.Kind)
	switch {
	case ev.Kind == VLLMBlockStored && n-1 < 4:
		return r.fail("BlockStored array shorter than its required fields")
	case ev.Kind == VLLMBlockRemoved && n-1 < 1:
		return r.fail("BlockRemoved array lacks block_hashes")
	}
	i := 1
	for ; i < n && i-1 < len(order); i++ {
		if _, err := d.field(ev, order[i-1]); err != nil {
			return err
		}
	}
	return r.skipN(n - i)
}

// decodeEventMap decodes a map-encoded event. The tag decides which keys
// are read, and msgspec writes it first but a map need not keep order, so
// a first pass finds it and a second reads the fields.
func (d *VLLMDecoder) decodeEventMap(ev *VLLMEvent) error {
	r := &d.r
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	body := r.off
	tagged := false
	for i := 0; i < n && !tagged; i++ {
		key, err := r.str()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			if ev.Kind, err = d.tag(); err != nil {
				return err
			}
			tagged = true
		} else if err := r.skip(); err != nil {
			return err
		}
	}
	if !tagged {
		return r.fail("event has no type")
	}
	r.off = body
	known := mapFields(ev.Kind)
	var have int
	for range n {
		key, err := r.str()
		if err != nil {
			return err
		}
		if !slices.Contains(known, string(key)) {
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		f, err := d.field(ev, string(key))
		if err != nil {
			return err
		}
		have |= f
	}
	switch {
	case ev.Kind == VLLMBlockStored && have&storedNeeds != storedNeeds:
		return r.fail("BlockStored lacks block_hashes, token_ids or block_size")
	case ev.Kind == VLLMBlockRemoved && have&hasHashes == 0:
		return r.fail("BlockRemoved lacks block_hashes")
	}
	return nil
}

// The schema: which fields each event carries, by position in array form
// and by name in map form. This is where the engines' wire quirks live;
// field() reads each one, tolerating every type an engine has sent in it.
//
// Array form follows msgspec's field order, and each version appended
// fields, so a shorter array is an older publisher: vLLM 0.9 and SGLang
// stop BlockStored at lora_id and BlockRemoved at block_hashes; vLLM then
// appended medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind
// and kv_cache_spec_sliding_window (locality follows them in the struct),
// SGLang medium (and, for a salted block, its metadata map in lora_name's
// slot).
var (
	storedArray = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
		"locality"}
	removedArray = []string{"block_hashes", "medium", "group_idx"}

	// Map events name their fields, so they may also carry what never had
	// an array position: SGLang's cache_salt (its map events, sgl-project/
	// sglang PR #37482), and the locality and cache-spec fields of vLLM's
	// BlockRemoved (which keeps only group_idx by position).
	storedMap  = append(slices.Clip(storedArray), "cache_salt")
	removedMap = append(slices.Clip(removedArray), "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality")
)

func arrayFields(k VLLMEventKind) []string {
	switch k {
	case VLLMBlockStored:
		return storedArray
	case VLLMBlockRemoved:
		return removedArray
	}
	return nil
}

func mapFields(k VLLMEventKind) []string {
	switch k {
	case VLLMBlockStored:
		return storedMap
	case VLLMBlockRemoved:
		return removedMap
	}
	return nil
}

func (d *VLLMDecoder) tag() (VLLMEventKind, error) {
	s, err := d.r.str()
	if err != nil {
		return 0, err
	}
	switch string(s) {
	case "BlockStored":
		return VLLMBlockStored, nil
	case "BlockRemoved":
		return VLLMBlockRemoved, nil
	case "AllBlocksCleared":
		return VLLMAllBlocksCleared, nil
	}
	return VLLMUnknown, nil
}

// field decodes one named field into ev and reports which required field
// it was.
func (d *VLLMDecoder) field(ev *VLLMEvent, name string) (int, error) {
	r := &d.r
	var err error
	switch name {
	case "block_hashes":
		lo := len(d.hashes)
		if err := d.hashList(); err != nil {
			return 0, err
		}
		ev.hashLo, ev.hashHi = lo, len(d.hashes)
		return hasHashes, nil
	case "parent_block_hash":
		if r.null() {
			ev.HasParent = false
			return 0, nil
		}
		ev.Parent, err = r.blockHash()
		ev.HasParent = err == nil
	case "token_ids":
		lo := len(d.tokens)
		if ev.BadTokens, ev.Bigram, err = d.tokenList(); err != nil {
			return 0, err
		}
		ev.tokLo, ev.tokHi = lo, len(d.tokens)
		return hasTokens, nil
	case "block_size":
		ev.BlockSize, err = r.int()
		return hasBlockSize, err
	case "lora_id":
		ev.LoRAID, err = r.optInt()
	case "lora_name":
		// SGLang's BlockStoredWithMetadata (sgl-project/sglang PR #30827,
		// SGLang >= 0.5.18) appends its metadata struct, a map, in the
		// array slot where vLLM has lora_name; SGLang sends no LoRA name.
		if c, perr := r.peek(); perr == nil && isMap(c) {
			return 0, d.metadata(ev)
		}
		ev.LoRAName, err = r.optStr()
	case "cache_salt":
		ev.Salt, err = r.optStr()
	case "medium":
		ev.Medium, err = r.optStr()
	case "locality":
		ev.Locality, err = r.optStr()
	case "group_idx":
		ev.Group, err = r.optInt()
	case "kv_cache_spec_kind":
		ev.SpecKind, err = r.optStr()
	case "kv_cache_spec_sliding_window":
		ev.SlidingWindow, err = r.optInt()
	case "extra_keys":
		err = d.extraKeys(ev)
	default:
		err = r.skip()
	}
	return 0, err
}

// metadata reads SGLang's BlockStoredMetadata map, keeping the cache salt
// and skipping what does not change the block's identity (session_id).
func (d *VLLMDecoder) metadata(ev *VLLMEvent) error {
	r := &d.r
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		key, err := r.str()
		if err != nil {
			return err
		}
		if string(key) == "cache_salt" {
			ev.Salt, err = r.optStr()
		} else {
			err = r.skip()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// extraKeys keeps extra_keys raw, after checking that it is an array of
// skippable values; which of them are the namespace is decided once the
// whole event is read (namespaceKeys).
func (d *VLLMDecoder) extraKeys(ev *VLLMEvent) error {
	r := &d.r
	if r.null() {
		return nil
	}
	start := r.off
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if err := r.skipN(n); err != nil {
		return err
	}
	ev.ExtraKeys = r.b[start:r.off:r.off]
	return nil
}

// blockKeys reads each block's extra keys: it returns the first block
// whose keys hold more than kvfast can hash, takes vLLM's salt from them
// into ev.Salt, and appends every block's multimodal digest to d.mm (the
// event's MMExtra, when any block has one).
//
// vLLM hashes each block with the extra keys lora + mm + salt +
// prompt_embeds, in that order (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys, at vllm-project/vllm@001cabc1be16,
// and as of tag v0.27.1), and BlockStored carries them per block
// (vllm/v1/core/block_pool.py, cache_full_blocks, at
// vMaroon/vllm@1abf1df4798a): the LoRA name on every block of an
// adapter's request; one (identifier, offset) pair per multimodal input
// the block overlaps (_gen_mm_extra_hash_keys), the identifier being the
// input's mm_hash, prefixed with "lora_name:" when the engine runs
// tower-connector LoRA (vllm/v1/engine/input_processor.py,
// _get_mm_identifier, at vllm-project/vllm@a1799180e1fc), and the
// offset where its placeholders start relative to the block, negative
// when they began in an earlier one; the cache salt on the request's
// first block only (start_token_idx 0); prompt embeddings as sha256
// digests. So a block's keys are hashable if they are the event's LoRA
// name, then [string, integer] pairs, then, on the first block of an
// event without a parent, one more string: the salt. Anything else (a
// digest, a key of a shape not known here) ends what the router can hash.
// An identifier's LoRA prefix is dropped: the block's namespace already
// holds the adapter, and the router knows inputs by their mm_hash. An
// older vLLM whose multimodal keys were plain strings could have its
// first block's image hash read as a salt; that block then lands in a
// namespace no request has, which only under-claims.
func (d *VLLMDecoder) blockKeys(ev *VLLMEvent) int {
	lo := len(d.mm)
	from, mm := d.readBlockKeys(ev)
	if mm {
		ev.mmLo, ev.mmHi = lo, lo+from
	} else {
		d.mm = d.mm[:lo] // text blocks: no digests to keep
	}
	return from
}

// readBlockKeys is blockKeys but for the bookkeeping of d.mm: it appends
// one digest per hashable block and reports whether any is not 0.
func (d *VLLMDecoder) readBlockKeys(ev *VLLMEvent) (from int, mm bool) {
	r := mpReader{b: ev.ExtraKeys}
	n, err := r.arrayLen()
	if err != nil {
		return 0, false
	}
	n = min(n, len(ev.Hashes))
	any := false
	for i := range n {
		if r.null() {
			d.mm = append(d.mm, 0)
			continue
		}
		keys, err := r.arrayLen()
		if err != nil {
			return i, any
		}
		k := 0
		if len(ev.LoRAName) > 0 && k < keys {
			if s, err := r.str(); err != nil || string(s) != string(ev.LoRAName) {
				return i, any
			}
			k++
		}
		var extra uint64
		for ; k < keys; k++ {
			c, err := r.peek()
			if err != nil || !isArrayTag(c) {
				break
			}
			id, off, ok := mmKey(&r)
			if !ok {
				return i, any
			}
			if p := len(ev.LoRAName); p > 0 && len(id) > p && id[p] == ':' && string(id[:p]) == string(ev.LoRAName) {
				id = id[p+1:]
			}
			extra = radix.FoldMMKey(extra, id, off)
		}
		if i == 0 && !ev.HasParent && k == keys-1 {
			s, err := r.str()
			if err != nil || (ev.Salt != nil && string(s) != string(ev.Salt)) {
				return i, any
			}
			ev.Salt = s[:len(s):len(s)]
			k++
		}
		if k < keys {
			return i, any
		}
		d.mm = append(d.mm, extra)
		any = any || extra != 0
	}
	return n, any
}

// isArrayTag reports whether c starts a msgpack array.
func isArrayTag(c byte) bool { return c&0xf0 == 0x90 || c == mpArray16 || c == mpArray32 }

// mmKey reads one multimodal key, vLLM's (identifier, offset) tuple: an
// array of a string and an integer.
func mmKey(r *mpReader) (id []byte, offset int64, ok bool) {
	if n, err := r.arrayLen(); err != nil || n != 2 {
		return nil, 0, false
	}
	id, err := r.str()
	if err != nil {
		return nil, 0, false
	}
	offset, err = r.int()
	return id, offset, err == nil
}

func (d *VLLMDecoder) hashList() error {
	r := &d.r
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if len(d.hashes)+n > orDefault(d.MaxBlocks, DefaultMaxBatchBlocks) {
		return r.failLimit("batch exceeds the block limit")
	}
	for range n {
		h, err := r.blockHash()
		if err != nil {
			return err
		}
		d.hashes = append(d.hashes, h)
	}
	return nil
}

// tokenList appends the token ids and reports whether any was out of
// uint32 range (the event is then unusable, but the batch is well-formed)
// and whether they came as bigram pairs.
//
// SGLang with EAGLE speculative decoding keys its radix tree by bigrams:
// RadixCache.maybe_bigram_convert replaces a key's token ids t0..tn with
// the pairs (t0,t1), (t1,t2), …, (tn-1,tn) (convert_to_bigram_key), and
// _record_store_event publishes a page of those pairs as token_ids, with
// block_size the number of pairs (python/sglang/srt/mem_cache/
// radix_cache.py, read at amdpilot-org/sglang@0a07596ef429, a fork of
// sgl-project/sglang). A pair's first element is the token at its
// position, so the first elements are the block's tokens.
func (d *VLLMDecoder) tokenList() (bad, bigram bool, _ error) {
	r := &d.r
	n, err := r.arrayLen()
	if err != nil {
		return false, false, err
	}
	if len(d.tokens)+n > orDefault(d.MaxTokens, DefaultMaxBatchTokens) {
		return false, false, r.failLimit("batch exceeds the token limit")
	}
	for range n {
		// Token ids are small: a positive fixint or a uint8..32 covers every
		// vocabulary, and reading those here, inline, is what keeps the
		// decoder fast, as every block carries block_size of them (and,
		// with EAGLE, as many pairs).
		if off := r.off; off < len(r.b) {
			c, rest := r.b[off], r.b[off+1:]
			switch {
			case c <= 0x7f:
				d.tokens, r.off = append(d.tokens, uint32(c)), off+1
				continue
			case c == mpUint16 && len(rest) >= 2:
				d.tokens, r.off = append(d.tokens, uint32(binary.BigEndian.Uint16(rest))), off+3
				continue
			case c == mpUint32 && len(rest) >= 4:
				d.tokens, r.off = append(d.tokens, binary.BigEndian.Uint32(rest)), off+5
				continue
			case c == mpUint8 && len(rest) >= 1:
				d.tokens, r.off = append(d.tokens, uint32(rest[0])), off+2
				continue
			case c == 0x92: // a pair: a fixarray of two
				if v, n, ok := smallUint(rest); ok {
					if _, m, ok := smallUint(rest[n:]); ok {
						d.tokens, r.off, bigram = append(d.tokens, v), off+1+n+m, true
						continue
					}
				}
			}
		}
		// Anything else: a bigram pair, an id out of range, or no integer.
		c, err := r.peek()
		if err != nil {
			return false, false, err
		}
		var pair int
		if c&0xf0 == 0x90 || c == mpArray16 || c == mpArray32 {
			if pair, err = r.arrayLen(); err != nil {
				return false, false, err
			}
			bigram = true
			if pair == 0 {
				bad = true
				d.tokens = append(d.tokens, 0)
				continue
			}
		}
		u, neg, err := r.integer()
		if err != nil {
			return false, false, err
		}
		if neg || u > math.MaxUint32 {
			bad = true
		}
		d.tokens = append(d.tokens, uint32(u))
		if pair > 1 {
			if err := r.skipN(pair - 1); err != nil {
				return false, false, err
			}
		}
	}
	return bad, bigram, nil
}

// smallUint reads a msgpack unsigned integer of at most 32 bits at the
// start of b, reporting how many bytes it took, or ok false for anything
// else (the caller then takes the general path). tokenList inlines the
// same cases for plain token ids, the hottest loop of the decoder.
func smallUint(b []byte) (v uint32, n int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	switch c := b[0]; {
	case c <= 0x7f:
		return uint32(c), 1, true
	case c == mpUint8 && len(b) >= 2:
		return uint32(b[1]), 2, true
	case c == mpUint16 && len(b) >= 3:
		return uint32(binary.BigEndian.Uint16(b[1:])), 3, true
	case c == mpUint32 && len(b) >= 5:
		return binary.BigEndian.Uint32(b[1:]), 5, true
	}
	return 0, 0, false
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// mpReader is a bounds-checked msgpack cursor over one payload. Every
// length is checked against the bytes left before anything is read or
// looped over, and skipping nests at most maxSkipDepth deep, so a hostile
// payload can neither read out of range, loop beyond its own size, nor
// exhaust the stack.
type mpReader struct {
	b     []byte
	off   int
	depth int
}

const maxSkipDepth = 32

// msgpack type bytes (github.com/msgpack/msgpack/blob/master/spec.md).
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

func isMap(c byte) bool { return c&0xf0 == 0x80 || c == mpMap16 || c == mpMap32 }

func (r *mpReader) fail(reason string) error {
	return &DecodeError{Offset: r.off, Reason: reason}
}

func (r *mpReader) failLimit(reason string) error {
	return &DecodeError{Offset: r.off, Reason: reason, limit: true}
}

func (r *mpReader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.fail("unexpected end of payload")
	}
	return r.b[r.off], nil
}

func (r *mpReader) next() (byte, error) {
	c, err := r.peek()
	if err == nil {
		r.off++
	}
	return c, err
}

// take returns the next n bytes.
func (r *mpReader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, r.fail("length runs past the end of the payload")
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

// uintN reads an n-byte big-endian unsigned integer.
func (r *mpReader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
	return binary.BigEndian.Uint64(s), nil
}

// null consumes a nil and reports whether there was one.
func (r *mpReader) null() bool {
	if r.off < len(r.b) && r.b[r.off] == mpNil {
		r.off++
		return true
	}
	return false
}

// integer reads any msgpack integer as magnitude bits and sign: a
// negative value's bits are its two's complement.
func (r *mpReader) integer() (u uint64, neg bool, err error) {
	c, err := r.next()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case mpUint8, mpUint16, mpUint32, mpUint64:
		u, err = r.uintN(1 << (c - mpUint8))
		return u, false, err
	case mpInt8, mpInt16, mpInt32, mpInt64:
		n := 1 << (c - mpInt8)
		u, err = r.uintN(n)
		if err != nil {
			return 0, false, err
		}
		shift := 64 - 8*n
		v := int64(u<<shift) >> shift // sign-extend
		return uint64(v), v < 0, nil
	}
	r.off--
	return 0, false, r.fail("want an integer")
}

// int reads an integer that must fit int64.
func (r *mpReader) int() (int64, error) {
	u, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && u > math.MaxInt64 {
		return 0, r.fail("integer out of range")
	}
	return int64(u), nil
}

func (r *mpReader) number() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpFloat32:
		r.off++
		u, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(u))), err
	case mpFloat64:
		r.off++
		u, err := r.uintN(8)
		return math.Float64frombits(u), err
	}
	v, err := r.int()
	return float64(v), err
}

// bytesOf reads a str or bin value, aliasing the payload.
func (r *mpReader) bytesOf(wantStr bool) ([]byte, error) {
	c, err := r.next()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == mpStr8 || (!wantStr && c == mpBin8):
		n, err = r.uintN(1)
	case c == mpStr16 || (!wantStr && c == mpBin16):
		n, err = r.uintN(2)
	case c == mpStr32 || (!wantStr && c == mpBin32):
		n, err = r.uintN(4)
	default:
		r.off--
		if wantStr {
			return nil, r.fail("want a string")
		}
		return nil, r.fail("want an integer, bytes or a string")
	}
	if err != nil {
		return nil, err
	}
	return r.take(int(n))
}

func (r *mpReader) str() ([]byte, error) { return r.bytesOf(true) }

// optStr reads a string or nil (as a nil slice; an empty string is an
// empty, non-nil one).
func (r *mpReader) optStr() ([]byte, error) {
	if r.null() {
		return nil, nil
	}
	s, err := r.str()
	return s[:len(s):len(s)], err
}

// optInt reads an int64 or nil (as 0).
func (r *mpReader) optInt() (int64, error) {
	if r.null() {
		return 0, nil
	}
	return r.int()
}

// blockHash reads an engine block hash: an integer (its 64 bits) or bytes
// (vLLM's digests), taken as vLLM's maybe_convert_block_hash makes its
// int form: the low 64 bits of the bytes read as one big-endian integer.
// One engine can name a block both ways (vLLM's OffloadingConnector has
// sent its host tier's raw digests beside the GPU's ints), and only that
// fold makes the two names one key.
func (r *mpReader) blockHash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c <= 0x7f || c >= 0xe0 || (c >= mpUint8 && c <= mpInt64) {
		u, _, err := r.integer()
		return u, err
	}
	b, err := r.bytesOf(false)
	if err != nil {
		return 0, err
	}
	if n := len(b); n >= 8 {
		return binary.BigEndian.Uint64(b[n-8:]), nil
	}
	var h uint64
	for _, c := range b {
		h = h<<8 | uint64(c)
	}
	return h, nil
}

// count checks that n elements of at least min bytes each can still follow.
func (r *mpReader) count(n uint64, min int) (int, error) {
	if n > uint64(len(r.b)-r.off)/uint64(min) {
		return 0, r.fail("element count runs past the end of the payload")
	}
	return int(n), nil
}

func (r *mpReader) arrayLen() (int, error) {
	c, err := r.next()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		n = uint64(c & 0x0f)
	case c == mpArray16:
		n, err = r.uintN(2)
	case c == mpArray32:
		n, err = r.uintN(4)
	default:
		r.off--
		return 0, r.fail("want an array")
	}
	if err != nil {
		return 0, err
	}
	return r.count(n, 1)
}

func (r *mpReader) mapLen() (int, error) {
	c, err := r.next()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		n = uint64(c & 0x0f)
	case c == mpMap16:
		n, err = r.uintN(2)
	case c == mpMap32:
		n, err = r.uintN(4)
	default:
		r.off--
		return 0, r.fail("want a map")
	}
	if err != nil {
		return 0, err
	}
	return r.count(n, 2)
}

// skipN skips n values.
func (r *mpReader) skipN(n int) error {
	for range n {
		if err := r.skip(); err != nil {
			return err
		}
	}
	return nil
}

// skip skips one value of any type.
func (r *mpReader) skip() error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0:
		r.off++
		return nil
	case c&0xe0 == 0xa0:
		_, err = r.str()
		return err
	case c&0xf0 == 0x90 || c == mpArray16 || c == mpArray32:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		return r.nested(n)
	case c&0xf0 == 0x80 || c == mpMap16 || c == mpMap32:
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		return r.nested(2 * n)
	}
	r.off++
	switch c {
	case mpNil, mpFalse, mpTrue:
		return nil
	case mpUint8, mpInt8:
		_, err = r.take(1)
	case mpUint16, mpInt16:
		_, err = r.take(2)
	case mpUint32, mpInt32, mpFloat32:
		_, err = r.take(4)
	case mpUint64, mpInt64, mpFloat64:
		_, err = r.take(8)
	case mpStr8, mpStr16, mpStr32, mpBin8, mpBin16, mpBin32:
		r.off--
		_, err = r.bytesOf(false)
	case mpFixExt1, mpFixExt2, mpFixExt4, mpFixExt8, mpFixExt16:
		_, err = r.take(1 + 1<<(c-mpFixExt1))
	case mpExt8, mpExt16, mpExt32:
		var n uint64
		if n, err = r.uintN(1 << (c - mpExt8)); err == nil {
			_, err = r.take(int(min(n, math.MaxInt32)) + 1)
		}
	default:
		r.off--
		return r.fail("unused msgpack type byte")
	}
	return err
}

func (r *mpReader) nested(n int) error {
	if r.depth >= maxSkipDepth {
		return r.fail("values nest too deeply")
	}
	r.depth++
	err := r.skipN(n)
	r.depth--
	return err
}
