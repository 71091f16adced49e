package fastpath

import (
	"errors"
	"strconv"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// The two stages of a disaggregated request send the client's body with a
// few top-level members replaced. These helpers copy the body's members
// except the named ones and append the replacements, without building a
// tree: a body is already known to be a valid JSON object (the parser
// read it). A member's name is compared as JSON decodes it: a client
// that spells kv_transfer_param\u0073 means kv_transfer_params to the
// engine's Python json, and must mean it here too.

var errNotObject = errors.New("the body is not a JSON object")

// appendMembersExcept appends body's top-level members, "{" included and
// the closing "}" not, leaving out those named in drop; it reports
// whether any member was written.
func appendMembersExcept(dst, body []byte, drop ...string) ([]byte, bool, error) {
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return dst, false, errNotObject
	}
	dst = append(dst, '{')
	wrote := false
	i++
	for {
		i = jsonscan.SkipSpace(body, i)
		if i < len(body) && body[i] == '}' {
			return dst, wrote, nil
		}
		if i >= len(body) || body[i] != '"' {
			return dst, wrote, errNotObject
		}
		keyEnd, escaped := jsonscan.ScanString(body, i)
		if keyEnd < 0 {
			return dst, wrote, errNotObject
		}
		key := body[i+1 : keyEnd-1]
		j := jsonscan.SkipSpace(body, keyEnd)
		if j >= len(body) || body[j] != ':' {
			return dst, wrote, errNotObject
		}
		j = jsonscan.SkipSpace(body, j+1)
		end := jsonscan.SkipValue(body, j, 1)
		if end < 0 {
			return dst, wrote, errNotObject
		}
		if !named(key, escaped, drop) {
			if wrote {
				dst = append(dst, ',')
			}
			dst = append(dst, body[i:keyEnd]...)
			dst = append(dst, ':')
			dst = append(dst, body[j:end]...)
			wrote = true
		}
		i = jsonscan.SkipSpace(body, end)
		if i < len(body) && body[i] == ',' {
			i++
		}
	}
}

// named reports whether the raw member name key (escaped: it holds
// escapes) decodes to one of names.
func named(key []byte, escaped bool, names []string) bool {
	for _, n := range names {
		if keyIs(key, escaped, n) {
			return true
		}
	}
	return false
}

// keyIs reports whether the raw member name key decodes to name.
func keyIs(key []byte, escaped bool, name string) bool {
	if !escaped {
		return string(key) == name
	}
	// An escape takes 2 to 6 bytes for one: a raw key shorter than name,
	// or more than six times longer, cannot decode to it (and a long one
	// would be decoded, into the heap, once per name compared).
	if len(key) < len(name) || len(key) > 6*len(name) {
		return false
	}
	var buf [64]byte // the names compared are short: no allocation for them
	return string(jsonscan.AppendUnescaped(buf[:0], key)) == name
}

// topLevelMember returns the raw value of body's top-level member name,
// or nil. A name given twice is its last value, as Python's json (and so
// vLLM's and SGLang's servers) reads it.
func topLevelMember(body []byte, name string) []byte {
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	i++
	var found []byte
	for {
		i = jsonscan.SkipSpace(body, i)
		if i >= len(body) || body[i] != '"' {
			return found
		}
		keyEnd, escaped := jsonscan.ScanString(body, i)
		if keyEnd < 0 {
			return found
		}
		j := jsonscan.SkipSpace(body, keyEnd)
		if j >= len(body) || body[j] != ':' {
			return found
		}
		j = jsonscan.SkipSpace(body, j+1)
		end := jsonscan.SkipValue(body, j, 1)
		if end < 0 {
			return found
		}
		if keyIs(body[i+1:keyEnd-1], escaped, name) {
			found = body[j:end]
		}
		i = jsonscan.SkipSpace(body, end)
		if i < len(body) && body[i] == ',' {
			i++
		}
	}
}

func appendMember(dst []byte, wrote bool, name, raw string) []byte {
	if wrote {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, `":`...)
	return append(dst, raw...)
}

// vllmPrefillParams asks a vLLM prefill engine to keep the prompt's KV for
// a remote decode (vLLM's disaggregated proxy examples send exactly this).
const vllmPrefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// appendVLLMPrefillBody appends the prefill stage's body: the client's,
// non-streaming, one token, with the prefill kv_transfer_params.
// stream_options and min_tokens go, as a one-token request refuses them.
func appendVLLMPrefillBody(dst, body []byte, chat bool) ([]byte, error) {
	dst, wrote, err := appendMembersExcept(dst, body, "kv_transfer_params", "stream", "stream_options",
		"max_tokens", "max_completion_tokens", "min_tokens", "min_completion_tokens")
	if err != nil {
		return dst, err
	}
	dst = appendMember(dst, wrote, "kv_transfer_params", vllmPrefillParams)
	dst = appendMember(dst, true, "stream", "false")
	dst = appendMember(dst, true, "max_tokens", "1")
	if chat && topLevelMember(body, "max_completion_tokens") != nil {
		dst = appendMember(dst, true, "max_completion_tokens", "1")
	}
	return append(dst, '}'), nil
}

// appendVLLMDecodeBody appends the decode stage's body: the client's, with
// the kv_transfer_params the prefill engine answered (none when params is
// nil).
func appendVLLMDecodeBody(dst, body, params []byte) ([]byte, error) {
	dst, wrote, err := appendMembersExcept(dst, body, "kv_transfer_params")
	if err != nil {
		return dst, err
	}
	if params == nil {
		return append(dst, '}'), nil
	}
	if wrote {
		dst = append(dst, ',')
	}
	dst = append(dst, `"kv_transfer_params":`...)
	dst = append(dst, params...)
	return append(dst, '}'), nil
}

// appendSGLangBody appends the body the prefill stage of an SGLang request
// gets: the client's, with the prefill engine's bootstrap address and the
// room that pairs the two stages (the decode stage's adds the prefill's
// rank to it).
func appendSGLangBody(dst, body []byte, b sglangBootstrap) ([]byte, error) {
	dst, wrote, err := appendMembersExcept(dst, body, sglangTransferFields...)
	if err != nil {
		return dst, err
	}
	if wrote {
		dst = append(dst, ',')
	}
	dst = append(dst, `"bootstrap_host":`...)
	dst = jsonscan.AppendQuoted(dst, b.host)
	if b.port > 0 {
		dst = append(dst, `,"bootstrap_port":`...)
		dst = strconv.AppendInt(dst, int64(b.port), 10)
	}
	dst = append(dst, `,"bootstrap_room":`...)
	dst = strconv.AppendUint(dst, b.room, 10)
	return append(dst, '}'), nil
}

// sglangBootstrap is what both stages of an SGLang request are told of
// the prefill engine: its bootstrap address (port 0: none sent, the
// engine's own default) and the room.
type sglangBootstrap struct {
	host string
	port int
	room uint64
}
