// Hugging Face's own loader accepts more than the encoder implements and fills gaps with defaults; here each field
// that would change the ids is read explicitly, and whatever the encoder would not reproduce is refused rather
// than silently tokenized differently.
#include "tokenizer_json.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "byte_level.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/small_file.h"
#include "shardtrain/text/tokenizer.h"
#include "split_regex.h"

namespace st::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shown(const json& v) { return excerpt(v.dump()); }

// The fields of one JSON object, each named by its path from the root ("model.vocab") in messages.
class Fields {
 public:
  Fields(const json& j, std::string file, std::string prefix)
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  std::string name(const std::string& field) const { return prefix_.empty() ? field : prefix_ + "." + field; }

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    ST_BAD_INPUT(file_, ": field ", name(field), " ", why);
  }

  bool present(const std::string& field) const { return j_.contains(field) && !j_.at(field).is_null(); }
  const json& at(const std::string& field) const { return j_.at(field); }

  std::string string(const std::string& field) const {
    if (!present(field)) bad(field, "is missing, expected a string");
    if (!at(field).is_string()) bad(field, "is " + shown(at(field)) + ", expected a string");
    return at(field).get<std::string>();
  }

  bool boolean_or(const std::string& field, bool fallback) const {
    if (!present(field)) return fallback;
    if (!at(field).is_boolean()) bad(field, "is " + shown(at(field)) + ", expected true or false");
    return at(field).get<bool>();
  }

  // The object's "type", which must be one of `accepted` (a description for the message).
  std::string type(const std::string& accepted) const {
    if (!present("type")) bad("type", "is missing, expected " + accepted);
    if (!at("type").is_string()) bad("type", "is " + shown(at("type")) + ", expected " + accepted);
    return at("type").get<std::string>();
  }

  // A field that must be absent, null, or equal to `allowed` (when given).
  void must_be_unset(const std::string& field, const std::string& why, const json* allowed = nullptr) const {
    if (!present(field)) return;
    if (allowed != nullptr && at(field) == *allowed) return;
    bad(field, "is " + shown(at(field)) + ", expected null" +
                   (allowed != nullptr ? " or " + shown(*allowed) : std::string()) + ": " + why);
  }

  Fields object(const std::string& field) const {
    if (!present(field) || !at(field).is_object())
      bad(field, "is " + shown(j_.value(field, json())) + ", expected a JSON object");
    return Fields(at(field), file_, name(field));
  }
  Fields element(const std::string& field, size_t i) const {
    const json& e = at(field).at(i);
    const std::string n = name(field) + "[" + std::to_string(i) + "]";
    if (!e.is_object()) ST_BAD_INPUT(file_, ": field ", n, " is ", shown(e), ", expected a JSON object");
    return Fields(e, file_, n);
  }

  const std::string& file() const { return file_; }

 private:
  const json& j_;
  std::string file_;
  std::string prefix_;
};

std::string read_file(const std::string& path) {
  // A directory is what Hugging Face's from_pretrained takes; here the file itself is named, so that the run
  // records which file it read.
  std::string not_regular = "(expected a Hugging Face tokenizer.json file)";
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string inside = (fs::path(path) / "tokenizer.json").string();
    not_regular = fs::is_regular_file(inside, ec)
                      ? "(it holds a tokenizer.json: did you mean " + inside + "?)"
                      : "(expected a Hugging Face tokenizer.json file; the directory holds none)";
  }
  return read_small_file(path, {"tokenizer file " + path, "a tokenizer file", kMaxTokenizerBytes, not_regular});
}

// Vocab spelling -> id, over the strings of TokenizerSpec::vocab (which outlives it).
using VocabIndex = std::unordered_map<std::string_view, int32_t>;

