package mocker

import (
	"bytes"
	"encoding/json"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// Disaggregated serving, simulated in the engines' own protocols.
//
// vLLM (NixlConnector): a request whose kv_transfer_params say
// do_remote_decode is prefilled (the router asks for one token) and its
// blocks are kept when it finishes; the answer carries kv_transfer_params
// naming them (remote_block_ids, remote_engine_id, remote_request_id,
// remote_host, remote_port), as vLLM's connector returns from
// request_finished. A decode engine given those params (do_remote_prefill)
// pulls the blocks from the prefill engine over HTTP (POST /mock/kv/pull
// on remote_host:remote_port, which stands for NIXL's side channel),
// waits Timing.TransferPerBlock a block, and schedules the request with
// those blocks already computed (Request.Transferred). A pull naming
// blocks the prefill engine no longer keeps (pulled already, or kept past
// Config.TransferTimeout) is refused, and so is the decode request.
//
// SGLang (Config.SGLangBootstrap): both engines get the same request with
// bootstrap_host, bootstrap_port and bootstrap_room. The prefill engine
// (the one at bootstrap_host) computes the prompt and keeps its blocks
// for the room; the decode engine asks the prefill engine's bootstrap
// server (POST /mock/bootstrap/pull, on the mock's HTTP port) for the
// room, waiting until the prefill is done, and then proceeds as a vLLM
// decode does.

const (
	pathKVPull        = "/mock/kv/pull"
	pathBootstrapPull = "/mock/bootstrap/pull"
)

// kvTransferParams is vLLM's kv_transfer_params, both directions.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id,omitempty"`
	RemoteBlockIDs  []int32 `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// disaggRequest is what a request says about disaggregation.
type disaggRequest struct {
	kv        *kvTransferParams
	bootstrap bool // bootstrap_host, bootstrap_port and bootstrap_room all set
	host      string
	port      int
	room      uint64
}

func (d *disaggRequest) read(w *wireRequest) *openai.Error {
	*d = disaggRequest{}
	if len(w.KVTransferParams) > 0 && string(w.KVTransferParams) != "null" {
		d.kv = new(kvTransferParams)
		if err := json.Unmarshal(w.KVTransferParams, d.kv); err != nil {
			return badRequest("kv_transfer_params", "cannot parse kv_transfer_params: %v", err)
		}
	}
	n := 0
	if w.BootstrapHost != nil {
		d.host, n = *w.BootstrapHost, n+1
	}
	if w.BootstrapRoom != nil {
		d.room, n = *w.BootstrapRoom, n+1
	}
	switch {
	case n == 0 && w.BootstrapPort == nil:
	case n == 2 && w.BootstrapPort == nil:
		// SGLang fills in its own --disaggregation-bootstrap-port; the
		// mock serves its bootstrap on its HTTP port, which only the
		// router can name.
		return badRequest("bootstrap_port", "kvfast mock serves its bootstrap on its HTTP port and has no default one: run the router with --disagg-bootstrap-port http")
	case n == 2:
		d.port, d.bootstrap = *w.BootstrapPort, true
	default:
		return badRequest("bootstrap_room", "bootstrap_host, bootstrap_port and bootstrap_room go together")
	}
	return nil
}

// transfers are the prompts a prefill engine keeps for remote decodes,
// by remote_request_id (vLLM) or room (SGLang).
type transfers struct {
	mu    sync.Mutex
	byID  map[string]*keptPrompt
	rooms map[uint64]*keptPrompt
}

// keptPrompt is one finished prefill's blocks, kept until pulled or until
// the transfer timeout.
type keptPrompt struct {
	r      *Request
	blocks []int32 // the prompt's full blocks, by id
	ready  chan struct{}
	taken  bool
	timer  *time.Timer
}

// prepareDisagg applies a request's disaggregation fields to r before it
// is submitted: a prefill for a remote decode keeps its blocks; a decode
// of a remote prefill pulls them first. It answers the error the engine
// would refuse the request with.
func (e *Engine) prepareDisagg(req *apiRequest, r *Request) *openai.Error {
	d := &req.disagg
	switch {
	case d.bootstrap && !e.cfg.SGLangBootstrap:
		return badRequest("bootstrap_room", "this engine was not started for disaggregation (SGLang bootstrap)")
	case d.bootstrap && e.isBootstrap(d.host, d.port):
		if e.cfg.Role == workers.RoleDecode {
			return badRequest("bootstrap_host", "a decode engine cannot serve as the prefill of a room")
		}
		r.KeepBlocks, r.MaxTokens = true, 1
		req.stream = false // the router reads the prefill's answer and drops it
		return nil
	case d.bootstrap:
		if e.cfg.Role == workers.RolePrefill {
			return badRequest("bootstrap_host", "a prefill engine cannot decode a room")
		}
		return e.pull(r, "http://"+net.JoinHostPort(d.host, strconv.Itoa(d.port))+pathBootstrapPull, pullRequest{Room: d.room})
	case d.kv == nil:
		return nil
	case d.kv.DoRemoteDecode:
		if e.cfg.Role == workers.RoleDecode {
			return badRequest("kv_transfer_params", "a decode engine (kv_consumer) cannot prefill for a remote decode")
		}
		r.KeepBlocks = !req.stream
		return nil
	case d.kv.DoRemotePrefill:
		if e.cfg.Role == workers.RolePrefill {
			return badRequest("kv_transfer_params", "a prefill engine (kv_producer) cannot decode a remote prefill")
		}
		kv := d.kv
		if kv.RemoteHost == nil || kv.RemotePort == nil || kv.RemoteRequestID == nil {
			return badRequest("kv_transfer_params", "do_remote_prefill needs remote_host, remote_port and remote_request_id")
		}
		return e.pull(r, "http://"+net.JoinHostPort(*kv.RemoteHost, strconv.Itoa(*kv.RemotePort))+pathKVPull,
			pullRequest{RequestID: *kv.RemoteRequestID, BlockIDs: kv.RemoteBlockIDs})
	}
	return nil
}

// isBootstrap reports whether host and port name this engine's bootstrap
// server (its HTTP listener): the request is the prefill half of a room.
func (e *Engine) isBootstrap(host string, port int) bool {
	own, ownPort, _ := net.SplitHostPort(e.Addr())
	return (host == own || host == "localhost" && own == "127.0.0.1") && strconv.Itoa(port) == ownPort
}

type pullRequest struct {
	RequestID string  `json:"remote_request_id,omitempty"`
	BlockIDs  []int32 `json:"remote_block_ids,omitempty"`
	Room      uint64  `json:"room,omitempty"`
}

type pullAnswer struct {
	Blocks int `json:"blocks"`
}

// pull takes a kept prompt's blocks from the prefill engine at url and
// waits out their transfer time; r then starts with them computed.
func (e *Engine) pull(r *Request, url string, body pullRequest) *openai.Error {
	b, _ := json.Marshal(body)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(b)
	if err := fasthttp.DoTimeout(req, resp, e.cfg.TransferTimeout+10*time.Second); err != nil {
		return &openai.Error{Status: fasthttp.StatusServiceUnavailable, Type: openai.TypeServerError,
			Message: "cannot pull the prompt's KV from the prefill engine: " + err.Error()}
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return badRequest("kv_transfer_params", "the prefill engine refused the KV pull (%d): %s", resp.StatusCode(), bytes.TrimSpace(resp.Body()))
	}
	var a pullAnswer
	if err := json.Unmarshal(resp.Body(), &a); err != nil {
		return &openai.Error{Status: fasthttp.StatusBadGateway, Type: openai.TypeServerError, Message: "cannot read the prefill engine's pull answer: " + err.Error()}
	}
	if d := time.Duration(a.Blocks) * e.cfg.Timing.TransferPerBlock; d > 0 && !math.IsInf(e.cfg.Speedup, 1) {
		time.Sleep(time.Duration(float64(d) / e.cfg.Speedup))
	}
	r.Transferred = a.Blocks
	return nil
}

// finishDisagg completes a non-streaming answer: a prefill kept for a
// remote decode registers its blocks and names them in the answer's
// kv_transfer_params (vLLM), or in its room (SGLang).
func (e *Engine) finishDisagg(req *apiRequest, r *Request, id string, body []byte) []byte {
	if !r.KeepBlocks {
		return body
	}
	// r finished on the loop, which touches its blocks again only when
	// told to release them, after this registration. The prompt's last
	// token is always computed on the decode side (as Core.Step does), so
	// the blocks handed over are the full ones before it.
	n := max(0, min((len(r.Prompt)-1)/e.cfg.BlockSize, len(r.blocks)))
	kept := &keptPrompt{r: r, blocks: slices.Clone(r.blocks[:n])}
	if req.disagg.bootstrap {
		e.transfers.keepRoom(e, req.disagg.room, kept)
		return body
	}
	e.transfers.keepID(e, id, kept)
	host, port, _ := net.SplitHostPort(e.Addr())
	p, _ := strconv.Atoi(port)
	engineID := e.idTag[:len(e.idTag)-1]
	params, _ := json.Marshal(kvTransferParams{DoRemotePrefill: true, RemoteEngineID: &engineID, RemoteRequestID: &id,
		RemoteBlockIDs: kept.blocks, RemoteHost: &host, RemotePort: &p, TPSize: 1})
	if i := bytes.LastIndexByte(body, '}'); i > 0 {
		out := append(body[:i:i], `,"kv_transfer_params":`...)
		out = append(out, params...)
		return append(out, '}')
	}
	return body
}

// room returns the kept prompt of an SGLang room, making a placeholder
// the prefill fills when it finishes.
func (t *transfers) room(room uint64) *keptPrompt {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rooms == nil {
		t.rooms = map[uint64]*keptPrompt{}
	}
	k := t.rooms[room]
	if k == nil {
		k = &keptPrompt{ready: make(chan struct{})}
		t.rooms[room] = k
	}
	return k
}

// keepID registers a finished vLLM prefill's blocks under its request
// id, until pulled or the transfer timeout.
func (t *transfers) keepID(e *Engine, id string, k *keptPrompt) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID = map[string]*keptPrompt{}
	}
	t.byID[id] = k
	k.timer = time.AfterFunc(e.cfg.TransferTimeout, func() { t.expire(e, k, func() { delete(t.byID, id) }) })
}

// keepRoom registers a finished SGLang prefill's blocks in its room and
// wakes a decode waiting for it.
func (t *transfers) keepRoom(e *Engine, room uint64, k *keptPrompt) {
	slot := t.room(room)
	t.mu.Lock()
	defer t.mu.Unlock()
	slot.r, slot.blocks = k.r, k.blocks
	slot.timer = time.AfterFunc(e.cfg.TransferTimeout, func() { t.expire(e, slot, func() { delete(t.rooms, room) }) })
	close(slot.ready)
}

// expire releases a kept prompt no decode pulled in time.
func (t *transfers) expire(e *Engine, k *keptPrompt, forget func()) {
	t.mu.Lock()
	expired := !k.taken
	k.taken = true
	forget()
	t.mu.Unlock()
	if expired {
		_ = e.submit(engineOp{kind: opReleaseKept, r: k.r})
	}
}

// handlePull serves a decode engine's pull: the kept blocks are released
// here (they are the decode engine's now) and their count answered.
func (e *Engine) handlePull(ctx *fasthttp.RequestCtx, bootstrap bool) {
	var p pullRequest
	if err := json.Unmarshal(ctx.PostBody(), &p); err != nil {
		writeError(ctx, badRequest("", "cannot parse pull: %v", err))
		return
	}
	t := &e.transfers
	var k *keptPrompt
	if bootstrap {
		k = t.room(p.Room)
		select {
		case <-k.ready:
		case <-time.After(e.cfg.TransferTimeout):
		case <-e.closing:
		}
	}
	t.mu.Lock()
	if !bootstrap {
		k = t.byID[p.RequestID]
	}
	ok := k != nil && !k.taken && k.r != nil && (bootstrap || slices.Equal(k.blocks, p.BlockIDs))
	if bootstrap && k.r == nil {
		delete(t.rooms, p.Room) // no prefill came for the room: forget the placeholder
	}
	if ok {
		k.taken = true
		if bootstrap {
			delete(t.rooms, p.Room)
		} else {
			delete(t.byID, p.RequestID)
		}
	}
	t.mu.Unlock()
	if !ok {
		writeError(ctx, &openai.Error{Status: fasthttp.StatusConflict, Type: openai.TypeInvalidRequest,
			Message: "the named blocks are no longer held by this prefill engine"})
		return
	}
	k.timer.Stop()
	_ = e.submit(engineOp{kind: opReleaseKept, r: k.r})
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"blocks":` + strconv.Itoa(len(k.blocks)) + `}`)
}

// ReleaseKept frees the blocks a finished request kept for a remote
// decode (Request.KeepBlocks). It reports false if r keeps none.
func (c *Core) ReleaseKept(r *Request) bool {
	if r.state != stateFinished || !r.KeepBlocks || len(r.blocks) == 0 {
		return false
	}
	c.releaseBlocks(r)
	c.ev.flush()
	return true
}
