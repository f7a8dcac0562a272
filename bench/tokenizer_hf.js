#!/usr/bin/env node
// Hugging Face tokenizers' encoding throughput on one text file, timed as bench/tokenizer.cc times shardtrain's: one
// encode of the whole text (single sentence, no special tokens added), and encodeBatch of the text cut into
// documents of about --doc-bytes, on the cores Rayon uses (RAYON_NUM_THREADS, default all). The library is
// @anush008/tokenizers, the Rust tokenizers through Node, as installed by `npm ci --prefix tests/text/reference`.
//
//   node bench/tokenizer_hf.js --tokenizer tokenizer.json --text /usr/share/common-licenses/GPL-3 [--iters 20]
//                              [--doc-bytes 4096]
'use strict';
const path = require('path');
const fs = require('fs');
const {Tokenizer} = require(path.join(__dirname, '..', 'tests', 'text', 'reference', 'node_modules',
    '@anush008', 'tokenizers'));

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

async function medianSeconds(iters, fn) {
  await fn();
  const t = [];
  for (let i = 0; i < iters; ++i) {
    const t0 = process.hrtime.bigint();
    await fn();
    t.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return median(t);
}

async function main() {
  const args = {iters: 20, 'doc-bytes': 4096};
  const argv = process.argv.slice(2);
  for (let i = 0; i + 1 < argv.length; i += 2) args[argv[i].replace(/^--/, '')] = argv[i + 1];
  if (!args.tokenizer || !args.text) throw new Error('--tokenizer and --text are needed');
  const bytes = fs.readFileSync(args.text);
  const text = bytes.toString('utf8');
  const mb = bytes.length / 1e6;
  const iters = Number(args.iters);
  const t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(args.tokenizer);
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;

  let n = 0;
  const one = await medianSeconds(iters, async () => {
    n = (await tok.encode(text, null, {addSpecialTokens: false})).getIds().length;
  });
  const docs = [];
  for (let begin = 0; begin < text.length;) {
    let end = text.indexOf('\n', Math.min(text.length, begin + Number(args['doc-bytes'])));
    end = end < 0 ? text.length : end + 1;
    docs.push(text.slice(begin, end));
    begin = end;
  }
  const copies = 8;
  const batch = [].concat(...Array(copies).fill(docs));
  const many = await medianSeconds(iters, async () => {
    await tok.encodeBatch(batch, {addSpecialTokens: false});
  });
  console.log(`tokenizer ${args.tokenizer}\ntext ${args.text}: ${bytes.length} bytes, ${n} tokens; load ` +
              `${loadS.toFixed(2)} s`);
  console.log(`${'case'.padEnd(34)} ${'MB/s'.padStart(10)}`);
  console.log(`${'1 thread, whole text'.padEnd(34)} ${(mb / one).toFixed(1).padStart(10)}`);
  console.log(`${`encodeBatch, ${batch.length} documents`.padEnd(34)} ${(mb * copies / many).toFixed(1).padStart(10)}`);
}

main().catch((e) => {
  console.error(`tokenizer_hf.js: ${e.message}`);
  process.exit(2);
});
