#include "generate_prompts.h"

#include <optional>
#include <sstream>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/text/conventions.h"
#include "shardtrain/text/prompt_file.h"
#include "shardtrain/text/tokenizer_codec.h"

namespace {

// --prompt-ids: comma-separated ids in [0, vocab_size).
std::vector<int32_t> parse_ids(const std::string& list, int vocab_size) {
  std::vector<int32_t> ids;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const int64_t id = parse_integer("--prompt-ids", item, "comma-separated token ids");
    if (id < 0 || id >= vocab_size)
      ST_BAD_INPUT("--prompt-ids: token ", id, " is outside the model's vocabulary [0, ", vocab_size,
                   ") (model.vocab_size)");
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) ST_BAD_INPUT("--prompt-ids '", st::excerpt(list), "' holds no token id");
  return ids;
}

// The prompts as read, before the tokenizer: --prompt and --prompt-ids as one line of a prompts file.
std::vector<st::PromptLine> prompt_lines(const GenerateArgs& g, int vocab_size) {
  if (g.prompts_file) return st::read_prompt_file(*g.prompts_file, vocab_size);
  st::PromptLine p;
  if (g.prompt) {
    p.text = *g.prompt;
    p.where = "--prompt";
    if (p.text.empty()) ST_BAD_INPUT("--prompt is empty: give at least one byte of text");
  } else {
    p.kind = st::PromptLine::Kind::kIds;
    p.ids = parse_ids(*g.prompt_ids, vocab_size);
    p.where = "--prompt-ids";
  }
  return {p};
}

// The chat layouts of the codec's tokenizer; kBadInput naming `needs` when it has none that shardtrain renders.
const st::Conventions& chat_conventions(const st::TextCodec* codec, std::optional<st::Conventions>* conv,
                                        const std::string& needs, const std::string& otherwise) {
  if (!conv->has_value()) {
    const auto* tok = dynamic_cast<const st::TokenizerCodec*>(codec);
    if (tok == nullptr)
      ST_BAD_INPUT(needs, " needs a tokenizer with a chat template, and this byte-level model reads text without one: ",
                   "give --tokenizer FILE (a tokenizer.json)");
    conv->emplace(tok->tokenizer(), "none");
  }
  (*conv)->check_chat_template(needs, otherwise);
  return **conv;
}

}  // namespace

std::vector<st::Completion> GeneratePrompts::completions(const std::vector<std::string>& stops) const {
  std::vector<st::Completion> out;
  for (size_t s = 0; s < ids.size(); ++s) out.emplace_back(codec ? codec->stream() : nullptr, end_tokens[s], stops);
  return out;
}

GeneratePrompts read_generate_prompts(const GenerateArgs& g, const st::Config& cfg) {
  const std::vector<st::PromptLine> lines = prompt_lines(g, cfg.model.vocab_size);
  // What needs the tokenizer, for the message when there is none: the first text, or --stop; and what else to do.
  std::string text_from, instead;
  for (const st::PromptLine& p : lines)
    if (text_from.empty() && p.kind != st::PromptLine::Kind::kIds) {
      const bool flag = p.where == "--prompt";
      text_from = flag ? std::string("--prompt TEXT") : p.where + " (text)";
      instead = flag ? ", or the prompt as token ids with --prompt-ids 1,2,3" : ", or the prompt as \"prompt_ids\"";
    }
  if (text_from.empty() && !g.stops.empty()) text_from = "--stop";
  GeneratePrompts out;
  if (!text_from.empty()) {
    out.codec = st::make_text_codec(cfg.data.tokenizer, cfg.model.vocab_size, "--tokenizer (data.tokenizer)");
    if (!out.codec)
      ST_BAD_INPUT(text_from, " needs a tokenizer for this model's vocabulary of ", cfg.model.vocab_size,
                   " tokens (model.vocab_size; text is read without one only by byte-level models, vocab_size 256): "
                   "give --tokenizer FILE (its tokenizer.json)",
                   instead);
  }
  std::optional<st::Conventions> conv;
  for (const st::PromptLine& p : lines) {
    std::vector<int32_t> ids = p.ids;
    std::vector<int32_t> ends;
    const bool chat = p.kind == st::PromptLine::Kind::kChat || (g.chat && p.kind == st::PromptLine::Kind::kText);
    if (chat) {
      const bool messages = p.kind == st::PromptLine::Kind::kChat;
      const st::Conventions& c = chat_conventions(
          out.codec.get(), &conv, messages ? p.where + ": \"messages\"" : "--chat",
          messages ? "give the prompt as \"prompt\" or \"prompt_ids\"" : "give the prompt without --chat");
      ids = c.encode_chat_prompt(messages ? p.messages : std::vector<st::ChatMessage>{{"user", p.text}}, p.where);
      ends = c.chat_end_tokens();
    } else if (p.kind == st::PromptLine::Kind::kText) {
      ids = out.codec->encode(p.text);
    }
    if (static_cast<int64_t>(ids.size()) > cfg.model.seq_len)
      ST_BAD_INPUT(p.where, p.where.rfind("--", 0) == 0 ? "" : ": the prompt", " holds ", ids.size(),
                   " tokens; the model reads at most ", cfg.model.seq_len, " (model.seq_len)");
    out.ids.push_back(std::move(ids));
    out.end_tokens.push_back(std::move(ends));
  }
  return out;
}
