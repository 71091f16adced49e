// The differential oracle of the tokenizer package's tests: Hugging Face's
// own tokenizers (Rust, through its Node bindings) answering JSON lines on
// stdin, one answer line per request line, in order.
//
//   {"load":NAME,"file":PATH}            -> {"ok":true,"vocab":N} | {"error":MSG}
//   {"load":NAME,"json":TOKENIZER_JSON}  -> the same, from the file's text
//   {"encode":NAME,"texts":[B64,...],"add_special":BOOL}
//                                        -> {"ids":[B64,...]} | {"error":MSG}
//
// Each text's ids come back as base64 of little-endian uint32s: decoding
// a JSON number per token was most of the Go side's time in the sweep
// under the race detector.
//
// Texts travel as base64 of their bytes and become JS strings as Node decodes
// UTF-8 (each maximal invalid subsequence turns into one U+FFFD), which is
// the conversion the Go side applies to invalid UTF-8 too.
import { Tokenizer } from 'tokenizers';
import readline from 'node:readline';

const tokenizers = new Map();
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });

function load(req) {
  const tok = req.file !== undefined ? Tokenizer.fromFile(req.file) : Tokenizer.fromString(req.json);
  // Engines never truncate or pad a prompt, whatever tokenizer.json says.
  tok.disableTruncation();
  tok.disablePadding();
  tokenizers.set(req.load, tok);
  return { ok: true, vocab: tok.getVocabSize(true) };
}

async function encode(req) {
  const tok = tokenizers.get(req.encode);
  if (!tok) throw new Error(`no tokenizer named ${req.encode}`);
  const ids = [];
  for (const b64 of req.texts) {
    const text = Buffer.from(b64, 'base64').toString('utf8');
    const enc = await tok.encode(text, null, { addSpecialTokens: req.add_special });
    ids.push(Buffer.from(Uint32Array.from(enc.getIds()).buffer).toString('base64'));
  }
  return { ids };
}

for await (const line of rl) {
  if (line.trim() === '') continue;
  let answer;
  try {
    const req = JSON.parse(line);
    answer = req.load !== undefined ? load(req) : await encode(req);
  } catch (err) {
    answer = { error: String(err && err.message ? err.message : err) };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
}
