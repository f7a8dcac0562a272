// Test tool for the Hugging Face check of chat prompts (tests/text/reference/chat_prompt_check.js): the ids shardtrain
// gives a chat as a prompt for the assistant's next turn (Conventions::encode_chat_prompt, what `generate --chat`
// and a "messages" prompt decode from).
//
//   chat_prompt_ids TOKENIZER_JSON CHATS.jsonl
//       for each line {"messages": [...]} of CHATS.jsonl, its prompt's ids as a JSON array, one line each
// Exit 0, or the st::Error's exit code with the error on stderr.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/text/conventions.h"
#include "shardtrain/text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: chat_prompt_ids TOKENIZER_JSON CHATS.jsonl\n");
    return 2;
  }
  try {
    const st::Tokenizer tok = st::Tokenizer::load(argv[1]);
    const st::Conventions conv(tok, "none");
    std::ifstream in(argv[2]);
    if (!in) ST_BAD_INPUT("cannot read ", argv[2]);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      const nlohmann::json chat = nlohmann::json::parse(line);
      std::vector<st::ChatMessage> messages;
      for (const nlohmann::json& m : chat.at("messages"))
        messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      const std::string where = std::string(argv[2]) + ":" + std::to_string(n);
      std::printf("%s\n", nlohmann::json(conv.encode_chat_prompt(messages, where)).dump().c_str());
    }
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
