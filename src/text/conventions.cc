#include "shardtrain/text/conventions.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string_view>

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

const char* to_string(ChatTemplate t) {
  constexpr const char* kNames[] = {"none", "Llama 3 Instruct", "Qwen 2.5 Instruct", "Qwen3"};
  return kNames[static_cast<int>(t)];
}

namespace {

constexpr const char* kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// The added tokens of Qwen 2.5's tokenizer, ids 151643.. in this order after its 151643 vocabulary entries; Qwen3's
// holds the same, then kQwen3Added.
constexpr int32_t kQwenFirstAdded = 151643;
constexpr const char* kQwen2_5Added[] = {
    "<|endoftext|>",  "<|im_start|>",   "<|im_end|>",    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>",    "<|quad_start|>", "<|quad_end|>",  "<|vision_start|>",     "<|vision_end|>",     "<|vision_pad|>",
    "<|image_pad|>",  "<|video_pad|>",  "<tool_call>",   "</tool_call>",         "<|fim_prefix|>",     "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>",    "<|repo_name|>", "<|file_sep|>"};
constexpr const char* kQwen3Added[] = {"<tool_response>", "</tool_response>", "<think>", "</think>"};

// Whether names[k] is the token of id first + k, for each k.
template <size_t N>
bool holds_at(const Tokenizer& tok, int32_t first, const char* const (&names)[N]) {
  for (size_t k = 0; k < N; ++k)
    if (tok.token_id(names[k]) != std::optional<int32_t>(first + static_cast<int32_t>(k))) return false;
  return true;
}

// The chat template of a tokenizer of `family`, recognised by its added tokens: Meta Llama 3's tokenizer (ids 128008
// and 128010 still reserved: Llama 3.1 and later name them <|eom_id|> and <|python_tag|> and render another template),
// and Qwen 2.5's and Qwen3's, whose added tokens and vocabulary size are exactly theirs.
ChatTemplate chat_template_of(const Tokenizer& tok, TokenFamily family) {
  if (family == TokenFamily::kLlama3)
    return tok.token_id("<|reserved_special_token_4|>") == std::optional<int32_t>(128008) &&
                   tok.token_id("<|reserved_special_token_5|>") == std::optional<int32_t>(128010)
               ? ChatTemplate::kLlama3
               : ChatTemplate::kNone;
  if (family != TokenFamily::kChatml || !holds_at(tok, kQwenFirstAdded, kQwen2_5Added)) return ChatTemplate::kNone;
  constexpr auto kQwen3First = kQwenFirstAdded + static_cast<int32_t>(std::size(kQwen2_5Added));
  if (tok.vocab_size() == kQwen3First) return ChatTemplate::kQwen2_5;
  if (holds_at(tok, kQwen3First, kQwen3Added) && tok.vocab_size() == kQwen3First + 4) return ChatTemplate::kQwen3;
  return ChatTemplate::kNone;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

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
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
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
  chat_ = chat_template_of(tok, family_);
  if (chat_ == ChatTemplate::kQwen3) {
    think_ = id("<think>");
    end_think_ = id("</think>");
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

void Conventions::check_chat_template(const std::string& needs, const std::string& otherwise) const {
  if (chat_ == ChatTemplate::kNone)
    ST_BAD_INPUT(needs, " needs a tokenizer whose chat template shardtrain renders: ", to_string(ChatTemplate::kLlama3),
                 ", ", to_string(ChatTemplate::kQwen2_5), " or ", to_string(ChatTemplate::kQwen3),
                 ", each recognised by its tokenizer's added tokens; ", tok_.path(), " is a ", to_string(family_),
                 " tokenizer",
                 family_ == TokenFamily::kPlain || family_ == TokenFamily::kGpt2
                     ? ""
                     : " of another model (a template shardtrain cannot check against it is refused, not guessed)",
                 ": ", otherwise);
}

std::vector<int32_t> Conventions::chat_end_tokens() const {
  if (chat_ == ChatTemplate::kNone) return {};
  return chat_ == ChatTemplate::kLlama3 ? std::vector<int32_t>{eot_, end_} : std::vector<int32_t>{im_end_, end_};
}

std::vector<int32_t> Conventions::encode_chat_prompt(const std::vector<ChatMessage>& messages,
                                                     const std::string& where) const {
  EncodedDoc doc;
  encode_chat(messages, where, &doc);
  // The header alone, as the template ends the text with it: Llama 3's "\n\n" and ChatML's "assistant\n" are
  // pieces of their own after a special token.
  if (chat_ == ChatTemplate::kLlama3) {
    push(start_header_, 0, &doc);
    encode_split("assistant", "", 0, &doc);
    push(end_header_, 0, &doc);
    encode_split("\n\n", "", 0, &doc);
  } else {
    push(im_start_, 0, &doc);
    encode_split("assistant\n", "", 0, &doc);
  }
  return doc.ids;
}

void Conventions::encode_chat(const std::vector<ChatMessage>& messages, const std::string& where,
                              EncodedDoc* out) const {
  check_chat_template(where + ": --format chat", "use --format prompt or text");
  if (messages.empty()) ST_BAD_INPUT(where, ": \"messages\" is empty: expected at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      ST_BAD_INPUT(where, ": messages[", i, "].role is \"", r, "\": expected system, user or assistant");
  }
  if (chat_ == ChatTemplate::kLlama3) {
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
  // ChatML (Qwen 2.5, Qwen3): the system message first, then the others; the "\n" after each <|im_end|> is a piece
  // of its own between two special tokens. Qwen 2.5 adds its default system message; Qwen3 none.
  size_t first = 0;
  if (messages[0].role == "system" || chat_ == ChatTemplate::kQwen2_5) {
    const bool given = messages[0].role == "system";
    push(im_start_, 0, out);
    encode_split("system\n", given ? messages[0].content : kQwenDefaultSystem, 0, out);
    push(im_end_, 0, out);
    encode_split("\n", "", 0, out);
    first = given ? 1 : 0;
  }
  // Qwen3: the last assistant message after the last user query (a user message that is not a tool response) opens
  // with an empty thinking block, <think>\n\n</think>\n\n, its content's leading newlines stripped: the prompt of
  // Qwen3's non-thinking mode, masked as a role header is.
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const uint8_t trained = m.role == "assistant" ? 1 : 0;
    std::string_view content = m.content;
    if (chat_ == ChatTemplate::kQwen3 && trained && content.find("</think>") != std::string_view::npos)
      ST_BAD_INPUT(where, ": messages[", i,
                   "].content holds </think>: Qwen3's template moves the text before it out of ",
                   "the message as reasoning, which shardtrain does not render; give the answer without its reasoning");
    push(im_start_, 0, out);
    if (chat_ == ChatTemplate::kQwen3 && trained && i > last_query && i + 1 == messages.size()) {
      encode_split("assistant\n", "", 0, out);
      push(think_, 0, out);
      encode_split("\n\n", "", 0, out);
      push(end_think_, 0, out);
      while (!content.empty() && content.front() == '\n') content.remove_prefix(1);
      encode_split("\n\n", content, trained, out);
    } else {
      encode_split(m.role + "\n", content, trained, out);
    }
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
