#include "shardtrain/text/prompt_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/small_file.h"

namespace st {
namespace {

constexpr const char* kPromptFields = "one of \"prompt\" (text), \"prompt_ids\" (token ids) or \"messages\" (a chat)";

// `j`[key] as a string; kBadInput naming `where` and `field` when it is another type.
std::string string_value(const nlohmann::json& j, const std::string& where, const std::string& field) {
  if (!j.is_string()) ST_BAD_INPUT(where, ": ", field, " is a ", j.type_name(), ", expected a string");
  return j.get<std::string>();
}

std::vector<int32_t> ids_value(const nlohmann::json& j, const std::string& where, int vocab_size) {
  if (!j.is_array()) ST_BAD_INPUT(where, ": \"prompt_ids\" is a ", j.type_name(), ", expected an array of token ids");
  if (j.empty()) ST_BAD_INPUT(where, ": \"prompt_ids\" is empty: expected at least one token id");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& v = j[i];
    if (!v.is_number_integer())
      ST_BAD_INPUT(where, ": prompt_ids[", i, "] is ",
                   v.is_number() ? "the number " + v.dump() : "a " + std::string(v.type_name()),
                   ", expected a token id (an integer)");
    const bool negative = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
    if (negative || v.get<uint64_t>() >= static_cast<uint64_t>(vocab_size))
      ST_BAD_INPUT(where, ": prompt_ids[", i, "] is ", v.dump(), ", outside the model's vocabulary [0, ", vocab_size,
                   ") (model.vocab_size)");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

std::vector<ChatMessage> messages_value(const nlohmann::json& j, const std::string& where) {
  if (!j.is_array())
    ST_BAD_INPUT(where, ": \"messages\" is a ", j.type_name(),
                 ", expected an array of {\"role\": ..., \"content\": ...} objects");
  if (j.empty()) ST_BAD_INPUT(where, ": \"messages\" is empty: expected at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!j[i].is_object())
      ST_BAD_INPUT(where, ": ", at, " is a ", j[i].type_name(),
                   ", expected a {\"role\": ..., \"content\": ...} object");
    for (auto it = j[i].begin(); it != j[i].end(); ++it)
      if (it.key() != "role" && it.key() != "content")
        ST_BAD_INPUT(where, ": ", at, " has the field \"", excerpt(it.key()),
                     "\": expected \"role\" and \"content\" only");
    for (const char* key : {"role", "content"})
      if (!j[i].contains(key))
        ST_BAD_INPUT(where, ": ", at, " has no \"", key, "\": expected \"role\" and \"content\"");
    messages.push_back(
        {string_value(j[i]["role"], where, at + ".role"), string_value(j[i]["content"], where, at + ".content")});
  }
  return messages;
}

PromptLine json_prompt(const std::string& line, const std::string& where, int vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    ST_BAD_INPUT(where, ": not a JSON object: ", e.what());
  }
  if (!j.is_object()) ST_BAD_INPUT(where, ": expected a JSON object with ", kPromptFields, ", got a ", j.type_name());
  std::string given;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key != "prompt" && key != "prompt_ids" && key != "messages")
      ST_BAD_INPUT(where, ": unknown field \"", excerpt(key), "\": expected ", kPromptFields);
    if (!given.empty()) ST_BAD_INPUT(where, ": both \"", given, "\" and \"", key, "\": expected ", kPromptFields);
    given = key;
  }
  if (given.empty()) ST_BAD_INPUT(where, ": no prompt: expected ", kPromptFields);
  PromptLine p;
  p.where = where;
  const nlohmann::json& v = j[given];
  if (given == "prompt") {
    p.text = string_value(v, where, "\"prompt\"");
    if (p.text.empty()) ST_BAD_INPUT(where, ": \"prompt\" is empty: expected at least one byte of text");
  } else if (given == "prompt_ids") {
    p.kind = PromptLine::Kind::kIds;
    p.ids = ids_value(v, where, vocab_size);
  } else {
    p.kind = PromptLine::Kind::kChat;
    p.messages = messages_value(v, where);
  }
  return p;
}

}  // namespace

bool is_jsonl_prompt_file(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

std::vector<PromptLine> read_prompt_file(const std::string& path, int vocab_size) {
  const std::string text = read_small_file(path, {"--prompts file " + path, "a prompts file", int64_t{1} << 30,
                                                  "(the prompts are read whole: give a file)"});
  const bool jsonl = is_jsonl_prompt_file(path);
  std::vector<PromptLine> out;
  int64_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    if (jsonl) {
      out.push_back(json_prompt(line, where, vocab_size));
    } else {
      if (line.back() == '\r') line.pop_back();
      PromptLine p;
      p.text = std::move(line);
      p.where = where;
      out.push_back(std::move(p));
    }
  }
  if (out.empty())
    ST_BAD_INPUT("--prompts file ", path, " holds no prompt (", n, " blank line(s)): expected one prompt a line",
                 jsonl ? ", each a JSON object with " + std::string(kPromptFields) : std::string());
  return out;
}

}  // namespace st
