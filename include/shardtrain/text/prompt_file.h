// The prompts file of `shardtrain generate --prompts FILE`: one prompt a line, read whole (and every line checked)
// before anything is decoded.
//
// A file whose name ends in .jsonl or .json is JSONL (the rule of `tokenize --format auto`); any other is text.
//   text    each line is a prompt's text (a trailing \r, of a CRLF file, is not part of it);
//   JSONL   each line is an object with exactly one of
//             "prompt": "TEXT"                          text, as a text line
//             "prompt_ids": [1, 2, 3]                   token ids, each in [0, vocab_size)
//             "messages": [{"role": R, "content": C}]   a chat (roles system, user, assistant: conventions.h)
//           and no other field; a message has exactly "role" and "content", both strings.
// Blank lines (nothing but spaces, tabs and \r) hold no prompt and are skipped: prompt i is the i-th line that is
// not blank. Each refusal is kBadInput naming FILE:LINE, the field and what was expected against what was found; a
// file with no prompt is refused.
//
//   for (const PromptLine& p : read_prompt_file("prompts.jsonl", cfg.model.vocab_size)) ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/text/conventions.h"

namespace st {

struct PromptLine {
  enum class Kind { kText, kIds, kChat };
  Kind kind = Kind::kText;
  std::string text;                   // kText: the line, or "prompt" (not empty)
  std::vector<int32_t> ids;           // kIds: "prompt_ids" (not empty, each in the vocabulary)
  std::vector<ChatMessage> messages;  // kChat: "messages" (not empty; roles are checked when it is rendered)
  std::string where;                  // "FILE:LINE", for messages about this prompt
};

// Whether `path` is read as JSONL (its name ends in .jsonl or .json) rather than text lines.
bool is_jsonl_prompt_file(const std::string& path);

// The prompts of `path`, in order; vocab_size bounds "prompt_ids". Files over 1 GiB are refused unread.
std::vector<PromptLine> read_prompt_file(const std::string& path, int vocab_size);

}  // namespace st