// model: a byte-level BPE.
void read_model(const Fields& model, TokenizerSpec* spec, VocabIndex* index) {
  const std::string type = model.type("\"BPE\"");
  if (type != "BPE") {
    model.bad("type", "is \"" + excerpt(type) +
                          "\", expected \"BPE\" (shardtrain's tokenizer implements byte-level "
                          "BPE, as GPT-2, Llama 3 and Qwen 2.5 use)");
  }
  model.must_be_unset("dropout", "BPE dropout samples different merges on every call");
  const json empty_string = "";
  model.must_be_unset("continuing_subword_prefix", "a byte-level BPE marks no word continuations", &empty_string);
  model.must_be_unset("end_of_word_suffix", "a byte-level BPE marks no word ends", &empty_string);
  if (model.boolean_or("byte_fallback", false)) {
    model.bad("byte_fallback",
              "is true, expected false: byte fallback (<0xNN> tokens) belongs to SentencePiece-style BPE, not to "
              "byte-level BPE");
  }
  spec->ignore_merges = model.boolean_or("ignore_merges", false);

  // vocab: spelling -> id, ids exactly 0..N-1.
  if (!model.present("vocab") || !model.at("vocab").is_object() || model.at("vocab").empty()) {
    model.bad("vocab", "is " + shown(model.present("vocab") ? model.at("vocab") : json()) +
                           ", expected an object of token -> id");
  }
  const json& vocab = model.at("vocab");
  spec->vocab.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const json& v = it.value();
    const std::string field = "vocab[" + excerpt(it.key()) + "]";
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(vocab.size())) {
      model.bad(field, "is " + shown(v) + ", expected an id in 0.." + std::to_string(vocab.size() - 1) +
                           " (the vocab's ids are 0..N-1, N = " + std::to_string(vocab.size()) + " entries)");
    }
    const auto id = v.get<int64_t>();
    if (seen[id]) {
      model.bad(field, "is " + std::to_string(id) + ", which \"" + excerpt(spec->vocab[id]) +
                           "\" has too; expected each id once");
    }
    seen[id] = true;
    spec->vocab[id] = it.key();
  }
  index->reserve(spec->vocab.size());
  for (size_t id = 0; id < spec->vocab.size(); ++id) index->emplace(spec->vocab[id], static_cast<int32_t>(id));
  for (int b = 0; b < 256; ++b) {
    std::string spelling = byte_level_encode(std::string(1, static_cast<char>(b)));
    if (index->count(spelling) == 0) {
      model.bad("vocab", "has no entry \"" + excerpt(spelling) + "\" (byte " + std::to_string(b) +
                             "), expected all 256 byte-level symbols: every byte must have a token");
    }
  }

  // merges: "a b" (before tokenizers 0.20) or ["a", "b"], each part and their concatenation in the vocab.
  if (!model.present("merges") || !model.at("merges").is_array()) {
    model.bad("merges",
              "is " + shown(model.present("merges") ? model.at("merges") : json()) + ", expected a list of merges");
  }
  const json& merges = model.at("merges");
  spec->merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string field = "merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      if (s.rfind("#version", 0) == 0) continue;  // Hugging Face skips a merges.txt header line
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        model.bad(field, "is " + shown(m) + ", expected two tokens separated by one space");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      model.bad(field, "is " + shown(m) + ", expected \"a b\" or [\"a\", \"b\"]");
    }
    const auto id_of = [&](const std::string& token) {
      const auto it = index->find(token);
      if (it == index->end()) {
        model.bad(field, "is " + shown(m) + ": \"" + excerpt(token) +
                             "\" is not in model.vocab; expected a merge "
                             "of two vocab tokens into a vocab token");
      }
      return it->second;
    };
    const int32_t left = id_of(a), right = id_of(b), merged = id_of(a + b);
    spec->merges.push_back(TokenizerSpec::Merge{left, right, merged});
  }
}

