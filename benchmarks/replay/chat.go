package replay

import "fmt"

// Workloads, as Config.Workload names them: what a trace record becomes.
const (
	// WorkloadTokens sends each record as a token-id prompt to
	// /v1/completions (TokenSynth).
	WorkloadTokens = "tokens"
	// WorkloadChat sends each record as a conversation to
	// /v1/chat/completions (ChatSynth), so that the router must tokenize
	// it before it can route on token blocks.
	WorkloadChat = "chat"
)

// Workloads lists the workload names, for flags and messages.
var Workloads = []string{WorkloadTokens, WorkloadChat, WorkloadMultimodal}

const (
	// DefaultSystemIDs is how many leading hash ids of a record become its
	// system prompt.
	DefaultSystemIDs = 1
	// ReplyWords is the length in words of each earlier assistant turn.
	ReplyWords = 8
	// chatVocabSize is how many distinct words synthesised text uses.
	chatVocabSize = 1024
)

// ChatSynth turns trace records into chat conversations. Each hash id
// stands for a stretch of text: BlockWords words drawn from a fixed
// vocabulary of pronounceable pseudo-words by a stream keyed by (Seed,
// hash id) alone, as TokenSynth keys its blocks of tokens. A record with
// hash ids h0 … hn-1 becomes
//
//   - a system prompt: the text of its first SystemIDs hash ids (fewer
//     when the record has no more than that, so that the last is left for
//     the user);
//   - earlier turns: for each following hash id but the last, a user
//     message holding its text and an assistant reply of ReplyWords words
//     keyed by the hash id too;
//   - the new user turn: the last hash id's text, cut short as TokenSynth
//     cuts a prompt's partial last block.
//
// So two records that share their first k hash ids share their first k
// stretches of text and, rendered by a chat template whose earlier
// messages do not depend on later ones (ChatML-style templates), the
// tokens of those stretches: the conversation's earlier turns are the
// shared prefix. A follow-up whose predecessor ended at the same hash id
// extends the predecessor's whole prompt, generation prompt included,
// since the predecessor's last turn was a user message there too.
//
// Words are ASCII letters separated by single spaces, so that they need no
// escaping in JSON, and a tokenizer trained on such text (the demo's,
// benchmarks/demo/demotok) spends about one token per word: the trace's
// infinite-cache bound, computed with BlockWords tokens per hash id,
// approximates the chat workload's, which adds the template's tokens (a
// few per message) and the replies.
//
// The zero value makes full-size Mooncake conversations. A ChatSynth is a
// plain value, safe to share between goroutines.
type ChatSynth struct {
	// TraceBlockSize is the trace's tokens per hash id; 0 means
	// DefaultTraceBlockSize.
	TraceBlockSize int
	// BlockWords is how many words to emit per hash id; 0 means
	// TraceBlockSize. Fewer shrink every conversation by the same factor.
	BlockWords int
	// SystemIDs is how many leading hash ids make the system prompt; 0
	// means DefaultSystemIDs.
	SystemIDs int
	// Seed selects one of many equally valid texts.
	Seed uint64
	// Images, when set, puts images in some user turns (images.go): the
	// multimodal workload.
	Images *ImageSet
}

// normalized fills in defaults.
func (s ChatSynth) normalized() ChatSynth {
	if s.TraceBlockSize == 0 {
		s.TraceBlockSize = DefaultTraceBlockSize
	}
	if s.BlockWords == 0 {
		s.BlockWords = s.TraceBlockSize
	}
	if s.SystemIDs == 0 {
		s.SystemIDs = DefaultSystemIDs
	}
	return s
}

// Validate reports a configuration that cannot synthesise conversations.
func (s ChatSynth) Validate() error {
	s = s.normalized()
	if s.TraceBlockSize < 1 || s.TraceBlockSize > maxBlockTokens {
		return fmt.Errorf("cannot synthesise text with trace block size %d: want 1..%d", s.TraceBlockSize, maxBlockTokens)
	}
	if s.BlockWords < 1 || s.BlockWords > maxBlockTokens {
		return fmt.Errorf("cannot synthesise text with %d words per block: want 1..%d", s.BlockWords, maxBlockTokens)
	}
	if s.SystemIDs < 1 || s.SystemIDs > maxBlockTokens {
		return fmt.Errorf("cannot put %d hash ids in the system prompt: want 1..%d", s.SystemIDs, maxBlockTokens)
	}
	return nil
}

