// `shardtrain generate`: text (or token ids) from a committed checkpoint or from init.from's weights, decoded with a
// key/value cache.
//
// The weights are all a decoder needs, read on their own (ckpt/decode_weights.h): a checkpoint's parameters (a LoRA
// checkpoint's base read again and its adapters merged in), or a Hugging Face model directory or GPT-2 file as
// training's init.from reads it; no optimizer state and no training engine. The config comes from the checkpoint's
// manifest, or for --init.from from the built-in defaults with the model that init.from gives (load_config, as
// `train --init.from` derives it), with overrides that may change anything but a checkpoint's model (train.device
// picks the decoder's device, train.dtype its compute type on cuda). Every rank (under mpirun) reads the weights
// itself and decodes the same tokens with the same seed; the ranks check token by token that they agree, and rank 0
// prints each token as it comes (generate_output.h): the generated text (--prompt, through the tokenizer or as bytes)
// or ids (--prompt-ids) on stdout, a summary with the load time and the prefill and decode rates on stderr. A closed
// stdout ends the run with exit 0, SIGINT or SIGTERM with 128 + the signal.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "checkpoint_config.h"
#include "commands.h"
#include "generate_output.h"
#include "shardtrain/ckpt/decode_weights.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/generation.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/text/tokenizer_codec.h"

