// How a tokenizer's family lays out documents, chats and prompt/completion pairs as tokens, with the loss mask
// that fine-tuning trains on.
//
// The family is recognised from the tokenizer's added tokens:
//   llama3   <|begin_of_text|>, <|end_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>
//   chatml   <|im_start|>, <|im_end|>, <|endoftext|>            (Qwen 2, 2.5 and 3, SmolLM2)
//   gpt2     <|endoftext|>
// (checked in that order; a tokenizer with none of them is `plain`: documents need an explicit separator).
//
// Plain documents (text files, JSONL `text`): the separator token, then the text's tokens. The separator is
// llama3's <|begin_of_text|> and gpt2's and chatml's <|endoftext|>, placed before each document as llm.c does.
//
// Chats (`{"messages": [{"role": ..., "content": ...}, ...]}`) follow the chat templates of the models' own
// tokenizer_config.json, rendered for training (no generation prompt). The template is the tokenizer's model's, told
// apart by the added tokens (a tokenizer.json does not hold its template): any other tokenizer's chats are refused,
// naming the templates known, rather than rendered with a template that may not be its model's.
//   Llama 3 Instruct   a llama3 tokenizer whose ids 128008 and 128010 are still <|reserved_special_token_4|> and
//            <|reserved_special_token_5|> (Llama 3.1 and later name them <|eom_id|> and <|python_tag|> and render a
//            template with a dated system header): <|begin_of_text|> then per message
//            <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, CONTENT stripped of surrounding
//            whitespace (no system message is added)
//   Qwen 2.5 Instruct  a chatml tokenizer whose added tokens are Qwen 2.5's 22, ids 151643..151664, and no others:
//            per message <|im_start|>ROLE\nCONTENT<|im_end|>\n, preceded by the default system message "You are
//            Qwen, created by Alibaba Cloud. You are a helpful assistant." when the first message is not a system
//            message (the template without tools)
//   Qwen3    Qwen 2.5's added tokens and <tool_response>, </tool_response>, <think>, </think> (ids up to 151668): the
//            same without a default system message; the last message, when it is an assistant message after the
//            last user message, opens with an empty thinking block: <|im_start|>assistant\n<think>\n\n</think>\n\n
//            then CONTENT without its leading newlines (the prompt of Qwen3's non-thinking mode, masked as a header
//            is). An assistant message holding "</think>" (reasoning, which the template moves out of the message)
//            is refused.
// Models that ship one of these tokenizer.json files with another template (Qwen2.5-Math, QwQ) are rendered with the
// template above for their tokenizer, not their own.
// Roles are system, user and assistant. The loss mask keeps an assistant message's content and its end token
// (<|eot_id|>, <|im_end|>) and masks everything else, as an assistant-only loss does. The text between two
// special tokens is encoded as one piece, as Hugging Face encodes the rendered template; a token that straddles
// a role header and the content counts as content.
//
// Prompt/completion pairs (`{"prompt": ..., "completion": ...}`): the separator, PROMPT + COMPLETION encoded as one
// text, then the end token (llama3 <|end_of_text|>, gpt2 and chatml <|endoftext|>); the completion and the end
// token are trained on, the separator and the prompt are masked.
//
// Text inside a document, message, prompt or completion is encoded with added_tokens = false: the text
// "<|endoftext|>" in a document is ordinary text, never a separator or a role header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/text/tokenizer.h"

namespace st {

enum class TokenFamily { kLlama3, kChatml, kGpt2, kPlain };
const char* to_string(TokenFamily f);

// The chat template --format chat renders: the tokenizer's own model's, recognised by its added tokens (see above);
// kNone for any other tokenizer, whose chats are refused.
enum class ChatTemplate { kNone, kLlama3, kQwen2_5, kQwen3 };
const char* to_string(ChatTemplate t);

struct ChatMessage {
  std::string role;
  std::string content;
};

// Token ids and, for fine-tuning data, one mask byte a token (1: a training target).
struct EncodedDoc {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};

class Conventions {
 public:
  // Recognises the family of `tok`. `separator` overrides the document separator: an added token's content,
  // "none" (no separator), or empty (the family's; kBadInput for a plain tokenizer, naming it).
  Conventions(const Tokenizer& tok, const std::string& separator);

  const Tokenizer& tokenizer() const { return tok_; }
  TokenFamily family() const { return family_; }
  ChatTemplate chat_template() const { return chat_; }
  // The document separator's id, or -1 for none.
  int32_t separator() const { return separator_; }
  // "<|endoftext|>" etc., or "none": for messages.
  const std::string& separator_text() const { return separator_text_; }

  // Appends a plain document: the separator, then text's tokens (no mask).
  void encode_text(std::string_view text, std::vector<int32_t>* ids) const;
  // Appends a chat with its mask. kBadInput (prefixed with `where`, e.g. "chat.jsonl:12") for an unknown role or
  // a family without a chat template.
  void encode_chat(const std::vector<ChatMessage>& messages, const std::string& where, EncodedDoc* out) const;
  // A chat as a prompt for the assistant's next turn: encode_chat's ids, then the assistant's header, as
  // apply_chat_template(messages, add_generation_prompt=True) renders it: Llama 3
  // <|start_header_id|>assistant<|end_header_id|>\n\n, Qwen 2.5 and Qwen3 <|im_start|>assistant\n (Qwen3's thinking
  // mode, the template's default: no empty thinking block). The same refusals as encode_chat.
  std::vector<int32_t> encode_chat_prompt(const std::vector<ChatMessage>& messages, const std::string& where) const;
  // The ids that end an assistant's turn, where generation from encode_chat_prompt stops (the eos_token_id of these
  // models' generation_config.json): llama3 <|eot_id|> and <|end_of_text|>, chatml <|im_end|> and <|endoftext|>;
  // none without a chat template.
  std::vector<int32_t> chat_end_tokens() const;
  // kBadInput unless chat_template() is one shardtrain renders: "NEEDS needs a tokenizer whose chat template
  // shardtrain renders: ..., naming the tokenizer's file and family, then OTHERWISE (what to do instead).
  void check_chat_template(const std::string& needs, const std::string& otherwise) const;
  // Appends a prompt/completion pair with its mask.
  void encode_prompt(std::string_view prompt, std::string_view completion, EncodedDoc* out) const;

 private:
  // Appends the tokens of `prefix + body` (one piece of text), masking the tokens that belong to `prefix` alone
  // (the longest run of leading tokens shared with encode(prefix)) with 0 and the rest with `body_mask`.
  void encode_split(const std::string& prefix, std::string_view body, uint8_t body_mask, EncodedDoc* out) const;
  void push(int32_t id, uint8_t mask, EncodedDoc* out) const;

  const Tokenizer& tok_;
  TokenFamily family_ = TokenFamily::kPlain;
  ChatTemplate chat_ = ChatTemplate::kNone;
  int32_t separator_ = -1;
  std::string separator_text_ = "none";
  int32_t end_ = -1;  // the prompt/completion end token
  // llama3
  int32_t start_header_ = -1, end_header_ = -1, eot_ = -1;
  // chatml; Qwen3's thinking block
  int32_t im_start_ = -1, im_end_ = -1, think_ = -1, end_think_ = -1;
};

// Python's str.strip() (what the chat template's `trim` does): removes leading and trailing Unicode whitespace.
std::string_view strip_unicode_whitespace(std::string_view s);

}  // namespace st
