package mocker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvfast/kvfast/workers"
)

// ZMQFormat is the wire format a ZMQPublisher speaks.
type ZMQFormat uint8

const (
	// ZMQVLLM is vLLM v0.26's: an array batch [ts, events,
	// data_parallel_rank] of map events tagged under "type", uint64 block
	// hashes, and replay replies [topic, seq, payload] (vLLM PR #45177).
	ZMQVLLM ZMQFormat = iota
	// ZMQSGLang is SGLang's (>= 0.5.18): an array batch [ts, events,
	// attn_dp_rank] of array events with the tag first and medium last,
	// int64 block hashes (negative when the top bit is set), and replay
	// replies [seq, payload], the shape vLLM had before PR #45177.
	ZMQSGLang
)

func (f ZMQFormat) String() string {
	if f == ZMQSGLang {
		return "sglang"
	}
	return "vllm"
}

// ZMQConfig makes an engine publish its KV events on ZMQ sockets, as a
// vLLM or SGLang engine with KV events enabled does, instead of into a shm
// segment.
type ZMQConfig struct {
	// Listen is the PUB socket's endpoint, tcp://host:port (port 0: a free
	// one; Engine.ZMQEndpoint says which). "" publishes nothing on ZMQ.
	Listen string
	// Replay is the ROUTER replay socket's endpoint, "" for none.
	Replay string
	Format ZMQFormat
	Topic  string // first frame of every message; vLLM's default is ""
	// BufferSteps is how many batches the replay socket keeps (default
	// 10000, vLLM's buffer_steps).
	BufferSteps int
	// DropEvery > 0 loses every DropEvery-th batch from the live stream
	// (it stays in the replay buffer), as a PUB socket over its high-water
	// mark does, so that demos and tests can watch a router repair gaps.
	DropEvery int
}

// DefaultZMQBufferSteps is vLLM's default replay buffer (buffer_steps).
const DefaultZMQBufferSteps = 10000

// ZMQPublisher publishes the engine's KV events in an engine's own ZMQ
// wire format: each event is one batch, sent on a PUB socket as frames
// [topic, 8-byte big-endian sequence number, msgpack payload] and kept in
// a bounded buffer that a ROUTER socket replays on request. It publishes
// no load and no heartbeat, as the engines do not either.
//
// The payloads are encoded by hand (msgpack is a few type bytes here)
// rather than by a reflection encoder: the shapes are fixed and few, the
// encoder then needs no dependency outside tests, and what the bytes are
// is visible in one place. Each payload is a fresh slice, because the PUB
// socket queues it and the replay buffer keeps it.
//
// The engine calls Stored, Removed and Cleared from its loop goroutine;
// the replay goroutine reads the buffer under mu.
type ZMQPublisher struct {
	cfg    ZMQConfig
	dpRank uint32
	pub    zmq4.Socket
	router zmq4.Socket // nil without a replay socket
	done   sync.WaitGroup

	mu     sync.Mutex
	seq    uint64
	buffer []replayBatch // oldest first, at most cfg.BufferSteps

	hashes []uint64 // Stored's scratch, reused
	tokens []uint32
}

type replayBatch struct {
	seq     uint64
	payload []byte
}

var _ Publisher = (*ZMQPublisher)(nil)

// endOfReplay is the sequence number of the engines' end-of-replay marker
// (-1 as an int64).
const endOfReplay = math.MaxUint64