namespace {

constexpr const char* kGenerateUsage =
    "usage: shardtrain generate (--ckpt DIR | --init.from PATH) (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                           [--tokenizer FILE] [--max-tokens N] [--temperature T] [--top-k K] [--seed S]\n"
    "                           [--train.device=cpu|cuda] [--section.key=value ...]\n"
    "  continues the prompt with a model's weights, decoding with a key/value cache; it reads the weights alone:\n"
    "  --ckpt DIR          a committed checkpoint (step directory): its parameters, whatever world size wrote it;\n"
    "                      a LoRA checkpoint's base is read again from its init.from (--init.from=PATH names it\n"
    "                      where it has moved) or drawn from its train.seed, and the adapters are merged in\n"
    "  --init.from PATH    a Hugging Face model directory (its config.json gives the model) or a GPT-2\n"
    "                      .safetensors/.h5 file, as train --init.from reads it; the rest of the config is the\n"
    "                      built-in defaults (model.seq_len 128, the longest context: set it with --model.seq_len=N)\n"
    "  --prompt TEXT       text, read through the tokenizer as a new document (its family's separator first), or one\n"
    "                      token a byte for byte-level models (model.vocab_size 256); prints text\n"
    "  --tokenizer FILE    a Hugging Face tokenizer.json for --prompt (default: the checkpoint's data.tokenizer, or\n"
    "                      the tokenizer.json of the --init.from directory)\n"
    "  --prompt-ids LIST   token ids, comma-separated (any model); prints ids and reads no tokenizer\n"
    "  --max-tokens N      tokens to generate (default 100); past model.seq_len positions the context slides to\n"
    "                      the last model.seq_len / 2 tokens\n"
    "  --temperature T     softmax temperature, >= 0 (default 1; 0: greedy, the most likely token)\n"
    "  --top-k K           sample among the K most likely tokens (default 0: all)\n"
    "  --seed S            the sampling seed (default 0): the same seed gives the same tokens on every run and rank\n"
    "  the generated text or ids go to stdout as they are decoded, a summary with the load time and prefill and\n"
    "  decode tokens/s to stderr; a closed stdout ends it (exit 0), SIGINT or SIGTERM too, keeping what was printed\n"
    "  (exit 130, 143)";

struct GenerateArgs {
  std::string dir;        // --ckpt
  std::string init_from;  // --init.from
  std::optional<std::string> prompt, prompt_ids;
  int64_t max_tokens = 100;
  st::SamplingOptions sampling;
  std::vector<std::string> overrides;
  bool help = false;
};

// The value of `flag` in args[*i] ("--flag VALUE" or "--flag=VALUE"), advancing *i past it; nullopt when args[*i] is
// another argument.
std::optional<std::string> flag_value(const std::vector<std::string>& args, size_t* i, const std::string& flag) {
  const std::string& a = args[*i];
  if (a == flag) {
    if (*i + 1 >= args.size()) ST_BAD_INPUT(flag, " needs a value (see shardtrain generate --help)");
    return args[++*i];
  }
  if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  return std::nullopt;
}

// The whole of `text` as an integer (V = int64_t) or a number (V = double); kBadInput naming the flag and `expected`
// otherwise.
template <typename V>
V parse_value(const std::string& flag, const std::string& text, const std::string& expected) {
  size_t used = 0;
  V v = 0;
  try {
    if constexpr (std::is_same_v<V, double>)
      v = std::stod(text, &used);
    else
      v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    ST_BAD_INPUT(flag, " '", st::excerpt(text), "' is not ", std::is_same_v<V, double> ? "a number" : "an integer",
                 " (expected ", expected, ")");
  return v;
}

GenerateArgs parse_args(const std::vector<std::string>& args) {
  GenerateArgs g;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      g.help = true;
    } else if (auto v = flag_value(args, &i, "--ckpt")) {
      g.dir = *v;
    } else if (auto v = flag_value(args, &i, "--init.from")) {
      g.init_from = *v;
      if (g.init_from.empty())
        ST_BAD_INPUT("--init.from is empty: name a Hugging Face model directory or a GPT-2 file");
    } else if (auto v = flag_value(args, &i, "--prompt")) {
      g.prompt = *v;
    } else if (auto v = flag_value(args, &i, "--prompt-ids")) {
      g.prompt_ids = *v;
    } else if (auto v = flag_value(args, &i, "--tokenizer")) {
      g.overrides.push_back("--data.tokenizer=" + *v);
    } else if (auto v = flag_value(args, &i, "--max-tokens")) {
      g.max_tokens = parse_value<int64_t>("--max-tokens", *v, "an integer >= 1");
      if (g.max_tokens < 1) ST_BAD_INPUT("--max-tokens ", g.max_tokens, " is out of range (expected >= 1)");
    } else if (auto v = flag_value(args, &i, "--temperature")) {
      g.sampling.temperature = parse_value<double>("--temperature", *v, "a number >= 0; 0: greedy");
      if (!(g.sampling.temperature >= 0.0) || !std::isfinite(g.sampling.temperature))
        ST_BAD_INPUT("--temperature ", st::excerpt(*v), " is out of range (expected a finite number >= 0; 0: greedy)");
    } else if (auto v = flag_value(args, &i, "--top-k")) {
      g.sampling.top_k = parse_value<int64_t>("--top-k", *v, "an integer >= 0; 0: every token");
      if (g.sampling.top_k < 0)
        ST_BAD_INPUT("--top-k ", g.sampling.top_k, " is out of range (expected >= 0; 0: every token)");
    } else if (auto v = flag_value(args, &i, "--seed")) {
      const int64_t seed = parse_value<int64_t>("--seed", *v, "an integer >= 0");
      if (seed < 0) ST_BAD_INPUT("--seed ", seed, " is out of range (expected >= 0)");
      g.sampling.seed = static_cast<uint64_t>(seed);
    } else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) {
      g.overrides.push_back(a);  // --section.key=value: the config parser checks it
    } else {
      ST_BAD_INPUT("unknown argument '", st::excerpt(a), "' for shardtrain generate (see shardtrain generate --help)");
    }
  }
  if (g.help) return g;
  if (g.dir.empty() && g.init_from.empty())
    ST_BAD_INPUT(
        "shardtrain generate needs weights: --ckpt DIR (a committed step directory) or --init.from PATH (a "
        "Hugging Face model directory or a GPT-2 file)");
  if (g.prompt.has_value() == g.prompt_ids.has_value())
    ST_BAD_INPUT("shardtrain generate needs one prompt: --prompt TEXT or --prompt-ids 1,2,3",
                 g.prompt ? " (both given)" : "");
  return g;
}

