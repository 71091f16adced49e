package fastpath

import "github.com/kvfast/kvfast/openai"

// The request parse and the OpenAI error body live in package openai. These
// names remain only because server.go and workers.go, being rewritten
// elsewhere, and cmd/kvfast still use them; delete them once those name
// openai directly.
type (
	Parser        = openai.Parser
	ParsedRequest = openai.ParsedRequest
	RequestError  = openai.Error
)

const (
	DefaultMaxBodyBytes = openai.DefaultMaxBodyBytes
	APICompletions      = openai.APICompletions
	invalidRequest      = openai.TypeInvalidRequest
)

var ErrBodyTooLarge = openai.ErrBodyTooLarge