// NewZMQPublisher binds cfg's sockets. dpRank is sent in every batch.
func NewZMQPublisher(cfg ZMQConfig, dpRank uint32) (*ZMQPublisher, error) {
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultZMQBufferSteps
	}
	p := &ZMQPublisher{cfg: cfg, dpRank: dpRank}
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.Listen(cfg.Listen); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("cannot listen for KV-event subscribers on %s: %w", cfg.Listen, err)
	}
	p.cfg.Listen = "tcp://" + p.pub.Addr().String()
	if cfg.Replay != "" {
		p.router = zmq4.NewRouter(context.Background())
		if err := p.router.Listen(cfg.Replay); err != nil {
			p.router.Close()
			p.pub.Close()
			return nil, fmt.Errorf("cannot listen for KV-event replay requests on %s: %w", cfg.Replay, err)
		}
		p.cfg.Replay = "tcp://" + p.router.Addr().String()
		p.done.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// Published is how many batches the publisher has numbered so far: a
// subscriber that applied batch Published()-1 has seen every event.
func (p *ZMQPublisher) Published() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Endpoint is the PUB socket's bound endpoint, tcp://host:port.
func (p *ZMQPublisher) Endpoint() string { return p.cfg.Listen }

// ReplayEndpoint is the replay socket's bound endpoint, "" if none.
func (p *ZMQPublisher) ReplayEndpoint() string { return p.cfg.Replay }

// Close closes the sockets and waits for the replay goroutine.
func (p *ZMQPublisher) Close() error {
	err := closeSocket(p.pub)
	if p.router != nil {
		err = errors.Join(err, closeSocket(p.router))
	}
	p.done.Wait()
	if err != nil {
		return fmt.Errorf("cannot close KV-event sockets: %w", err)
	}
	return nil
}

// closeSocket closes s. zmq4 reports the connections a subscriber had
// already hung up as errors of the close; they are not this socket's
// failure.
func closeSocket(s zmq4.Socket) error {
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Stored implements Publisher. An adapter's or a salted request's blocks
// carry their namespace as the engines send it: vLLM names the adapter in
// lora_name and hashes it into every block, the salt into a sequence's
// first block, and lists those keys in extra_keys
// (vllm/v1/core/kv_cache_utils.py, generate_block_hash_extra_keys);
// SGLang sends the salt in BlockStoredWithMetadata's metadata map on every
// salted block and never names an adapter. An image's blocks list its
// (mm_hash, offset) keys between the adapter and the salt, as vLLM's do
// (multimodal.go); the SGLang format carries no such keys.
//
// Copies in the host pool are announced as the engines' offloading does:
// vLLM's OffloadingConnector by engine hash alone (token_ids [], parent
// null, block_size 0, medium "CPU"), SGLang's HiCache with tokens and
// parent, medium "CPU_PINNED". A hybrid engine's events name their
// KV-cache group (group_idx, kv_cache_spec_kind and, for the
// sliding-window group, kv_cache_spec_sliding_window), as vLLM's hybrid
// allocator does; SGLang has no groups, so its format publishes group 0
// only.
func (p *ZMQPublisher) Stored(at Placement, parent uint64, hasParent bool, blocks []BlockEvent) error {
	if p.cfg.Format == ZMQSGLang && at.Group != 0 {
		return nil
	}
	p.hashes, p.tokens = p.hashes[:0], p.tokens[:0]
	blockSize := 0
	var lora, salt string
	if len(blocks) > 0 {
		lora, salt = blocks[0].LoRA, blocks[0].Salt
	}
	for _, b := range blocks {
		p.hashes = append(p.hashes, b.Hash)
		p.tokens = append(p.tokens, b.Tokens...)
		blockSize = len(b.Tokens)
	}
	b := p.batchHead(len(p.hashes), len(p.tokens))
	if p.cfg.Format == ZMQSGLang {
		n := 7
		if salt != "" {
			n = 8
		}
		b = mpArray(b, n)
		b = mpStr(b, "BlockStored")
		b = p.appendHashes(b, p.hashes)
		b = p.appendParent(b, parent, hasParent)
		b = mpTokens(b, p.tokens)
		b = mpUint(b, uint64(blockSize))
		b = append(b, mpNil) // lora_id
		b = mpStr(b, p.medium(at))
		if salt != "" {
			b = mpStr(mpStr(mpMap(b, 1), "cache_salt"), salt)
		}
		return p.send(p.batchTail(b))
	}
	byReference := at.Tier != workers.TierGPU
	if byReference {
		// The connector knows the blocks it copied by engine hash only.
		hasParent, blockSize, lora, salt = false, 0, "", ""
		p.tokens = p.tokens[:0]
	}
	saltFirst := salt != "" && !hasParent // vLLM salts a request's first block only
	extra := lora != "" || saltFirst
	if !byReference {
		for i := range blocks {
			extra = extra || blocks[i].mmKeys() > 0
		}
	}
	n := 8 + groupKeys(at)
	if extra {
		n++
	}
	b = mpMap(b, n)
	b = mpStr(mpStr(b, "type"), "BlockStored")
	b = p.appendHashes(mpStr(b, "block_hashes"), p.hashes)
	b = p.appendParent(mpStr(b, "parent_block_hash"), parent, hasParent)
	b = mpTokens(mpStr(b, "token_ids"), p.tokens)
	b = mpUint(mpStr(b, "block_size"), uint64(blockSize))
	b = append(mpStr(b, "lora_id"), mpNil)
	b = mpStr(mpStr(b, "medium"), p.medium(at))
	if b = mpStr(b, "lora_name"); lora != "" {
		b = mpStr(b, lora)
	} else {
		b = append(b, mpNil)
	}
	if extra {
		b = mpArray(mpStr(b, "extra_keys"), len(blocks))
		for i := range blocks {
			keys := blocks[i].mmKeys()
			if lora != "" {
				keys++
			}
			if i == 0 && saltFirst {
				keys++
			}
			if keys == 0 {
				b = append(b, mpNil)
				continue
			}
			// vLLM's order: lora + mm + salt (generate_block_hash_extra_keys).
			b = mpArray(b, keys)
			if lora != "" {
				b = mpStr(b, lora)
			}
			b = blocks[i].appendMMKeys(b)
			if i == 0 && saltFirst {
				b = mpStr(b, salt)
			}
		}
	}
	b = appendGroup(b, at, true)
	return p.send(p.batchTail(b))
}

// Removed implements Publisher.
func (p *ZMQPublisher) Removed(at Placement, hashes []uint64) error {
	if p.cfg.Format == ZMQSGLang && at.Group != 0 {
		return nil
	}
	b := p.batchHead(len(hashes), 0)
	if p.cfg.Format == ZMQSGLang {
		b = mpArray(b, 3)
		b = mpStr(b, "BlockRemoved")
		b = p.appendHashes(b, hashes)
		b = mpStr(b, p.medium(at))
	} else {
		n := 3
		if at.Hybrid {
			n++
		}
		b = mpMap(b, n)
		b = mpStr(mpStr(b, "type"), "BlockRemoved")
		b = p.appendHashes(mpStr(b, "block_hashes"), hashes)
		b = mpStr(mpStr(b, "medium"), p.medium(at))
		b = appendGroup(b, at, false)
	}
	return p.send(p.batchTail(b))
}

// medium names at's tier as the format's engine does.
func (p *ZMQPublisher) medium(at Placement) string {
	switch {
	case at.Tier == workers.TierGPU:
		return "GPU"
	case p.cfg.Format == ZMQSGLang:
		return "CPU_PINNED"
	}
	return "CPU"
}

// groupKeys is how many keys appendGroup writes into a BlockStored.
func groupKeys(at Placement) int {
	switch {
	case !at.Hybrid:
		return 0
	case at.Group != 0:
		return 3
	}
	return 2
}

// appendGroup writes a hybrid engine's group keys: group_idx, and, for a
// store, the group's kind and sliding window.
func appendGroup(b []byte, at Placement, store bool) []byte {
	if !at.Hybrid {
		return b
	}
	b = mpUint(mpStr(b, "group_idx"), uint64(at.Group))
	if !store {
		return b
	}
	if at.Group == 0 {
		return mpStr(mpStr(b, "kv_cache_spec_kind"), "full_attention")
	}
	b = mpStr(mpStr(b, "kv_cache_spec_kind"), "sliding_window")
	return mpUint(mpStr(b, "kv_cache_spec_sliding_window"), uint64(at.SlidingWindow))
}

// Cleared implements Publisher.
func (p *ZMQPublisher) Cleared() error {
	b := p.batchHead(0, 0)
	if p.cfg.Format == ZMQSGLang {
		b = mpStr(mpArray(b, 1), "AllBlocksCleared")
	} else {
		b = mpStr(mpStr(mpMap(b, 1), "type"), "AllBlocksCleared")
	}
	return p.send(p.batchTail(b))
}

// Load implements Publisher; the engines publish no load on ZMQ.
func (p *ZMQPublisher) Load(running, waiting, kvUsed, kvTotal uint64) error { return nil }

// Heartbeat implements Publisher; the engines publish no heartbeat on ZMQ.
func (p *ZMQPublisher) Heartbeat() error { return nil }

// batchHead starts a one-event batch: [ts, [event, in a buffer sized for
// a payload of about hashes block hashes and tokens token ids.
func (p *ZMQPublisher) batchHead(hashes, tokens int) []byte {
	b := make([]byte, 0, 64+9*hashes+3*tokens)
	b = mpArray(b, 3)
	b = mpFloat(b, float64(time.Now().UnixNano())/1e9)
	return mpArray(b, 1)
}

// batchTail ends the batch with the DP rank.
func (p *ZMQPublisher) batchTail(b []byte) []byte { return mpUint(b, uint64(p.dpRank)) }

func (p *ZMQPublisher) appendHashes(b []byte, hashes []uint64) []byte {
	b = mpArray(b, len(hashes))
	for _, h := range hashes {
		b = p.appendHash(b, h)
	}
	return b
}

// appendHash writes a block hash as the engine types it: vLLM's are
// unsigned 64-bit ints, SGLang's signed int64s.
func (p *ZMQPublisher) appendHash(b []byte, h uint64) []byte {
	if p.cfg.Format == ZMQSGLang {
		return mpInt(b, int64(h))
	}
	return mpUint(b, h)
}

func (p *ZMQPublisher) appendParent(b []byte, parent uint64, hasParent bool) []byte {
	if !hasParent {
		return append(b, mpNil)
	}
	return p.appendHash(b, parent)
}

// send numbers the batch, keeps it for replay and publishes it (unless
// DropEvery loses it).
func (p *ZMQPublisher) send(payload []byte) error {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	if p.router != nil {
		if len(p.buffer) == p.cfg.BufferSteps {
			// Sliding the slice forward makes append move it to a new
			// array once its capacity runs out: amortised O(1) per batch.
			p.buffer[0] = replayBatch{}
			p.buffer = p.buffer[1:]
		}
		p.buffer = append(p.buffer, replayBatch{seq, payload})
	}
	p.mu.Unlock()
	if p.cfg.DropEvery > 0 && (seq+1)%uint64(p.cfg.DropEvery) == 0 {
		return nil
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), sb[:], payload)); err != nil {
		return fmt.Errorf("cannot publish KV-event batch %d: %w", seq, err)
	}
	return nil
}

