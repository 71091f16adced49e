package openai

import (
	"strconv"

	"github.com/kvfast/kvfast/internal/jsonscan"
)

// Error is an error answered with an OpenAI error body. It carries what an
// OpenAI-compatible client expects there, so a server writes it with
// AppendJSON and the status code, and nothing else.
//
// The parser returns the package-level values below, never a fresh one, so a
// flood of bad bodies costs no allocation. They are shared: do not modify
// them; compare with errors.Is.
type Error struct {
	// Status is the HTTP status code to answer with.
	Status int
	// Type is the OpenAI error type, such as TypeInvalidRequest.
	Type string
	// Param names the offending request field, or "" when no field is to
	// blame (a malformed or oversized body).
	Param string
	// Code is a stable machine-readable reason. When it is "", the body
	// carries Status as a number instead, the way vLLM fills the field.
	Code string
	// Message is shown to the client.
	Message string
}

// The error types a router or engine answers with.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServerError    = "server_error"
)

func (e *Error) Error() string { return "kvfast: " + e.Message }

// AppendJSON appends the OpenAI error body
// {"error":{"message":…,"type":…,"param":…,"code":…}} to dst.
func (e *Error) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = jsonscan.AppendQuoted(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = jsonscan.AppendQuoted(dst, e.Type)
	dst = append(dst, `,"param":`...)
	if e.Param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = jsonscan.AppendQuoted(dst, e.Param)
	}
	dst = append(dst, `,"code":`...)
	if e.Code == "" {
		dst = strconv.AppendInt(dst, int64(e.Status), 10)
	} else {
		dst = jsonscan.AppendQuoted(dst, e.Code)
	}
	return append(dst, "}}"...)
}

func badRequest(param, code, msg string) *Error {
	return &Error{Status: 400, Type: TypeInvalidRequest, Param: param, Code: code, Message: msg}
}

// Errors returned by Parser.Parse.
var (
	ErrMalformedJSON = badRequest("", "invalid_json",
		"the request body is not valid JSON, or nests arrays and objects more than "+strconv.Itoa(jsonscan.MaxDepth)+" deep")
	ErrBodyTooLarge = &Error{Status: 413, Type: TypeInvalidRequest, Code: "body_too_large",
		Message: "the request body is larger than the router accepts"}
	ErrInvalidUTF8 = badRequest("", "invalid_utf8",
		"the request body is not valid UTF-8; every JSON string and key must be UTF-8 encoded")
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
	ErrEmbedsType = badRequest("prompt_embeds", "invalid_type",
		"prompt_embeds must be a base64 string (a serialized tensor) or an array holding one")
	ErrEmbedsBatch = badRequest("prompt_embeds", "batch_not_supported",
		"a batch of several prompt embeddings is not supported; send one request per prompt")
	ErrMessagesType = badRequest("messages", "invalid_type",
		"messages must be an array of objects")
	ErrModelType = badRequest("model", "invalid_type",
		"model must be a string")
	ErrStreamType = badRequest("stream", "invalid_type",
		"stream must be a boolean")
	ErrAddSpecialTokensType = badRequest("add_special_tokens", "invalid_type",
		"add_special_tokens must be a boolean")
	ErrMaxTokensType = badRequest("max_tokens", "invalid_type",
		"max_tokens must be an integer")
	ErrMaxCompletionTokensType = badRequest("max_completion_tokens", "invalid_type",
		"max_completion_tokens must be an integer")
	ErrMaxTokensRange = badRequest("max_tokens", "invalid_value",
		"max_tokens must be a positive integer (at most 2^63-1)")
	ErrMaxCompletionTokensRange = badRequest("max_completion_tokens", "invalid_value",
		"max_completion_tokens must be a positive integer (at most 2^63-1)")
	ErrChoicesType = badRequest("n", "invalid_type",
		"n must be an integer")
	ErrChoicesRange = badRequest("n", "invalid_value",
		"n must be a positive integer (at most 2^63-1)")
	ErrCacheSaltType = badRequest("cache_salt", "invalid_type",
		"cache_salt must be a non-empty string")
)