void read_normalizer(const Fields& root, TokenizerSpec* spec) {
  if (!root.present("normalizer")) return;
  const Fields n = root.object("normalizer");
  const std::string type = n.type("\"NFC\" (or normalizer null)");
  if (type != "NFC") {
    n.bad("type", "is \"" + excerpt(type) +
                      "\", expected \"NFC\" or normalizer null (the normalizers of "
                      "byte-level BPEs such as Qwen 2.5's)");
  }
  spec->nfc = true;
}

// A ByteLevel pre-tokenizer's options: no prefix space; use_regex as required.
void check_byte_level(const Fields& b, bool use_regex) {
  if (b.boolean_or("add_prefix_space", true)) {
    b.bad("add_prefix_space", "is " + std::string(b.present("add_prefix_space") ? "true" : "missing (true)") +
                                  ", expected false: a space prepended to every text is not implemented");
  }
  const bool actual = b.boolean_or("use_regex", true);
  if (actual != use_regex) {
    b.bad("use_regex", std::string("is ") + (actual ? "true" : "false") + ", expected " +
                           (use_regex ? "true (ByteLevel alone splits with GPT-2's regex)"
                                      : "false (after a Split, ByteLevel only maps bytes)"));
  }
}

void read_pre_tokenizer(const Fields& root, TokenizerSpec* spec) {
  const std::string accepted = "\"ByteLevel\" or \"Sequence\" of Split and ByteLevel";
  const Fields p = root.object("pre_tokenizer");
  const std::string type = p.type(accepted);
  if (type == "ByteLevel") {
    check_byte_level(p, /*use_regex=*/true);
    spec->split_pattern = kGpt2SplitPattern;
    spec->split_field = p.file() + ": field pre_tokenizer (ByteLevel's GPT-2 pattern)";
    return;
  }
  if (type != "Sequence") p.bad("type", "is \"" + excerpt(type) + "\", expected " + accepted);
  if (!p.present("pretokenizers") || !p.at("pretokenizers").is_array() || p.at("pretokenizers").size() != 2) {
    p.bad("pretokenizers",
          "is " + shown(p.present("pretokenizers") ? p.at("pretokenizers") : json()) + ", expected [Split, ByteLevel]");
  }
  const Fields split = p.element("pretokenizers", 0);
  const std::string split_type = split.type("\"Split\"");
  if (split_type != "Split") split.bad("type", "is \"" + excerpt(split_type) + "\", expected \"Split\"");
  const Fields pattern = split.object("pattern");
  if (!pattern.present("Regex") || !pattern.at("Regex").is_string()) {
    pattern.bad("Regex", "is missing, expected the split regex (a {\"String\": ...} pattern is not implemented)");
  }
  spec->split_pattern = pattern.string("Regex");
  spec->split_field = p.file() + ": field " + pattern.name("Regex");
  const std::string behavior = split.string("behavior");
  if (behavior != "Isolated") {
    split.bad("behavior", "is \"" + excerpt(behavior) + "\", expected \"Isolated\" (each match its own piece)");
  }
  if (split.boolean_or("invert", false)) split.bad("invert", "is true, expected false (the matches are the pieces)");
  const Fields byte_level = p.element("pretokenizers", 1);
  const std::string bl_type = byte_level.type("\"ByteLevel\"");
  if (bl_type != "ByteLevel") byte_level.bad("type", "is \"" + excerpt(bl_type) + "\", expected \"ByteLevel\"");
  check_byte_level(byte_level, /*use_regex=*/false);
}

void read_decoder(const Fields& root) {
  const Fields d = root.object("decoder");
  const std::string type = d.type("\"ByteLevel\"");
  if (type != "ByteLevel") d.bad("type", "is \"" + excerpt(type) + "\", expected \"ByteLevel\"");
}

