// Test tool for the Hugging Face tokenizer checks (tests/text/reference/compare.js): shardtrain's tokenizer on files,
// loaded once for all of them.
//
//   tokenizer_ids encode TOKENIZER_JSON [--ordinary] INPUT IDS_OUT [INPUT IDS_OUT ...]
//       the ids of each INPUT's bytes as int32 little-endian (added tokens recognised unless --ordinary)
//   tokenizer_ids decode TOKENIZER_JSON IDS_IN TEXT_OUT [IDS_IN TEXT_OUT ...]
//       the text of the int32 ids in each IDS_IN
//   tokenizer_ids corpus-files
//       the files of the built-in corpus (@fortunes), one path a line, in corpus order
// Exit 0, or the st::Error's exit code with the error on stderr.
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
               "usage: tokenizer_ids encode TOKENIZER_JSON [--ordinary] INPUT IDS_OUT [INPUT IDS_OUT ...]\n"
               "       tokenizer_ids decode TOKENIZER_JSON IDS_IN TEXT_OUT [IDS_IN TEXT_OUT ...]\n"
               "       tokenizer_ids corpus-files\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 1 && args[0] == "corpus-files") {
      for (const std::string& f : st::fortunes_files(st::env_get("SHARDTRAIN_FORTUNES_DIR")))
        std::printf("%s\n", f.c_str());
      return 0;
    }
    if (args.size() < 4 || (args[0] != "encode" && args[0] != "decode")) return usage();
    const bool encode = args[0] == "encode";
    const bool ordinary = encode && args[2] == "--ordinary";
    const size_t first = ordinary ? 3 : 2;
    if (args.size() <= first || (args.size() - first) % 2 != 0) return usage();
    const st::Tokenizer tok = st::Tokenizer::load(args[1]);
    for (size_t i = first; i < args.size(); i += 2) {
      const std::string in = read_file(args[i]);
      if (encode) {
        const std::vector<int32_t> ids = tok.encode(in, !ordinary);
        write_file(args[i + 1], ids.data(), ids.size() * sizeof(int32_t));
      } else {
        std::vector<int32_t> ids(in.size() / sizeof(int32_t));
        in.copy(reinterpret_cast<char*>(ids.data()), ids.size() * sizeof(int32_t));
        const std::string text = tok.decode(ids);
        write_file(args[i + 1], text.data(), text.size());
      }
    }
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
