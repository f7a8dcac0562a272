// The prompts of `shardtrain generate` as token ids, each with what ends its sequence, from --prompt, --prompt-ids or
// --prompts (text/prompt_file.h), all read and checked before anything is decoded; and the codec the output is
// decoded with.
//
// The tokenizer (--tokenizer, or the run's data.tokenizer; bytes for a byte-level model) is read only when text needs
// it: a text prompt, a chat or --stop. Ids in and out open none, so a checkpoint whose recorded tokenizer file has
// moved still generates ids. A text prompt is a new document (TokenizerCodec::encode: the separator first); with
// --chat, it is a user message rendered with the chat template and the assistant's header
// (Conventions::encode_chat_prompt), as a "messages" line is. A chat ends at the template's end tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "generate_args.h"
#include "shardtrain/core/config.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/text/completion.h"

struct GeneratePrompts {
  std::vector<std::vector<int32_t>> ids;         // each prompt's, 1 to model.seq_len tokens
  std::vector<std::vector<int32_t>> end_tokens;  // each prompt's: the chat's end tokens, or none
  std::unique_ptr<st::TextCodec> codec;          // null: ids only (no prompt is text and no --stop)

  // One Completion per prompt: the codec's text stream (none without a codec), its end tokens and `stops`.
  std::vector<st::Completion> completions(const std::vector<std::string>& stops) const;
};

// kBadInput naming the flag or FILE:LINE and the field: a prompt file's refusals (prompt_file.h), an id outside the
// vocabulary, a prompt longer than model.seq_len or empty, text without a tokenizer, a chat without a template
// shardtrain renders (naming the tokenizer file).
GeneratePrompts read_generate_prompts(const GenerateArgs& g, const st::Config& cfg);
