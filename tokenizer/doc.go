// Package tokenizer is kvfast's built-in tokenizer: it loads a Hugging
// Face tokenizer.json (and tokenizer_config.json) and turns text into the
// token ids the model's own tokenizer, Hugging Face's tokenizers library,
// would produce, so that the router can name the same KV blocks the engine
// does. It is pure Go.
//
// # Responsibility
//
// Encode reproduces tokenizers' encode(text, add_special_tokens) for BPE
// models, which is what the served families use: the byte-level ones
// (Llama 3, Qwen 2.5/3, DeepSeek V3, GPT-4o, gpt-oss) and SentencePiece-
// style ones with byte fallback (Llama 2, Mistral, Gemma). In order:
//
//   - added tokens, special or not, are found in the text (leftmost, then
//     longest) with their single_word, lstrip and rstrip rules, first
//     those matched in raw text, then, after normalization, those matched
//     in normalized text;
//   - the normalizer (Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip,
//     StripAccents, Replace, Prepend) rewrites the text between them;
//   - the pre-tokenizer (Sequence, Split with every behavior and invert,
//     ByteLevel, Metaspace, Digits, WhitespaceSplit, CharDelimiterSplit)
//     cuts it into words;
//   - the BPE model merges each word (merges as "a b" strings or [a, b]
//     pairs, byte fallback, ignore_merges, unk with fuse_unk, continuing-
//     subword prefix and end-of-word suffix);
//   - with addSpecial, the post-processor's tokens go around the result
//     (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel,
//     Sequence).
//
// New refuses, with an error, a file that uses anything else (another
// model type, BPE dropout, other normalizers or pre-tokenizers: the error
// wraps ErrUnsupported) or that the model's own loader would refuse,
// rather than tokenize it approximately. Truncation and padding settings are ignored:
// an engine never truncates or pads a prompt.
//
// Split patterns: the ones tokenizer.json files use for these families
// (GPT-2's, cl100k / Llama 3's, Qwen's, o200k's and DeepSeek V3's) have
// hand-written matchers that reproduce Oniguruma's leftmost-first,
// backtracking semantics; any other pattern runs on regexp2, which
// backtracks the same way but allocates.
//
// Text that is not valid UTF-8 (which cannot reach an engine through a
// JSON request) is read as a WHATWG decoder reads it, each maximal
// ill-formed subsequence becoming U+FFFD; Encode is total on any input.
//
// Config reports what tokenizer_config.json (and chat_template.jinja,
// which transformers prefers to the config's own template) says: the BOS
// and EOS tokens, the chat templates, add_bos_token, add_eos_token and
// tokenizer_class. Encode follows tokenizer.json alone (so that it can be
// checked against Hugging Face's tokenizers, which read only that file);
// transformers' Llama- and Gemma-style tokenizer classes rebuild the
// post-processor from add_bos_token and add_eos_token, and EngineAffixes
// gives the special tokens they put around a sequence, which the router's
// renderer (package prompt) uses.
//
// # Trust
//
// tokenizer.json is operator-supplied but treated as untrusted: its size,
// vocabulary, merges, added tokens, ids, token lengths, pattern lengths
// and nesting are bounded, a regexp2 search has a timeout, and malformed
// files fail with a "cannot …" error.
//
// # What it owns
//
// A Tokenizer is immutable once built and owns its vocabulary and merge
// tables. Encode's scratch memory lives in encode states that a
// sync.Pool keeps: each holds its buffers (capped, so that one huge
// prompt does not pin its memory) and a fixed-size cache of recent words'
// tokens. Callers own the dst slice they pass and get back.
//
// # Concurrency
//
// Encode, Config and VocabSize are safe for concurrent use; each Encode
// takes its own pooled state, so concurrent calls share nothing mutable.
package tokenizer
