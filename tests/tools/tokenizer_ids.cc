// Test tool for the Hugging Face tokenizer checks (tests/text/reference/compare.js): shardtrain's tokenizer on a file.
//
//   tokenizer_ids encode TOKENIZER_JSON INPUT IDS_OUT [--ordinary]   ids of INPUT's bytes (added tokens recognised
//                                                                      unless --ordinary) as int32 little-endian
//   tokenizer_ids decode TOKENIZER_JSON IDS_IN TEXT_OUT                the text of the int32 ids in IDS_IN
//   tokenizer_ids corpus TEXT_OUT                                      the built-in corpus (@fortunes), concatenated
// Exit 0, or 2 with the error on stderr.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/data/fortunes.h"
#include "shardtrain/text/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ST_BAD_INPUT("cannot read ", path);
  std::ostringstream s;
  s << in.rdbuf();
  return std::move(s).str();
}

void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) ST_BAD_INPUT("cannot write ", path);
}

int usage() {
  std::fprintf(stderr,
               "usage: tokenizer_ids encode TOKENIZER_JSON INPUT IDS_OUT [--ordinary]\n"
               "       tokenizer_ids decode TOKENIZER_JSON IDS_IN TEXT_OUT\n"
               "       tokenizer_ids corpus TEXT_OUT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "corpus") {
      std::string text;
      for (const std::string& f : st::fortunes_files(st::env_get("SHARDTRAIN_FORTUNES_DIR"))) text += read_file(f);
      write_file(args[1], text.data(), text.size());
      return 0;
    }
    if (args.size() >= 4 && args[0] == "encode") {
      const bool ordinary = args.size() == 5 && args[4] == "--ordinary";
      if (args.size() == 5 && !ordinary) return usage();
      const st::Tokenizer tok = st::Tokenizer::load(args[1]);
      const std::vector<int32_t> ids = tok.encode(read_file(args[2]), !ordinary);
      write_file(args[3], ids.data(), ids.size() * sizeof(int32_t));
      return 0;
    }
    if (args.size() == 4 && args[0] == "decode") {
      const st::Tokenizer tok = st::Tokenizer::load(args[1]);
      const std::string bytes = read_file(args[2]);
      std::vector<int32_t> ids(bytes.size() / sizeof(int32_t));
      bytes.copy(reinterpret_cast<char*>(ids.data()), ids.size() * sizeof(int32_t));
      const std::string text = tok.decode(ids);
      write_file(args[3], text.data(), text.size());
      return 0;
    }
    return usage();
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
