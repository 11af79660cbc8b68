// node encode.mjs NPM_DIR TOKENIZER_DIR TEXTS.jsonl OUT.jsonl
//
// Hugging Face's transformers.js (installed in NPM_DIR from this folder's package-lock.json)
// encodes each text of TEXTS.jsonl (one JSON string a line) with the tokenizer.json and
// tokenizer_config.json of TOKENIZER_DIR, offline, and writes for each the JSON list
//   [encode(text), encode(text, {add_special_tokens: false}), decode(encode(text))]
// as tests/tools/tokenize_lines does for cleave.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [npmDir, tokenizerDir, textsPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const { env, AutoTokenizer } = require('@huggingface/transformers');
env.allowRemoteModels = false;
env.localModelPath = path.dirname(path.resolve(tokenizerDir));
const tokenizer = await AutoTokenizer.from_pretrained(path.basename(tokenizerDir));

const lines = [];
for (const line of fs.readFileSync(textsPath, 'utf8').split('\n')) {
  if (!line) continue;
  const text = JSON.parse(line);
  const ids = tokenizer.encode(text);
  const plain = tokenizer.encode(text, { add_special_tokens: false });
  // (decode refuses an empty list)
  const decoded = ids.length ? tokenizer.decode(ids, { clean_up_tokenization_spaces: false }) : '';
  lines.push(JSON.stringify([ids, plain, decoded]));
}
fs.writeFileSync(outPath, lines.join('\n') + '\n');
const version = JSON.parse(fs.readFileSync(
    path.join(npmDir, 'node_modules', '@huggingface', 'transformers', 'package.json'), 'utf8')).version;
console.log(`transformers.js ${version}: ` +
            `${tokenizer.constructor.name} from ${tokenizerDir}: ${lines.length} texts`);
