// Trains the demo's byte-level BPE tokenizer with Hugging Face's own
// tokenizers library and writes its tokenizer.json and
// tokenizer_config.json.
//
//   node train.mjs CORPUS DIR
//
// CORPUS is the text to train on (demotok's TestFilesRegenerate writes it
// from the replay's text generator); DIR is where the files go. The
// tokenizer is a Llama 3-style tokenizer: its pre-tokenizer splits with Llama
// 3's pattern and maps bytes to characters, its model is byte-level BPE
// over all 256 bytes plus the merges learnt from CORPUS (trained until no
// pair is left, which on that text is a few thousand), the special tokens
// of a ChatML chat template follow the vocabulary, and the post-processor
// puts the BOS token in front of a prompt encoded with special tokens.
// Training is deterministic: the same corpus gives the same file. The
// config names the BOS and EOS tokens and holds a short ChatML chat
// template, written here.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Tokenizer } from 'tokenizers';

const [corpus, dir] = process.argv.slice(2);
if (!corpus || !dir) {
	console.error('usage: node train.mjs CORPUS DIR');
	process.exit(2);
}

// Llama 3's split pattern, as its tokenizer.json has it.
const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const preTokenizer = {
	type: 'Sequence',
	pretokenizers: [
		{ type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
		{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
	],
};
const bpe = (vocab, merges) => ({
	type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
	fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
});
const config = (extra) => ({
	version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
	pre_tokenizer: preTokenizer, post_processor: null, decoder: null, ...extra,
});

// The JS bindings take no trainer settings: train() runs the model's
// default BPE trainer, which merges until no pair is left.
const trainer = Tokenizer.fromString(JSON.stringify(config({ model: bpe({}, []) })));
trainer.train([corpus]);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'demotok-'));
const trainedPath = path.join(tmp, 'trained.json');
trainer.save(trainedPath, false);
const trained = JSON.parse(fs.readFileSync(trainedPath, 'utf8')).model;
fs.rmSync(tmp, { recursive: true });

// The trainer's alphabet is the bytes the corpus has; a byte-level
// tokenizer needs all 256, in GPT-2's byte-to-character mapping, so that
// any text encodes. They take ids 0..255 in byte order, and the learnt
// tokens follow in the order the trainer gave them.
const byteChars = [];
{
	const printable = [];
	for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
	for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
	for (let b = 0xae; b <= 0xff; b++) printable.push(b);
	let next = 256;
	for (let b = 0; b < 256; b++) {
		byteChars.push(String.fromCodePoint(printable.includes(b) ? b : next++));
	}
}
const vocab = {};
byteChars.forEach((c, i) => { vocab[c] = i; });
let id = byteChars.length;
for (const [token] of Object.entries(trained.vocab).sort((a, b) => a[1] - b[1])) {
	if (!(token in vocab)) vocab[token] = id++;
}

// ChatML's special tokens, and a BOS and an end-of-text token as Qwen and
// Llama 3 have them.
const specials = ['<|startoftext|>', '<|endoftext|>', '<|im_start|>', '<|im_end|>'];
const added = specials.map((content) => ({
	id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const bos = added[0];

const final = config({
	added_tokens: added,
	post_processor: {
		type: 'Sequence',
		processors: [
			{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
			{
				type: 'TemplateProcessing',
				single: [{ SpecialToken: { id: bos.content, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
				pair: [
					{ SpecialToken: { id: bos.content, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
					{ SpecialToken: { id: bos.content, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } },
				],
				special_tokens: { [bos.content]: { id: bos.content, ids: [bos.id], tokens: [bos.content] } },
			},
		],
	},
	decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
	model: bpe(vocab, trained.merges),
});

// Loading the result checks it; saving it again writes it as the library
// itself serializes a tokenizer.
const tok = Tokenizer.fromString(JSON.stringify(final));
tok.save(path.join(dir, 'tokenizer.json'), true);

// ChatML: each message between <|im_start|>ROLE\n and <|im_end|>\n, after
// the BOS token; a message without content renders empty.
const chatTemplate = [
	"{{- bos_token }}",
	"{%- for message in messages %}",
	"{{- '<|im_start|>' + message['role'] + '\\n' }}",
	"{%- if message['content'] %}{{ message['content'] }}{% endif %}",
	"{{- '<|im_end|>\\n' }}",
	"{%- endfor %}",
	"{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
	"",
].join('\n');
const tokenizerConfig = {
	added_tokens_decoder: Object.fromEntries(added.map((t) => [String(t.id), {
		content: t.content, lstrip: t.lstrip, normalized: t.normalized, rstrip: t.rstrip,
		single_word: t.single_word, special: t.special,
	}])),
	bos_token: bos.content,
	chat_template: chatTemplate,
	clean_up_tokenization_spaces: false,
	eos_token: '<|im_end|>',
	model_max_length: 131072,
	pad_token: '<|endoftext|>',
	tokenizer_class: 'PreTrainedTokenizerFast',
};
fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig, null, 2) + '\n');
