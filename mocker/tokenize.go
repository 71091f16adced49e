package mocker

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"

	"github.com/kvfast/kvfast/openai"
)

// Without a Renderer (Config.Renderer), the mock engine has no real
// tokenizer. Text becomes tokens by a rule that is deterministic, cheap and
// prefix-stable, which is all prefix caching needs: every maximal run of bytes that are not ASCII whitespace is one
// token, whose id is VocabBase + XXH64(word) mod (VocabSize − VocabBase),
// except the words that spell a special token ("<|system|>", "<|end|>",
// ...), which are that token, as a real tokenizer matches added tokens in
// its input. Whitespace only separates words, so "a  b" and "a b" tokenize
// alike. A router that wants the ids the mock engine caches asks it (the
// render and tokenize endpoints) or applies the same rule
// (AppendTextTokens, AppendChatTokens).

// Renderer tokenizes an engine's text and chat prompts for real, in place
// of the toy tokenizer: Tokens appends to dst the ids of r's prompt, r
// being the router's parse (package openai) of body, a completions or chat
// body posted to api. It is package prompt's Renderer, declared again here
// because prompt's tests run against the mock engine, so that mocker
// cannot import prompt; any prompt.Renderer is one.
type Renderer interface {
	Tokens(ctx context.Context, dst []uint32, api openai.API, body []byte, r *openai.ParsedRequest) ([]uint32, error)
}

// VocabSize bounds every token id the mock engine produces from text or
// generates. Token-id prompts may use any uint32.
const VocabSize = 128000

// VocabBase is the first id used for words; ids below it are special.
const VocabBase = 256

// Special tokens of the chat template.
const (
	TokenEndOfTurn uint32 = 2
	TokenSystem    uint32 = 3
	TokenUser      uint32 = 4
	TokenAssistant uint32 = 5
	TokenTool      uint32 = 6
	TokenDeveloper uint32 = 7
)

// The text of the special tokens. The chat template, written out, is
// "<|system|> You are brief. <|end|> <|user|> Hi <|end|> <|assistant|>":
// a text prompt holding that text tokenizes exactly as the chat request
// does.
const (
	TextEndOfTurn = "<|end|>"
	TextSystem    = "<|system|>"
	TextUser      = "<|user|>"
	TextAssistant = "<|assistant|>"
	TextTool      = "<|tool|>"
	TextDeveloper = "<|developer|>"
)

// specialToken is the special token a word spells, if any.
func specialToken(word string) (uint32, bool) {
	if len(word) < len("<|end|>") || word[0] != '<' || word[1] != '|' {
		return 0, false
	}
	switch word {
	case TextEndOfTurn:
		return TokenEndOfTurn, true
	case TextSystem:
		return TokenSystem, true
	case TextUser:
		return TokenUser, true
	case TextAssistant:
		return TokenAssistant, true
	case TextTool:
		return TokenTool, true
	case TextDeveloper:
		return TokenDeveloper, true
	}
	return 0, false
}

// WordToken is the id of one word that is not a special token's text.
func WordToken(word string) uint32 {
	return VocabBase + uint32(xxhash.Sum64String(word)%(VocabSize-VocabBase))
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// AppendTextTokens appends the tokens of text to dst. It makes no
// allocation when dst has room.
func AppendTextTokens(dst []uint32, text string) []uint32 {
	i := 0
	for i < len(text) {
		for i < len(text) && isSpace(text[i]) {
			i++
		}
		start := i
		for i < len(text) && !isSpace(text[i]) {
			i++
		}
		if i > start {
			w := text[start:i]
			if id, ok := specialToken(w); ok {
				dst = append(dst, id)
			} else {
				dst = append(dst, WordToken(w))
			}
		}
	}
	return dst
}

// ChatMessage is one message of a chat prompt, with its text parts already
// joined.
type ChatMessage struct {
	Role    string
	Content string
}

// RoleToken returns the special token that opens a message of role.
func RoleToken(role string) (uint32, bool) {
	switch role {
	case "system":
		return TokenSystem, true
	case "user":
		return TokenUser, true
	case "assistant":
		return TokenAssistant, true
	case "tool", "function":
		return TokenTool, true
	case "developer":
		return TokenDeveloper, true
	}
	return 0, false
}

// AppendChatTokens appends the chat template's tokens to dst: for each
// message its role token, its content's words and TokenEndOfTurn; then
// TokenAssistant, which opens the reply. A conversation that grows by turns
// therefore keeps its earlier tokens as a prefix. They are the tokens of
// the template written out as text (see TextSystem).
func AppendChatTokens(dst []uint32, msgs []ChatMessage) ([]uint32, error) {
	for i, m := range msgs {
		rt, ok := RoleToken(m.Role)
		if !ok {
			return dst, fmt.Errorf("cannot tokenize message %d: unknown role %q", i, m.Role)
		}
		dst = append(dst, rt)
		dst = AppendTextTokens(dst, m.Content)
		dst = append(dst, TokenEndOfTurn)
	}
	return append(dst, TokenAssistant), nil
}

// Generated tokens are words drawn from a fixed list, so that a reply fed
// back as the next turn's text tokenizes to the very ids generated.
var outputWords = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for",
	"it", "as", "was", "with", "be", "by", "on", "not",
	"he", "this", "are", "or", "his", "from", "at", "which",
	"but", "have", "an", "had", "they", "you", "were", "their",
	"one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no",
	"cache", "block", "prefix", "token", "route", "engine", "batch", "decode",
	"prefill", "hash", "radix", "worker", "load", "queue", "step", "reply",
}

var outputTokenIDs = func() (ids [len(outputWords)]uint32) {
	for i, w := range outputWords {
		ids[i] = WordToken(w)
	}
	return ids
}()

// outputIndex picks the word generated at position i of a reply whose
// prompt hashed to seed (splitmix64 of the pair).
func outputIndex(seed uint64, i int) int {
	z := seed + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(bits.RotateLeft64(z, 7) % uint64(len(outputWords)))
}

// OutputToken is the id generated at position i (0-based) of the reply to a
// prompt whose output seed is seed. Replies are a pure function of the
// prompt, so identical requests share their generated blocks too.
func OutputToken(seed uint64, i int) uint32 { return outputTokenIDs[outputIndex(seed, i)] }

// outputText is the word generated at position i; replies put a space
// before every word.
func outputText(seed uint64, i int) string { return outputWords[outputIndex(seed, i)] }