// --prompt-ids: comma-separated ids in [0, vocab_size).
std::vector<int32_t> parse_ids(const std::string& list, int vocab_size) {
  std::vector<int32_t> ids;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const int64_t id = parse_value<int64_t>("--prompt-ids", item, "comma-separated token ids");
    if (id < 0 || id >= vocab_size)
      ST_BAD_INPUT("--prompt-ids: token ", id, " is outside the model's vocabulary [0, ", vocab_size,
                   ") (model.vocab_size)");
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) ST_BAD_INPUT("--prompt-ids '", st::excerpt(list), "' holds no token id");
  return ids;
}

// The config: the checkpoint's (checkpoint_config), or the built-in defaults with init.from's model, as
// `train --init.from` derives it. With --ckpt, --init.from is the init.from key of a LoRA checkpoint's config: where
// its base is now.
st::Config generate_config(const GenerateArgs& g) {
  if (g.init_from.empty()) return checkpoint_config(g.dir, g.overrides);
  std::vector<std::string> overrides = g.overrides;
  overrides.push_back("--init.from=" + g.init_from);
  if (!g.dir.empty()) {
    const st::Config cfg = checkpoint_config(g.dir, overrides);
    if (!cfg.model.lora.enabled())
      ST_BAD_INPUT("shardtrain generate takes its weights from --ckpt DIR or from --init.from PATH, not both: ", g.dir,
                   " holds a whole model (model.lora.rank 0), and with --ckpt, --init.from names only where a LoRA "
                   "checkpoint's base is now");
    return cfg;
  }
  st::Config cfg = st::load_config(std::nullopt, overrides);
  // A Hugging Face directory's own tokenizer reads --prompt, unless --tokenizer names another.
  const std::filesystem::path tokenizer = std::filesystem::path(g.init_from) / "tokenizer.json";
  std::error_code ec;
  if (cfg.data.tokenizer.empty() && std::filesystem::is_regular_file(tokenizer, ec))
    cfg.data.tokenizer = tokenizer.string();
  return cfg;
}

