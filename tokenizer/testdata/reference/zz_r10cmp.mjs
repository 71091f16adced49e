import { Tokenizer } from 'tokenizers';
import fs from 'node:fs';
const t=Tokenizer.fromFile(process.argv[2]); t.disableTruncation(); t.disablePadding();
const s=fs.readFileSync(0).toString('utf8');
const e=await t.encode(s,null,{addSpecialTokens:true});
console.log(JSON.stringify(Array.from(e.getIds())));
