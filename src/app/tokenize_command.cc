// `shardtrain tokenize`: text or JSONL to llm.c token shards (text/tokenize_job.h). Single-process, multi-threaded.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/text/tokenize_job.h"
#include "shardtrain/train/progress_bar.h"

namespace {

constexpr const char* kTokenizeUsage =
    "usage: shardtrain tokenize --tokenizer FILE --out PREFIX [options] INPUT...\n"
    "  INPUT: text files, JSONL files or globs, read in order (a glob's matches sorted)\n"
    "  --tokenizer FILE      a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen 2.5, ...)\n"
    "  --out PREFIX          writes PREFIX_train_000000.bin ... and PREFIX_val_000000.bin ... (llm.c shards)\n"
    "  --format F            auto (default: jsonl for .jsonl/.json, text otherwise), text (a file is a document),\n"
    "                        jsonl ({\"text\": ...} a line), chat ({\"messages\": [...]} a line) or prompt\n"
    "                        ({\"prompt\": ..., \"completion\": ...} a line); chat and prompt write loss masks\n"
    "  --text-field NAME     the JSONL field holding a document (default text)\n"
    "  --val-fraction F      the share of documents written to PREFIX_val_* (default 0)\n"
    "  --shard-tokens N      tokens a shard (default 100000000)\n"
    "  --separator TOKEN     the added token before each document, or none (default: the tokenizer family's,\n"
    "                        <|begin_of_text|> for Llama 3, <|endoftext|> for GPT-2 and Qwen)\n"
    "  --threads N           encoding threads (default: one per core); the output does not depend on it\n"
    "Only new files: existing PREFIX_train_*/PREFIX_val_* files are refused. While it writes, PREFIX.incomplete marks\n"
    "the set as incomplete (training refuses it); SIGINT or SIGTERM removes what was written and exits 130 or 143.\n";

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  return buf;
}

// A whole number: digits only, within [min, max]; kBadInput naming the flag otherwise.
int64_t parse_count(const std::string& flag, const std::string& v, int64_t min, int64_t max) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || x < min || x > max)
    ST_BAD_INPUT(flag, " is \"", v, "\": expected a whole number in [", min, ", ", max, "]");
  return x;
}

double parse_fraction(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double x = -1;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= 0 && x < 1))
    ST_BAD_INPUT(flag, " is \"", v, "\": expected a number in [0, 1)");
  return x;
}

void draw_progress(const st::TokenizeProgress& p) {
  const double frac = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1;
  const int filled = static_cast<int>(frac * 30 + 0.5);
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.bytes_done) / p.elapsed_s : 0;
  const std::string eta =
      rate > 0 ? st::format_duration(static_cast<double>(p.bytes_total - p.bytes_done) / rate) : std::string("--");
  std::fprintf(stderr, "\r[%s%s] %s / %s | %.1f MB/s | ETA %s\033[K", std::string(filled, '#').c_str(),
               std::string(30 - filled, '.').c_str(), human_bytes(static_cast<double>(p.bytes_done)).c_str(),
               human_bytes(static_cast<double>(p.bytes_total)).c_str(), rate / 1e6, eta.c_str());
}

void print_series(const char* name, int64_t tokens, const std::vector<std::string>& shards) {
  if (shards.empty()) return;
  std::printf("  %-5s %lld tokens in %zu shard%s: %s%s\n", name, static_cast<long long>(tokens), shards.size(),
              shards.size() == 1 ? "" : "s", shards.front().c_str(),
              shards.size() > 1 ? (" ... " + shards.back()).c_str() : "");
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) {
  st::TokenizeOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    if (a == "--help" || a == "-h") {
      std::fputs(kTokenizeUsage, stdout);
      return st::kExitOk;
    }
    if (a.rfind("--", 0) != 0) {
      o.inputs.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) ST_BAD_INPUT(a, " needs a value (see shardtrain tokenize --help)");
      value = args[++i];
    }
    if (a == "--tokenizer") {
      o.tokenizer = value;
    } else if (a == "--out") {
      o.out_prefix = value;
    } else if (a == "--format") {
      o.format = st::parse_input_format(value);
    } else if (a == "--text-field") {
      o.text_field = value;
    } else if (a == "--val-fraction") {
      o.val_fraction = parse_fraction(a, value);
    } else if (a == "--shard-tokens") {
      o.shard_tokens = parse_count(a, value, 1, int64_t{1} << 40);
    } else if (a == "--separator") {
      o.separator = value;
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_count(a, value, 0, 4096));
    } else {
      ST_BAD_INPUT("unknown option ", a, " (see shardtrain tokenize --help)");
    }
  }
  if (o.tokenizer.empty()) ST_BAD_INPUT("tokenize needs --tokenizer FILE (a Hugging Face tokenizer.json)");

  const bool tty = isatty(STDERR_FILENO) != 0;
  st::install_interrupt_handlers();
  const st::TokenizeSummary s =
      st::run_tokenize(o, tty ? draw_progress : nullptr, [] { return st::stop_signal() != 0; });
  if (tty) std::fputc('\n', stderr);
  if (s.stopped) {
    const int sig = st::stop_signal();
    std::fprintf(stderr,
                 "tokenize: interrupted by %s: removed every file it had written under %s_*; nothing was written\n",
                 st::stop_signal_name(sig), o.out_prefix.c_str());
    return 128 + sig;
  }
  const double per_token = s.tokens > 0 ? static_cast<double>(s.bytes) / static_cast<double>(s.tokens) : 0;
  std::printf("tokenize: %lld documents (%lld for validation), %lld tokens from %s in %.1f s (%.1f MB/s), "
              "%.2f bytes a token\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.val_documents),
              static_cast<long long>(s.tokens), human_bytes(static_cast<double>(s.bytes)).c_str(), s.seconds,
              s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / 1e6 : 0.0, per_token);
  print_series("train", s.tokens - s.val_tokens, s.train_shards);
  print_series("val", s.val_tokens, s.val_shards);
  std::printf("  uint%d tokens, %s tokenizer", s.token_bits, s.family.c_str());
  if (o.format == st::InputFormat::kChat || o.format == st::InputFormat::kPrompt)
    std::printf("; %lld of the tokens are trained on (loss masks beside the shards, NAME.mask)",
                static_cast<long long>(s.trained_tokens));
  std::printf("\n");
  return st::kExitOk;
}