// Post-processors only add special tokens when asked to (add_special_tokens), which encode() never does, and
// adjust offsets, which it does not return: the known ones are ignored, an unknown one is refused.
void check_post_processor(const Fields& p) {
  const std::string accepted = "ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing or Sequence";
  const std::string type = p.type(accepted);
  if (type == "Sequence") {
    if (!p.present("processors") || !p.at("processors").is_array()) {
      p.bad("processors", "is missing, expected a list of post-processors");
    }
    for (size_t i = 0; i < p.at("processors").size(); ++i) check_post_processor(p.element("processors", i));
    return;
  }
  if (type != "ByteLevel" && type != "TemplateProcessing" && type != "RobertaProcessing" && type != "BertProcessing") {
    p.bad("type", "is \"" + excerpt(type) + "\", expected " + accepted);
  }
}

// added_tokens, with the ids Hugging Face gives them: a token whose content is in the vocab takes that id; the
// others take the ids after the vocab, in file order (AddedVocabulary::add_tokens). Hugging Face only warns when the
// file says otherwise and uses its own; a file whose ids disagree is refused here.
void read_added_tokens(const Fields& root, const VocabIndex& vocab_ids, TokenizerSpec* spec) {
  if (!root.present("added_tokens")) return;
  if (!root.at("added_tokens").is_array()) {
    root.bad("added_tokens", "is " + shown(root.at("added_tokens")) + ", expected a list");
  }
  std::unordered_map<std::string, size_t> seen;  // content -> index in the list
  int64_t next_id = static_cast<int64_t>(spec->vocab.size());
  const json& list = root.at("added_tokens");
  for (size_t i = 0; i < list.size(); ++i) {
    const Fields t = root.element("added_tokens", i);
    AddedToken token;
    token.content = t.string("content");
    if (token.content.empty()) t.bad("content", "is \"\", expected the token's text");
    const auto [dup, fresh] = seen.emplace(token.content, i);
    if (!fresh) {
      t.bad("content", "is \"" + excerpt(token.content) + "\", which added_tokens[" + std::to_string(dup->second) +
                           "] has too; expected each added token once");
    }
    token.single_word = t.boolean_or("single_word", false);
    token.lstrip = t.boolean_or("lstrip", false);
    token.rstrip = t.boolean_or("rstrip", false);
    token.normalized = t.boolean_or("normalized", true);
    token.special = t.boolean_or("special", false);
    const auto in_vocab = vocab_ids.find(token.content);
    const int64_t expected = in_vocab != vocab_ids.end() ? in_vocab->second : next_id++;
    if (!t.present("id") || !t.at("id").is_number_integer() || t.at("id").get<int64_t>() != expected) {
      const std::string why =
          in_vocab != vocab_ids.end()
              ? "its content is model.vocab's token " + std::to_string(expected)
              : "its content is not in model.vocab, so it takes the next id after the vocab and the added tokens "
                "before it";
      t.bad("id", "is " + (t.present("id") ? shown(t.at("id")) : std::string("missing")) + " for \"" +
                      excerpt(token.content) + "\", expected " + std::to_string(expected) +
                      ", the id Hugging Face gives it (" + why +
                      "); an id that collides with another token is not "
                      "implemented");
    }
    if (expected > INT32_MAX - 1) t.bad("id", "is " + std::to_string(expected) + ", expected an id below 2^31 - 1");
    token.id = static_cast<int32_t>(expected);
    spec->added.push_back(std::move(token));
  }
}

}  // namespace

TokenizerSpec read_tokenizer_json(const std::string& path) {
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ST_BAD_INPUT("tokenizer file ", path, " is not valid JSON: ", excerpt(e.what()));
  }
  if (!j.is_object()) ST_BAD_INPUT("tokenizer file ", path, " is ", shown(j), ", expected a JSON object");
  const Fields root(j, path, "");

  TokenizerSpec spec;
  VocabIndex index;
  read_model(root.object("model"), &spec, &index);
  read_normalizer(root, &spec);
  read_pre_tokenizer(root, &spec);
  read_decoder(root);
  if (root.present("post_processor")) check_post_processor(root.object("post_processor"));
  read_added_tokens(root, index, &spec);
  return spec;
}

}  // namespace st::text
