// Package demotok is the demo's tokenizer: a small but real Hugging Face
// tokenizer, compiled into the binary, that the mock engines and the
// router of kvfast demo's chat workload share, so that the demo needs no
// model download.
//
// # Responsibility
//
// It holds tokenizer.json and tokenizer_config.json (files/) and hands
// them out: WriteDir writes them where a --tokenizer MODEL=DIR spec can
// load them, and Open loads them as package prompt's built-in renderer.
// The tokenizer is Llama 3-shaped: Llama 3's split pattern, byte-level
// BPE over all 256 bytes with a few thousand merges, a BOS token the
// post-processor adds to completions prompts, and a ChatML chat template
// (<|im_start|>ROLE\n ... <|im_end|>\n) that starts with the BOS token.
// Its merges were learnt by Hugging Face's own tokenizers library (the
// npm package, pinned in testdata/train) from text of the replay's chat
// workload (replay.ChatSynth), on which it spends one token per word.
// TestFilesRegenerate retrains it and checks that the files are exactly
// what that library makes; run it with -update to rewrite them.
//
// # Ownership and concurrency
//
// The files are read-only bytes. WriteDir and Open may be called from any
// goroutine; what they create belongs to the caller.
package demotok
