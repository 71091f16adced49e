package fastpath

// RequestError is a request the router refuses before selecting a worker. It
// carries what an OpenAI-compatible client expects in the error body, so the
// server writes it with AppendJSON and the status code, and nothing else.
//
// The parser returns the package-level values below, never a fresh one, so a
// flood of bad bodies costs no allocation. They are shared: do not modify
// them; compare with errors.Is.
type RequestError struct {
	// Status is the HTTP status code to answer with.
	Status int
	// Type is the OpenAI error type; always "invalid_request_error" here.
	Type string
	// Param names the offending request field, or "" when no field is to
	// blame (a malformed or oversized body).
	Param string
	// Code is a stable machine-readable reason.
	Code string
	// Message is shown to the client.
	Message string
}

func (e *RequestError) Error() string { return "kvfast: " + e.Message }

// AppendJSON appends the OpenAI error body
// {"error":{"message":…,"type":…,"param":…,"code":…}} to dst.
func (e *RequestError) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	if e.Param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, e.Param)
	}
	dst = append(dst, `,"code":`...)
	dst = appendJSONString(dst, e.Code)
	return append(dst, "}}"...)
}

const hexDigits = "0123456789abcdef"

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

const invalidRequest = "invalid_request_error"

func badRequest(param, code, msg string) *RequestError {
	return &RequestError{Status: 400, Type: invalidRequest, Param: param, Code: code, Message: msg}
}

// Errors returned by Parser.Parse.
var (
	ErrMalformedJSON = badRequest("", "invalid_json",
		"the request body is not valid JSON")
	ErrBodyTooLarge = &RequestError{Status: 413, Type: invalidRequest, Code: "body_too_large",
		Message: "the request body is larger than the router accepts"}
	ErrNotObject = badRequest("", "invalid_type",
		"the request body must be a JSON object")
	ErrMissingPrompt = badRequest("prompt", "missing_required_parameter",
		"the request has no prompt")
	ErrMissingMessages = badRequest("messages", "missing_required_parameter",
		"the request has no messages")
	ErrEmptyPrompt = badRequest("prompt", "empty_prompt",
		"the prompt must not be empty")
	ErrEmptyMessages = badRequest("messages", "empty_prompt",
		"messages must not be empty")
	ErrBatchNotSupported = badRequest("prompt", "batch_not_supported",
		"a batch of several prompts is not supported; send one request per prompt")
	ErrTokenOutOfRange = badRequest("prompt", "token_out_of_range",
		"prompt token ids must be integers between 0 and the model's largest token id")
	ErrPromptType = badRequest("prompt", "invalid_type",
		"prompt must be a string, an array of token ids, or an array holding one string or one array of token ids")
	ErrMessagesType = badRequest("messages", "invalid_type",
		"messages must be an array of objects")
	ErrModelType = badRequest("model", "invalid_type",
		"model must be a string")
	ErrStreamType = badRequest("stream", "invalid_type",
		"stream must be a boolean")
	ErrMaxTokensType = badRequest("max_tokens", "invalid_type",
		"max_tokens and max_completion_tokens must be integers")
	ErrMaxTokensRange = badRequest("max_tokens", "invalid_value",
		"max_tokens and max_completion_tokens must be at least 1")
	ErrChoicesType = badRequest("n", "invalid_type",
		"n must be an integer")
	ErrChoicesRange = badRequest("n", "invalid_value",
		"n must be at least 1")
	ErrCacheSaltType = badRequest("cache_salt", "invalid_type",
		"cache_salt must be a non-empty string")
)
