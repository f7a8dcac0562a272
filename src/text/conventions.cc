#include "shardtrain/text/conventions.h"

#include <algorithm>
#include <optional>

#include "shardtrain/core/error.h"

namespace st {

const char* to_string(TokenFamily f) {
  switch (f) {
    case TokenFamily::kLlama3: return "llama3";
    case TokenFamily::kChatml: return "chatml";
    case TokenFamily::kGpt2: return "gpt2";
    case TokenFamily::kPlain: return "plain";
  }
  return "?";
}

namespace {

constexpr const char* kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The code point at s[i] and its length in bytes; a byte that does not start a valid sequence is returned as
// itself with length 1 (it is not whitespace either way).
std::pair<uint32_t, size_t> code_point_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (len <= 1 || i + len > s.size()) return {b, 1};
  uint32_t cp = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return {cp, len};
}

// Python's str.isspace() over the code points it is true for.
bool python_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace

std::string_view strip_unicode_whitespace(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const auto [cp, len] = code_point_at(s, begin);
    if (!python_isspace(cp)) break;
    begin += len;
  }
  // Scan forward, remembering where the last non-space code point ended (a backward scan would have to find
  // sequence starts).
  size_t end = begin;
  for (size_t i = begin; i < s.size();) {
    const auto [cp, len] = code_point_at(s, i);
    i += len;
    if (!python_isspace(cp)) end = i;
  }
  return s.substr(begin, end - begin);
}

Conventions::Conventions(const Tokenizer& tok, const std::string& separator) : tok_(tok) {
  const auto has = [&](const char* t) { return tok.token_id(t).has_value(); };
  const auto id = [&](const char* t) { return tok.added_token_id(t); };
  if (has("<|begin_of_text|>") && has("<|end_of_text|>") && has("<|start_header_id|>") && has("<|end_header_id|>") &&
      has("<|eot_id|>")) {
    family_ = TokenFamily::kLlama3;
    separator_text_ = "<|begin_of_text|>";
    end_ = id("<|end_of_text|>");
    start_header_ = id("<|start_header_id|>");
    end_header_ = id("<|end_header_id|>");
    eot_ = id("<|eot_id|>");
  } else if (has("<|im_start|>") && has("<|im_end|>") && has("<|endoftext|>")) {
    family_ = TokenFamily::kChatml;
    separator_text_ = "<|endoftext|>";
    end_ = id("<|endoftext|>");
    im_start_ = id("<|im_start|>");
    im_end_ = id("<|im_end|>");
  } else if (has("<|endoftext|>")) {
    family_ = TokenFamily::kGpt2;
    separator_text_ = "<|endoftext|>";
    end_ = id("<|endoftext|>");
  }
  if (!separator.empty()) separator_text_ = separator;
  if (separator_text_ == "none") {
    separator_ = -1;
  } else if (family_ == TokenFamily::kPlain && separator.empty()) {
    ST_BAD_INPUT("tokenizer ", tok.path(),
                 " has none of the document separators shardtrain knows (<|begin_of_text|>, <|endoftext|>): "
                 "give --separator TOKEN (one of its added tokens) or --separator none");
  } else {
    separator_ = tok.added_token_id(separator_text_);
  }
}

void Conventions::push(int32_t id, uint8_t mask, EncodedDoc* out) const {
  out->ids.push_back(id);
  out->mask.push_back(mask);
}

void Conventions::encode_text(std::string_view text, std::vector<int32_t>* ids) const {
  if (separator_ >= 0) ids->push_back(separator_);
  tok_.encode_into(text, /*added_tokens=*/false, ids);
}

void Conventions::encode_split(const std::string& prefix, std::string_view body, uint8_t body_mask,
                               EncodedDoc* out) const {
  std::string joint = prefix;
  joint.append(body);
  const std::vector<int32_t> all = tok_.encode(joint, /*added_tokens=*/false);
  const std::vector<int32_t> head = tok_.encode(prefix, /*added_tokens=*/false);
  const size_t shared =
      static_cast<size_t>(std::mismatch(head.begin(), head.end(), all.begin(), all.end()).first - head.begin());
  for (size_t i = 0; i < all.size(); ++i) push(all[i], i < shared ? 0 : body_mask, out);
}

void Conventions::encode_chat(const std::vector<ChatMessage>& messages, const std::string& where,
                              EncodedDoc* out) const {
  if (family_ != TokenFamily::kLlama3 && family_ != TokenFamily::kChatml)
    ST_BAD_INPUT(where, ": --format chat needs a tokenizer with a chat template shardtrain knows (Llama 3's "
                        "<|start_header_id|> or ChatML's <|im_start|>); ",
                 tok_.path(), " is a ", to_string(family_), " tokenizer: use --format prompt or text");
  if (messages.empty()) ST_BAD_INPUT(where, ": \"messages\" is empty: expected at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      ST_BAD_INPUT(where, ": messages[", i, "].role is \"", r, "\": expected system, user or assistant");
  }
  if (family_ == TokenFamily::kLlama3) {
    push(tok_.added_token_id("<|begin_of_text|>"), 0, out);
    for (const ChatMessage& m : messages) {
      const uint8_t trained = m.role == "assistant" ? 1 : 0;
      push(start_header_, 0, out);
      encode_split(m.role, "", 0, out);
      push(end_header_, 0, out);
      encode_split("\n\n", strip_unicode_whitespace(m.content), trained, out);
      push(eot_, trained, out);
    }
    return;
  }
  // ChatML (Qwen 2.5): the system message first, then the others; the "\n" after each <|im_end|> is a piece
  // of its own between two special tokens.
  size_t first = 0;
  push(im_start_, 0, out);
  if (messages[0].role == "system") {
    encode_split("system\n", messages[0].content, 0, out);
    first = 1;
  } else {
    encode_split("system\n", kQwenDefaultSystem, 0, out);
  }
  push(im_end_, 0, out);
  encode_split("\n", "", 0, out);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const uint8_t trained = m.role == "assistant" ? 1 : 0;
    push(im_start_, 0, out);
    encode_split(m.role + "\n", m.content, trained, out);
    push(im_end_, trained, out);
    encode_split("\n", "", 0, out);
  }
}

void Conventions::encode_prompt(std::string_view prompt, std::string_view completion, EncodedDoc* out) const {
  if (end_ < 0)
    ST_BAD_INPUT("--format prompt needs an end-of-text token (<|end_of_text|> or <|endoftext|>); ", tok_.path(),
                 " has neither");
  if (separator_ >= 0) push(separator_, 0, out);
  encode_split(std::string(prompt), completion, 1, out);
  push(end_, 1, out);
}

}  // namespace st
