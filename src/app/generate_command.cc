// `shardtrain generate`: text (or token ids) from a committed checkpoint, decoded with a key/value cache.
//
// The config comes from the checkpoint's manifest, with overrides that may change anything but the model
// (train.device picks the decoder's device, train.dtype its compute type on cuda). Every rank (under mpirun) loads the
// checkpoint at its world size, gathers the full weights and decodes the same tokens with the same seed; the ranks
// check token by token that they agree, and rank 0 prints each token as it comes (generate_output.h): the generated
// text (--prompt, through the tokenizer or as bytes) or ids (--prompt-ids) on stdout, a summary with the prefill and
// decode rates on stderr. A closed stdout ends the run with exit 0, SIGINT or SIGTERM with 128 + the signal.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint_config.h"
#include "commands.h"
#include "generate_output.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/generation.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/text/tokenizer_codec.h"
#include "shardtrain/train/step_engine.h"

namespace {

constexpr const char* kGenerateUsage =
    "usage: shardtrain generate --ckpt DIR (--prompt TEXT | --prompt-ids 1,2,3) [--tokenizer FILE] [--max-tokens N]\n"
    "                           [--temperature T] [--top-k K] [--seed S] [--train.device=cpu|cuda] "
    "[--section.key=value ...]\n"
    "  continues the prompt with checkpoint DIR's model, decoding with a key/value cache:\n"
    "  --prompt TEXT       text, read through the tokenizer as a new document (its family's separator first), or one\n"
    "                      token a byte for byte-level models (model.vocab_size 256); prints text\n"
    "  --tokenizer FILE    a Hugging Face tokenizer.json for --prompt (default: the checkpoint's data.tokenizer)\n"
    "  --prompt-ids LIST   token ids, comma-separated (any model); prints ids and reads no tokenizer\n"
    "  --max-tokens N      tokens to generate (default 100); past model.seq_len positions the context slides to\n"
    "                      the last model.seq_len / 2 tokens\n"
    "  --temperature T     softmax temperature, >= 0 (default 1; 0: greedy, the most likely token)\n"
    "  --top-k K           sample among the K most likely tokens (default 0: all)\n"
    "  --seed S            the sampling seed (default 0): the same seed gives the same tokens on every run and rank\n"
    "  the generated text or ids go to stdout as they are decoded, a summary with prefill and decode tokens/s to\n"
    "  stderr; a closed stdout ends it (exit 0), SIGINT or SIGTERM too, keeping what was printed (exit 130, 143)";

struct GenerateArgs {
  std::string dir;
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
  if (g.dir.empty()) ST_BAD_INPUT("shardtrain generate needs --ckpt DIR (a committed step directory)");
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

}  // namespace

int cmd_generate(const std::vector<std::string>& args, st::Communicator& comm) {
  const GenerateArgs g = parse_args(args);
  if (g.help) {
    std::puts(kGenerateUsage);
    return st::kExitOk;
  }
  const st::Config cfg = checkpoint_config(g.dir, g.overrides);
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

  // The weights: the checkpoint loaded at this world size (one sequence a micro-batch: the engine's activations are
  // never used), gathered in full on every rank; the engine is gone before the decoder is built.
  std::vector<std::vector<float>> weights;
  int64_t step = 0;
  {
    st::Config load = cfg;
    load.train.micro_batch = 1;
    load.train.global_batch = comm.world_size();
    st::StepEngine engine(load, comm);
    step = st::load_checkpoint(g.dir, load, engine.sharded(), comm, st::CheckpointLoad::kRead).step;
    // A LoRA checkpoint decodes as its base (which the load read) with the adapters merged in.
    weights = st::merge_lora(cfg.model, engine.units(), engine.gather_params());
  }
  st::Config decode = cfg;
  decode.model = st::base_model(cfg.model);
  const std::unique_ptr<st::Decoder> decoder = st::make_decoder(decode, std::move(weights), comm.device_rank());
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
                 "generate: %s (step %lld) on %s: prefill %lld tokens in %.3f s (%.1f tokens/s), decode %lld tokens "
                 "in %.3f s (%.1f tokens/s)%s%s\n",
                 g.dir.c_str(), static_cast<long long>(step), decoder->describe().c_str(),
                 static_cast<long long>(stats.prompt_tokens), stats.prefill_seconds,
                 rate(stats.prompt_tokens, stats.prefill_seconds), static_cast<long long>(stats.decode_steps),
                 stats.decode_seconds, rate(stats.decode_steps, stats.decode_seconds),
                 stats.slides > 0 ? (", the context slid " + std::to_string(stats.slides) + " time(s)").c_str() : "",
                 closed.c_str());
  }
  // 128 + the signal: what a shell reports for a filter the signal ended (130 for SIGINT, 143 for SIGTERM).
  return sig != 0 ? 128 + sig : st::kExitOk;
}
