// Encodes texts with Hugging Face's own tokenizers, the reference demotok's
// tests hold the built-in tokenizer to.
//
//   node encode.mjs TOKENIZER_JSON < {"texts":[...],"add_special":BOOL}
//
// prints {"ids":[[ID,...],...]}, one array per text.
import fs from 'node:fs';
import { Tokenizer } from 'tokenizers';

const tok = Tokenizer.fromFile(process.argv[2]);
const req = JSON.parse(fs.readFileSync(0, 'utf8'));
const ids = [];
for (const text of req.texts) {
	const enc = await tok.encode(text, null, { addSpecialTokens: req.add_special });
	ids.push(Array.from(enc.getIds()));
}
process.stdout.write(JSON.stringify({ ids }) + '\n');
