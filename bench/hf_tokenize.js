// Hugging Face tokenizers' batch encode (Rust, all cores through its own thread pool) over a JSONL file's "text"
// fields: the peer of `shardtrain tokenize` in bench/tokenize_throughput.sh. Prints one JSON line.
//
//   node bench/hf_tokenize.js TOKENIZER.json DOCS.jsonl [BATCH_DOCS]
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '../tests/text/reference/node_modules/@anush008/tokenizers'));

async function main() {
  const [tokPath, docsPath, batchArg] = process.argv.slice(2);
  const batchDocs = Number(batchArg || 4096);
  const t0 = process.hrtime.bigint();
  const docs = fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l).text);
  const t1 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  let tokens = 0, bytes = 0;
  for (const d of docs) bytes += Buffer.byteLength(d, 'utf8');
  const t2 = process.hrtime.bigint();
  for (let i = 0; i < docs.length; i += batchDocs) {
    const out = await tok.encodeBatch(docs.slice(i, i + batchDocs), { addSpecialTokens: false });
    for (const e of out) tokens += e.getIds().length;
  }
  const t3 = process.hrtime.bigint();
  const s = (a, b) => Number(b - a) / 1e9;
  console.log(JSON.stringify({ documents: docs.length, bytes, tokens, read_parse_s: s(t0, t1), encode_s: s(t2, t3),
                               mb_per_s: bytes / s(t2, t3) / 1e6 }));
}
main().catch((e) => { console.error(e); process.exit(1); });
