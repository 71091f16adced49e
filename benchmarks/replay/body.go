package replay

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// DefaultMaxBodyBytes is the largest request body Run sends unless told
// otherwise: kvfast serve's default --max-body-bytes
// (openai.DefaultMaxBodyBytes), beyond which the router answers 413.
const DefaultMaxBodyBytes = 16 << 20

// Bounds on a request body's bytes per prompt token or word, so that a
// body's size can be bounded without building it: a token id is a digit
// or more and a comma, a word two letters or more; a word is at most six
// letters and a space; a message's JSON around its text, an image part
// included, is well under maxMessageBytes.
const (
	minTokenBytes   = 2
	minWordBytes    = 2
	maxWordBytes    = 7
	maxMessageBytes = 256
	maxFixedBytes   = 64 // around the prompt or messages, max_tokens included
)

// requestBody writes /v1/completions and /v1/chat/completions request
// bodies. The fixed part is rendered once; per request only max_tokens and
// the prompt or messages are appended, into a buffer the caller reuses,
// because a Mooncake prompt is tens of thousands of token ids (or words)
// and encoding/json would box and reflect over each.
type requestBody struct {
	head []byte // `{"model":...,"max_tokens":`
}

// newRequestBody renders the fields every request shares. stream_options
// asks for the final usage chunk that carries cached_tokens; ignore_eos
// makes vLLM-compatible engines generate exactly max_tokens, as the trace
// recorded. Both APIs take them all.
func newRequestBody(model string) requestBody {
	m, _ := json.Marshal(model) // a Go string always marshals
	head := []byte(`{"model":`)
	head = append(head, m...)
	head = append(head, `,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"max_tokens":`...)
	return requestBody{head: head}
}

// appendBody appends one complete completions body to dst.
func (c requestBody) appendBody(dst []byte, prompt []uint32, maxTokens int) []byte {
	dst = append(dst, c.head...)
	dst = strconv.AppendInt(dst, int64(maxTokens), 10)
	dst = append(dst, `,"prompt":[`...)
	for i, tok := range prompt {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(tok), 10)
	}
	return append(dst, "]}"...)
}

// appendChat appends one complete chat body to dst: rec's conversation.
func (c requestBody) appendChat(dst []byte, s ChatSynth, rec *Record, maxTokens int) []byte {
	dst = append(dst, c.head...)
	dst = strconv.AppendInt(dst, int64(maxTokens), 10)
	dst = append(dst, `,"messages":`...)
	dst = s.appendMessages(dst, rec)
	return append(dst, '}')
}

// checkBodies refuses a replay one of whose requests the router would
// refuse as too large: better up front, naming the record, than after
// building a body that may not even fit in memory (a corrupt or hostile
// record can ask for a billion tokens). Bounds settle almost every record
// at once; only one near the limit is built to be measured.
func (r *runner) checkBodies() error {
	var tokens []uint32
	var body []byte
	tokenBytes := len(strconv.FormatUint(uint64(r.synth.Vocab-1), 10)) + 1
	for i := range r.trace.Records {
		rec := &r.trace.Records[i]
		fixed := len(r.body.head) + maxFixedBytes
		var lo, hi, units int
		var unit string
		if r.isChat {
			words, messages := r.chat.PromptLen(rec)
			units, unit = words, "words"
			lo = len(r.body.head) + words*minWordBytes
			hi = fixed + words*maxWordBytes + messages*maxMessageBytes
		} else {
			units, unit = r.synth.PromptLen(rec), "prompt tokens"
			lo = len(r.body.head) + units*minTokenBytes
			hi = fixed + units*tokenBytes
		}
		if hi <= r.maxBody {
			continue
		}
		size, atLeast := lo, "at least "
		if lo <= r.maxBody {
			if r.isChat {
				body = r.body.appendChat(body[:0], r.chat, rec, r.maxTokens(rec))
			} else {
				tokens = r.synth.AppendPrompt(tokens[:0], rec)
				body = r.body.appendBody(body[:0], tokens, r.maxTokens(rec))
			}
			if len(body) <= r.maxBody {
				continue
			}
			size, atLeast = len(body), ""
		}
		return fmt.Errorf("the request of %s:%d (%d %s) would be a body of %s%d bytes, more than the %d a router accepts: "+
			"send fewer tokens per hash id, or raise the router's --max-body-bytes and this limit with it",
			r.trace.Source, rec.Line, units, unit, atLeast, size, r.maxBody)
	}
	return nil
}