// serveReplay answers replay requests until the socket closes. A request
// is [identity, empty, 8-byte start] (a DEALER's [empty, start]); the
// answer is every buffered batch from start on, then the end marker, in
// the format's shape.
func (p *ZMQPublisher) serveReplay() {
	defer p.done.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue // not a replay request: the engines ignore it too
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		p.mu.Lock()
		var todo []replayBatch
		for i, b := range p.buffer {
			if b.seq >= start {
				todo = append(todo, p.buffer[i:]...)
				break
			}
		}
		p.mu.Unlock()
		// A client that hangs up mid-replay ends only its own replay.
		for _, b := range append(todo, replayBatch{endOfReplay, []byte{}}) {
			if p.reply(id, b) != nil {
				break
			}
		}
	}
}

func (p *ZMQPublisher) reply(id []byte, b replayBatch) error {
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], b.seq)
	frames := [][]byte{id, {}}
	if p.cfg.Format == ZMQVLLM {
		// vLLM PR #45177: the topic comes first, empty on the end marker.
		topic := []byte(p.cfg.Topic)
		if b.seq == endOfReplay {
			topic = []byte{}
		}
		frames = append(frames, topic)
	}
	return p.router.Send(zmq4.NewMsgFrom(append(frames, sb[:], b.payload)...))
}

// msgpack type bytes and appenders for the few shapes above
// (github.com/msgpack/msgpack/blob/master/spec.md). Integers take their
// shortest form, as msgspec writes them.
const mpNil = 0xc0

func mpArray(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func mpMap(b []byte, n int) []byte { return append(b, 0x80|byte(n)) } // n < 16 here

func mpStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func mpUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func mpInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return mpUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func mpFloat(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

func mpTokens(b []byte, tokens []uint32) []byte {
	b = mpArray(b, len(tokens))
	for _, t := range tokens {
		b = mpUint(b, uint64(t))
	}
	return b
}