// systemIDs is how many of r's hash ids make its system prompt.
func (s ChatSynth) systemIDs(r *Record) int { return min(s.SystemIDs, len(r.HashIDs)-1) }

// lastWords is the length of r's new user turn.
func (s ChatSynth) lastWords(r *Record) int {
	return scaledBlockLen(r.lastBlockTokens(s.TraceBlockSize), s.TraceBlockSize, s.BlockWords)
}

// PromptLen returns the words and the messages of r's conversation. Its
// length in tokens is about the words plus a few template tokens per
// message, depending on the model's tokenizer and chat template.
func (s ChatSynth) PromptLen(r *Record) (words, messages int) {
	s = s.normalized()
	n, sys := len(r.HashIDs), s.systemIDs(r)
	words = sys*s.BlockWords + (n-1-sys)*(s.BlockWords+ReplyWords) + s.lastWords(r)
	messages = 2*(n-1-sys) + 1
	if sys > 0 {
		messages++
	}
	return words, messages
}

// AppendText appends the first n words of hash id's stretch of text to
// dst, separated by single spaces, with none before the first. It
// allocates nothing when dst has room.
func (s ChatSynth) AppendText(dst []byte, hashID uint64, n int) []byte {
	return appendWords(dst, mix64(s.Seed^mix64(hashID+0x3c6ef372fe94f82b)), n)
}

// appendReply appends the assistant's reply to the turn of hash id.
func (s ChatSynth) appendReply(dst []byte, hashID uint64) []byte {
	return appendWords(dst, mix64(s.Seed^mix64(hashID+0xa54ff53a5f1d36f1)), ReplyWords)
}

// appendWords appends n words of the stream that starts at state (the
// splitmix64 stream TokenSynth uses).
func appendWords(dst []byte, state uint64, n int) []byte {
	for i := range n {
		state += 0x9e3779b97f4a7c15
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = append(dst, chatVocab[(mix64(state)>>32)*chatVocabSize>>32]...)
	}
	return dst
}

// appendMessages appends r's conversation to dst as a JSON array of chat
// messages. It allocates nothing when dst has room.
func (s ChatSynth) appendMessages(dst []byte, r *Record) []byte {
	n, sys := len(r.HashIDs), s.systemIDs(r)
	dst = append(dst, '[')
	if sys > 0 {
		dst = append(dst, `{"role":"system","content":"`...)
		for j, id := range r.HashIDs[:sys] {
			if j > 0 {
				dst = append(dst, ' ')
			}
			dst = s.AppendText(dst, id, s.BlockWords)
		}
		dst = append(dst, `"},`...)
	}
	for _, id := range r.HashIDs[sys : n-1] {
		dst = append(dst, `{"role":"user","content":`...)
		dst = s.appendUserContent(dst, id, s.BlockWords)
		dst = append(dst, `},{"role":"assistant","content":"`...)
		dst = s.appendReply(dst, id)
		dst = append(dst, `"},`...)
	}
	dst = append(dst, `{"role":"user","content":`...)
	dst = s.appendUserContent(dst, r.HashIDs[n-1], s.lastWords(r))
	return append(dst, `}]`...)
}

// chatVocab is the vocabulary of synthesised text: pronounceable
// pseudo-words of one to three consonant-vowel syllables, made by a fixed
// generator, so that the text, and any tokenizer trained on it, never
// change.
var chatVocab = func() (v [chatVocabSize]string) {
	const consonants, vowels = "bdfghklmnprstvz", "aeiou"
	seen := make(map[string]bool, chatVocabSize)
	state := uint64(0x6b7666617374) // "kvfast"
	for i := 0; i < len(v); {
		state += 0x9e3779b97f4a7c15
		z := mix64(state)
		syllables := 1 + int(z%3)
		z /= 3
		w := make([]byte, 0, 6)
		for range syllables {
			w = append(w, consonants[z%uint64(len(consonants))], vowels[z/uint64(len(consonants))%uint64(len(vowels))])
			z /= uint64(len(consonants) * len(vowels))
		}
		if !seen[string(w)] {
			seen[string(w)] = true
			v[i] = string(w)
			i++
		}
	}
	return v
}()
