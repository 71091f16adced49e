package fastpath

import (
	"bytes"
	"strconv"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/openai"
	"github.com/kvfast/kvfast/workers"
)

// Routing hints travel in headers, so the body reaches the engine exactly
// as the client sent it.
const (
	// HeaderWorker pins the request to a worker id (and, with
	// HeaderDPRank, to one of its data-parallel ranks). In the response it
	// names the worker that served the request.
	HeaderWorker = "X-Kvfast-Worker"
	// HeaderDPRank is the DP rank of a pin, and of the serving worker.
	HeaderDPRank = "X-Kvfast-Dp-Rank"
	// HeaderAllow restricts selection to a comma-separated list of workers,
	// each "id" (every rank of it) or "id:rank".
	HeaderAllow = "X-Kvfast-Allow"
	// HeaderQueryOnly set to 1 or true answers with the routing decision
	// instead of forwarding, and books nothing.
	HeaderQueryOnly = "X-Kvfast-Query-Only"
	// HeaderPriority raises (or, negative, lowers) a request's place in the
	// admission queue.
	HeaderPriority = "X-Kvfast-Priority"
	// HeaderRequestID is echoed back, and generated when absent.
	HeaderRequestID = "X-Request-Id"
	// HeaderVia, on requests the router forwards, names the routers the
	// request has passed (random ids, one per router process, comma-
	// separated): a request that comes back to a router it names is a
	// loop (an engine registered at the router's own address) and gets
	// 508.
	HeaderVia = "X-Kvfast-Via"
	// HeaderOverlapBlocks, in responses, is the prefix in blocks the router
	// expected the serving worker to hold.
	HeaderOverlapBlocks = "X-Kvfast-Overlap-Blocks"
)

var (
	errBadWorkerHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderWorker, Code: "invalid_header",
		Message: HeaderWorker + " must be an unsigned integer worker id"}
	errBadRankHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderDPRank, Code: "invalid_header",
		Message: HeaderDPRank + " must be an unsigned 32-bit integer, and needs " + HeaderWorker}
	errAmbiguousPin = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderDPRank, Code: "ambiguous_pin",
		Message: "the pinned worker has several DP ranks; set " + HeaderDPRank}
	errBadAllowHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderAllow, Code: "invalid_header",
		Message: HeaderAllow + " must be a comma-separated list of worker ids or id:rank pairs, naming known workers"}
	errAllowNoGenerator = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderAllow, Code: "allow_excluded",
		Message: HeaderAllow + " names no worker that generates: only encode workers, or (disaggregated) only prefill workers; name at least one that decodes"}
	errAllowNoModel = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderAllow, Code: "allow_excluded",
		Message: HeaderAllow + " names no worker that serves the requested model (or LoRA adapter): GET /admin/workers lists the workers and their models"}
	errBadPriorityHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderPriority, Code: "invalid_header",
		Message: HeaderPriority + " must be an integer between -1000000 and 1000000"}
	errBadQueryOnlyHeader = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderQueryOnly, Code: "invalid_header",
		Message: HeaderQueryOnly + " must be 1 or true (decide and answer the routing decision only), or 0 or false"}
	// repeatedHint refuses a hint header sent twice, by header: which copy
	// counts is not the client's to guess, and a proxy that appends its
	// own X-Kvfast-Allow after a client's must not find the client's used.
	repeatedHint = func() (refusals []hintRefusal) {
		for _, h := range []string{HeaderWorker, HeaderDPRank, HeaderAllow, HeaderPriority, HeaderQueryOnly, HeaderSession} {
			refusals = append(refusals, hintRefusal{[]byte(h), &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: h,
				Code: "invalid_header", Message: h + " was sent more than once; send it once"}})
		}
		return refusals
	}()
	errDirectNeedsWorker = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Param: HeaderWorker, Code: "worker_required",
		Message: "the router runs in direct mode: every request must name its worker in " + HeaderWorker}
)

type hintRefusal struct {
	header []byte
	err    *openai.Error
}

// hintPrefix starts every hint header's name: the one scan of the
// request's headers compares the others no further.
var hintPrefix = []byte("X-Kvfast-")

// repeatedHintHeader is the refusal of the first hint header the request
// sends twice, or nil. One pass over the headers (a PeekAll per hint
// scanned them six times, 6x the cost); a first copy sent empty
// ("X-Kvfast-Allow:") is a copy too, and would otherwise hide the next.
func repeatedHintHeader(h *fasthttp.RequestHeader) *openai.Error {
	var seen uint8 // by index in repeatedHint
	for k := range h.All() {
		if len(k) < len(hintPrefix) || !bytes.EqualFold(k[:len(hintPrefix)], hintPrefix) {
			continue
		}
		for i, r := range repeatedHint {
			if bytes.EqualFold(k, r.header) {
				if seen&(1<<i) != 0 {
					return r.err
				}
				seen |= 1 << i
			}
		}
	}
	return nil
}