// The decoder of `decode` with its weights, read by every rank on its own (decode_weights.h) and streamed into it a
// unit at a time, and what the summary calls them: "DIR (step N)" or "PATH (init.from)".
std::unique_ptr<st::Decoder> load_decoder(const GenerateArgs& g, const st::Config& cfg, const st::Config& decode,
                                          st::Communicator& comm, std::string* source) {
  std::unique_ptr<st::Decoder> decoder = st::make_unloaded_decoder(decode, comm.device_rank());
  const st::UnitSink sink = [&](int u, std::vector<float>& values) { decoder->load_unit(u, values); };
  if (g.dir.empty()) {
    st::on_all_ranks(comm, [&] { st::read_init_from_weights(cfg, sink); });
    if (comm.rank() == 0) ST_LOG_INFO("init.from: weights loaded from ", cfg.init.from);
    *source = g.init_from + " (init.from)";
    return decoder;
  }
  // A LoRA base's files are hashed by rank 0 alone; whatever any rank found, every rank throws.
  st::Manifest m;
  st::on_all_ranks(comm, [&] {
    m = st::read_checkpoint_weights(g.dir, cfg, comm.rank() == 0 ? st::LoraBaseCheck::kCheck : st::LoraBaseCheck::kSkip,
                                    sink);
  });
  if (comm.rank() == 0) {
    if (m.model.lora.enabled()) ST_LOG_INFO("checkpoint: ", st::lora_base_read_text(m, cfg.init.from, cfg.train.seed));
    ST_LOG_INFO("checkpoint: loaded step ", m.step, " from ", g.dir, " (written by ", m.world_size,
                " rank(s), read by ", comm.world_size(), ")");
  }
  *source = g.dir + " (step " + std::to_string(m.step) + ")";
  return decoder;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args, st::Communicator& comm) {
  const GenerateArgs g = parse_args(args);
  if (g.help) {
    std::puts(kGenerateUsage);
    return st::kExitOk;
  }
  const st::Config cfg = generate_config(g);
  // The one place text meets ids: the tokenizer (--tokenizer, or the run's data.tokenizer), else bytes for a
  // byte-level model. Only text reads it: ids in and out open no tokenizer, so a checkpoint whose recorded tokenizer
  // file has moved still generates ids.
  const std::unique_ptr<st::TextCodec> codec =
      g.prompt ? st::make_text_codec(cfg.data.tokenizer, cfg.model.vocab_size, "--tokenizer (data.tokenizer)")
               : nullptr;
  std::vector<int32_t> prompt;
  if (g.prompt) {
    if (!codec)
      ST_BAD_INPUT("--prompt TEXT needs a tokenizer for this model's vocabulary of ", cfg.model.vocab_size,
                   " tokens (model.vocab_size; text is read without one only by byte-level models, vocab_size 256): "
                   "give --tokenizer FILE (its tokenizer.json), or the prompt as token ids with --prompt-ids 1,2,3");
    prompt = codec->encode(*g.prompt);
    if (prompt.empty()) ST_BAD_INPUT("--prompt is empty: give at least one byte of text");
  } else {
    prompt = parse_ids(*g.prompt_ids, cfg.model.vocab_size);
  }
  if (static_cast<int64_t>(prompt.size()) > cfg.model.seq_len)
    ST_BAD_INPUT(g.prompt ? "--prompt" : "--prompt-ids", " holds ", prompt.size(), " tokens; the model reads at most ",
                 cfg.model.seq_len, " (model.seq_len)");

  // The weights, then the decoder of the model without adapters (a LoRA checkpoint's are merged in): the load.
  const auto load_start = std::chrono::steady_clock::now();
  st::Config decode = cfg;
  decode.model = st::base_model(cfg.model);
  std::string source;
  const std::unique_ptr<st::Decoder> decoder = load_decoder(g, cfg, decode, comm, &source);
  const double load_seconds = st::seconds_since(load_start);
  // Each token is printed as it comes; a stop signal from here on ends the generation where it is (the text so far
  // kept), and a closed stdout ends it quietly, as it ends any Unix filter.
  TokenOutput output(codec ? codec->stream() : nullptr, comm);
  st::install_interrupt_handlers();
  st::GenerationStats stats;
  st::generate_tokens(*decoder, prompt, g.max_tokens, g.sampling, &stats,
                      [&](int32_t token, int64_t i) { return output.on_token(token, i); });
  output.finish();
  const int sig = output.stop_signal();
  if (comm.rank() == 0 && sig != 0) {
    std::fprintf(stderr,
                 "generate: stopped by %s after %lld of %lld tokens; the text printed so far is kept (exit %d)\n",
                 st::stop_signal_name(sig), static_cast<long long>(output.printed()),
                 static_cast<long long>(g.max_tokens), 128 + sig);
  } else if (comm.rank() == 0) {
    auto rate = [](int64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
    const std::string closed = output.stdout_closed()
                                   ? "; stdout was closed after " + std::to_string(output.printed()) + " tokens"
                                   : std::string();
    std::fprintf(stderr,
                 "generate: %s on %s: load %.3f s, prefill %lld tokens in %.3f s (%.1f tokens/s), decode %lld "
                 "tokens in %.3f s (%.1f tokens/s)%s%s\n",
                 source.c_str(), decoder->describe().c_str(), load_seconds, static_cast<long long>(stats.prompt_tokens),
                 stats.prefill_seconds, rate(stats.prompt_tokens, stats.prefill_seconds),
                 static_cast<long long>(stats.decode_steps), stats.decode_seconds,
                 rate(stats.decode_steps, stats.decode_seconds),
                 stats.slides > 0 ? (", the context slid " + std::to_string(stats.slides) + " time(s)").c_str() : "",
                 closed.c_str());
  }
  // 128 + the signal: what a shell reports for a filter the signal ended (130 for SIGINT, 143 for SIGTERM).
  return sig != 0 ? 128 + sig : st::kExitOk;
}
