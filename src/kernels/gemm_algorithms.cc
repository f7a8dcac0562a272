#include "shardtrain/kernels/gemm_algorithms.h"

#include <sstream>

#include "shardtrain/core/error.h"

namespace st {

std::string format_gemm_algorithms(const std::vector<GemmAlgorithmEntry>& entries) {
  std::ostringstream out;
  for (const GemmAlgorithmEntry& e : entries) {
    out << "gemm";
    for (int64_t v : e.key) out << ' ' << v;
    out << std::hex;
    for (uint64_t w : e.algo) out << ' ' << w;
    out << std::dec << '\n';
  }
  return out.str();
}

std::vector<GemmAlgorithmEntry> parse_gemm_algorithms(const std::string& text) {
  std::vector<GemmAlgorithmEntry> entries;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string tag, rest;
    GemmAlgorithmEntry e;
    fields >> tag;
    for (int64_t& v : e.key) fields >> v;
    fields >> std::hex;
    for (uint64_t& w : e.algo) fields >> w;
    if (tag != "gemm" || !fields || (fields >> rest))
      ST_BAD_INPUT("GEMM algorithm list, line ", n, ": expected \"gemm\", ", e.key.size(), " integers and ",
                   e.algo.size(), " hex words, got '", line, "'");
    entries.push_back(e);
  }
  return entries;
}

}  // namespace st