// readHints fills the selection request from the routing headers. It
// reports whether the request is query-only.
func (s *Server) readHints(ctx *fasthttp.RequestCtx, ex *exchange) (queryOnly bool, _ *openai.Error) {
	h := &ctx.Request.Header
	if e := repeatedHintHeader(h); e != nil {
		return false, e
	}
	if v := h.Peek(HeaderWorker); len(v) > 0 {
		id, err := strconv.ParseUint(b2s(v), 10, 64)
		if err != nil {
			return false, errBadWorkerHeader
		}
		ex.sreq.Pinned, ex.sreq.PinWorker = true, id
		if r := h.Peek(HeaderDPRank); len(r) > 0 {
			rank, err := strconv.ParseUint(b2s(r), 10, 32)
			if err != nil {
				return false, errBadRankHeader
			}
			ex.sreq.PinRank = uint32(rank)
		} else {
			// Without a rank the pin is exact only if the worker has one rank;
			// a guess would silently send the request elsewhere.
			ranks, only := s.ranksOf(id)
			switch ranks {
			case 0:
				if s.pinnedDown(id) {
					return false, errPinnedWorkerDown
				}
				return false, errUnknownPinnedWorker
			case 1:
				ex.sreq.PinRank = only
			default:
				return false, errAmbiguousPin
			}
		}
	} else if len(h.Peek(HeaderDPRank)) > 0 {
		return false, errBadRankHeader
	}
	if s.cfg.Direct && !ex.sreq.Pinned {
		return false, errDirectNeedsWorker
	}
	if v := h.Peek(HeaderAllow); len(v) > 0 {
		set, ok := s.parseAllow(v)
		if !ok {
			return false, errBadAllowHeader
		}
		if set&s.sched.StageWorkers(s.generatingStage()) == 0 {
			// Not the 503 selection would give: a client told to retry
			// would retry for ever.
			return false, errAllowNoGenerator
		}
		ex.sreq.AllowListed, ex.sreq.Allow = true, set
	}
	if v := h.Peek(HeaderPriority); len(v) > 0 {
		p, err := strconv.ParseInt(b2s(v), 10, 32)
		if err != nil || p < -1_000_000 || p > 1_000_000 {
			return false, errBadPriorityHeader
		}
		ex.sreq.Priority = int32(p)
	}
	if v := h.Peek(HeaderQueryOnly); len(v) > 0 {
		// Anything else is refused: a value read as "no" would run, and
		// bill, the generation the client asked not to run.
		switch {
		case bytes.Equal(v, []byte("1")) || bytes.EqualFold(v, []byte("true")):
			queryOnly = true
		case bytes.Equal(v, []byte("0")) || bytes.EqualFold(v, []byte("false")):
		default:
			return false, errBadQueryOnlyHeader
		}
	}
	return queryOnly, nil
}

// ranksOf counts the DP ranks of worker id and returns the rank when there
// is exactly one.
func (s *Server) ranksOf(id uint64) (n int, only uint32) {
	for w := range s.sched.Workers().All() {
		if info, ok := s.sched.Worker(w); ok && info.ID == id {
			n++
			only = info.DPRank
		}
	}
	return n, only
}

func (s *Server) parseAllow(v []byte) (workers.Set, bool) {
	var set workers.Set
	for len(v) > 0 {
		item := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			item, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		item = bytes.TrimSpace(item)
		idPart, rankPart, hasRank := bytes.Cut(item, []byte(":"))
		id, err := strconv.ParseUint(b2s(idPart), 10, 64)
		if err != nil {
			return 0, false
		}
		if hasRank {
			rank, err := strconv.ParseUint(b2s(rankPart), 10, 32)
			if err != nil {
				return 0, false
			}
			slot, ok := s.sched.Resolve(id, uint32(rank))
			if !ok {
				return 0, false
			}
			set |= workers.SetOf(slot)
			continue
		}
		found := false
		for w := range s.sched.Workers().All() {
			if info, ok := s.sched.Worker(w); ok && info.ID == id {
				set |= workers.SetOf(w)
				found = true
			}
		}
		if !found {
			return 0, false
		}
	}
	return set, set != 0
}

// echoRequestID keeps the client's request id, or makes one, so that logs
// of the router and the engine can be joined. A made id names this router
// process (the first half of its random X-Kvfast-Via id) before its
// count: vLLM takes X-Request-Id for its own request id, and two routers
// on one node, or one restarted, must not send an engine the same id
// twice. A client's id is kept only if it is printable ASCII: it goes
// into the log, the traces and the engine's own request id.
func (ex *exchange) echoRequestID(ctx *fasthttp.RequestCtx) {
	if v := clientRequestID(ctx); v != nil {
		ex.rid = append(ex.rid[:0], v...)
	} else {
		ex.rid = append(ex.rid[:0], "kvf-"...)
		ex.rid = append(ex.rid, ex.s.via[:len(ex.s.via)/2]...)
		ex.rid = append(ex.rid, '-')
		ex.rid = strconv.AppendUint(ex.rid, ex.s.requestID.Add(1), 36)
	}
	// Set now, so refusals carry it too.
	ctx.Response.Header.SetBytesV(HeaderRequestID, ex.rid)
}

// clientRequestID returns the request's X-Request-Id if the router keeps
// it (printable ASCII, at most 128 bytes), else nil.
func clientRequestID(ctx *fasthttp.RequestCtx) []byte {
	if v := ctx.Request.Header.Peek(HeaderRequestID); len(v) > 0 && len(v) <= 128 && printableASCII(v) {
		return v
	}
	return nil
}

// printableASCII reports whether b holds only printable ASCII
// characters, spaces included.
func printableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// b2s views b as a string for parsing; the string must not outlive b.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
