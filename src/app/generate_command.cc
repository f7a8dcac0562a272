// `shardtrain generate`: text (or token ids) from a committed checkpoint or from init.from's weights, decoded with a
// key/value cache.
//
// The weights are all a decoder needs, read on their own (ckpt/decode_weights.h): a checkpoint's parameters (a LoRA
// checkpoint's base read again and its adapters merged in), or a Hugging Face model directory or GPT-2 file as
// training's init.from reads it; no optimizer state and no training engine. The config comes from the checkpoint's
// manifest, or for --init.from from the built-in defaults with the model that init.from gives (load_config, as
// `train --init.from` derives it), with overrides that may change anything but a checkpoint's model (train.device
// picks the decoder's device, train.dtype its compute type on cuda). The flags are generate_args.h's, the prompts
// generate_prompts.h's, all read and checked before the weights. Every rank (under mpirun) reads the weights itself
// and decodes the same sequences with the same seed (generate_batch): the whole model, or, in a layer split
// (--split; model/decoder_stage.h), its stage's units alone, each forward passing through the ranks; the ranks check
// token by token that they agree, and rank 0 prints (generate_output.h): one prompt's text or ids as they come, or a
// result a line, on stdout; a summary with the load time and the prefill and decode rates on stderr. A closed stdout
// ends the run with exit 0, SIGINT or SIGTERM with 128 + the signal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "checkpoint_config.h"
#include "commands.h"
#include "generate_args.h"
#include "generate_output.h"
#include "generate_prompts.h"
#include "shardtrain/ckpt/decode_weights.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/model/decoder.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/model/cuda_decoder.h"
#endif
#include "shardtrain/model/generation.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/shard/memory_plan.h"

namespace {

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

// Where a load's time went: making the decoder (on cuda the device's buffers), and handing it the weights as they are
// read, the rest of the time reading them.
struct LoadSeconds {
  double decoder = 0, handing = 0;
};

// Reads the units `held` (empty: all) of the decoder's weights to `sink`, on this rank alone (decode_weights.h): the
// checkpoint's parameters (the manifest returned), or init.from's (nothing returned). A LoRA base's files are hashed
// by rank 0 alone.
std::optional<st::Manifest> read_weights(const GenerateArgs& g, const st::Config& cfg, int rank,
                                         const st::UnitSink& sink, const std::vector<bool>& held) {
  if (g.dir.empty()) {
    st::read_init_from_weights(cfg, sink, held);
    return std::nullopt;
  }
  return st::read_checkpoint_weights(g.dir, cfg, rank == 0 ? st::LoraBaseCheck::kCheck : st::LoraBaseCheck::kSkip, sink,
                                     held);
}

// The decoder of `decode` (of `stage`) with its weights, the units it holds read by every rank on its own and
// streamed into it a unit at a time (whatever any rank found, every rank throws). Adds the time of making the decoder
// and of handing it the weights to *seconds, and sets what the summary calls the weights: "DIR (step N)" or "PATH
// (init.from)".
std::unique_ptr<st::Decoder> load_decoder(const GenerateArgs& g, const st::Config& cfg, const st::Config& decode,
                                          int max_batch, const st::DecoderStage& stage, st::Communicator& comm,
                                          std::string* source, LoadSeconds* seconds) {
  const auto made = std::chrono::steady_clock::now();
  std::unique_ptr<st::Decoder> decoder = st::make_unloaded_decoder(decode, comm.device_rank(), max_batch, stage);
  seconds->decoder += st::seconds_since(made);
  auto timed = [&](const auto& hand_over) {
    const auto handed = std::chrono::steady_clock::now();
    hand_over();
    seconds->handing += st::seconds_since(handed);
  };
  std::optional<st::Manifest> manifest;
  // A GPU decoder of bf16 or fp16 takes a llama directory's tensors in its own type, read straight into 16-bit
  // buffers (init_from_hf_dir_half): no fp32 copy of a unit on the host, a third of the passes over it.
  const st::HalfKind half = decoder->half_kind();
  std::error_code ec;
  if (g.dir.empty() && half != st::HalfKind::kNone && cfg.model.is_llama() && !cfg.model.lora.enabled() &&
      std::filesystem::is_directory(cfg.init.from, ec)) {
    st::on_all_ranks(comm, [&] {
      st::init_from_hf_dir_half(cfg.init.from, decode.model, cfg.train.seed, half, decoder->held_units(),
                                [&](int u, const std::vector<uint16_t>& values) {
                                  timed([&] { decoder->load_unit_half(u, values, half); });
                                });
    });
  } else {
    const st::UnitSink sink = [&](int u, std::vector<float>& values) { timed([&] { decoder->load_unit(u, values); }); };
    st::on_all_ranks(comm, [&] { manifest = read_weights(g, cfg, comm.rank(), sink, decoder->held_units()); });
  }
  if (!manifest.has_value()) {
    if (comm.rank() == 0) ST_LOG_INFO("init.from: weights loaded from ", cfg.init.from);
    *source = g.init_from + " (init.from)";
    return decoder;
  }
  const st::Manifest& m = *manifest;
  if (comm.rank() == 0) {
    if (m.model.lora.enabled()) ST_LOG_INFO("checkpoint: ", st::lora_base_read_text(m, cfg.init.from, cfg.train.seed));
    ST_LOG_INFO("checkpoint: loaded step ", m.step, " from ", g.dir, " (written by ", m.world_size,
                " rank(s), read by ", comm.world_size(), ")");
  }
  *source = g.dir + " (step " + std::to_string(m.step) + ")";
  return decoder;
}

#ifdef SHARDTRAIN_HAVE_CUDA
// The least of every rank's `bytes`: each rank's slot of one all-reduce.
int64_t least_over_ranks(st::Communicator& comm, int64_t bytes) {
  if (comm.world_size() == 1) return bytes;
  std::vector<double> all(static_cast<size_t>(comm.world_size()), 0.0);
  all[static_cast<size_t>(comm.rank())] = static_cast<double>(bytes);
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()));
  return static_cast<int64_t>(*std::min_element(all.begin(), all.end()));
}
#endif

}  // namespace

int cmd_generate(const std::vector<std::string>& args, st::Communicator& comm) {
  const GenerateArgs g = parse_generate_args(args);
  if (g.help) {
    std::puts(kGenerateUsage);
    return st::kExitOk;
  }
  const st::Config cfg = generate_config(g);
  GeneratePrompts prompts = read_generate_prompts(g, cfg);

  // The weights, then the decoder of the model without adapters (a LoRA checkpoint's are merged in): the load.
  const auto load_start = std::chrono::steady_clock::now();
  st::Config decode = cfg;
  decode.model = st::base_model(cfg.model);
  std::string source;
  // A cache for each prompt decoded together: --batch of them, or by default up to kDefaultBatch, as many as the
  // device holds; never more than the prompts. On a GPU the decoder is placed (whole on every rank, or its layers
  // split over them) and planned before it allocates anything, every rank planning with the least free memory of any
  // so that all place it alike; on the CPU only --split layers splits it.
  const int64_t wanted = std::min<int64_t>(g.batch > 0 ? g.batch : kDefaultBatch, prompts.ids.size());
  int max_batch = static_cast<int>(wanted);
  int stages = g.split == st::LayerSplit::kLayers ? comm.world_size() : 1;
#ifdef SHARDTRAIN_HAVE_CUDA
  if (decode.train.device == st::Device::kCuda) {
    const st::DeviceBudget budget =
        st::DeviceBudget::of(decode, least_over_ranks(comm, st::cuda_device_free_bytes(comm.device_rank())));
    const st::DecoderPlacement placed = st::place_decoder(decode, max_batch, g.batch == 0, g.split, comm.world_size(),
                                                          budget, st::cuda_device_name_of(comm.device_rank()));
    max_batch = placed.max_batch;
    stages = placed.stages;
  }
#endif
  st::DecoderStage stage;
  if (stages > 1) {
    const std::vector<st::UnitRange> ranges = st::split_units(decode.model, max_batch, stages);
    stage = st::DecoderStage{comm.rank(), stages, ranges[static_cast<size_t>(comm.rank())], &comm};
    if (comm.rank() == 0)
      ST_LOG_INFO("generate: the layers split over ", stages, " ranks: ", st::describe_split(decode.model, ranges));
  }
  // The host's memory too is planned before a weight is read (each rank's for the units it holds).
  st::on_all_ranks(comm, [&] {
    st::check_decoder_host_memory(
        cfg, max_batch, stage,
        st::host_memory_budget(st::host_memory_limits(), comm.device_ranks(), cfg.dist.max_host_mem_gib));
  });
  LoadSeconds parts;
  const auto placed_at = std::chrono::steady_clock::now();
  const std::unique_ptr<st::Decoder> decoder = load_decoder(g, cfg, decode, max_batch, stage, comm, &source, &parts);
  const double load_seconds = st::seconds_since(load_start);
  // Before the decoder: the device's first calls (on cuda, its context) and the plan.
  const double opening = std::chrono::duration<double>(placed_at - load_start).count();
  const double reading = load_seconds - opening - parts.decoder - parts.handing;
  // One prompt streams its tokens as they come; a batch prints whole results. A stop signal from here on ends the
  // generation where it is (what was printed kept), and a closed stdout ends it quietly, as it ends any Unix filter.
  const OutputForm form = g.jsonl ? OutputForm::kJsonl : g.prompts_file ? OutputForm::kLines : OutputForm::kStream;
  GenerateOutput output(form, prompts.completions(g.stops), prompts.ids, g.max_tokens, comm);
  st::install_interrupt_handlers();
  st::GenerationStats stats;
  try {
    st::generate_batch(*decoder, prompts.ids, g.max_tokens, g.sampling, &stats,
                       [&](int seq, int32_t token, int64_t i) { return output.on_token(seq, token, i); });
  } catch (const GenerationStopped&) {
    // A stop signal or a closed stdout: the output says which.
  }
  output.finish();
  const int sig = output.stop_signal();
  const bool stream = form == OutputForm::kStream;
  const int64_t printed = stream ? output.printed_tokens() : output.printed_results();
  const std::string what = stream ? "tokens" : "results";
  if (comm.rank() == 0 && sig != 0) {
    std::fprintf(stderr, "generate: stopped by %s after %lld of %lld %s; the %s printed so far %s kept (exit %d)\n",
                 st::stop_signal_name(sig), static_cast<long long>(printed),
                 static_cast<long long>(stream ? g.max_tokens : static_cast<int64_t>(prompts.ids.size())), what.c_str(),
                 stream ? "text" : "results", stream ? "is" : "are", 128 + sig);
  } else if (comm.rank() == 0) {
    auto rate = [](int64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
    const std::string batch = prompts.ids.size() > 1 ? ", " + std::to_string(prompts.ids.size()) + " prompts" : "";
    const std::string device =
        decoder->describe() + (stages > 1 ? ", its layers split over " + std::to_string(stages) + " ranks" : "");
    const std::string closed =
        output.stdout_closed() ? "; stdout was closed after " + std::to_string(printed) + " " + what : std::string();
    std::fprintf(stderr,
                 "generate: %s on %s: load %.3f s, prefill %lld tokens in %.3f s (%.1f tokens/s), decode %lld "
                 "tokens in %.3f s (%.1f tokens/s)%s%s%s; the load: %.3f s opening the device and planning, %.3f s "
                 "making the decoder, %.3f s reading the weights, %.3f s handing them over\n",
                 source.c_str(), device.c_str(), load_seconds, static_cast<long long>(stats.prompt_tokens),
                 stats.prefill_seconds, rate(stats.prompt_tokens, stats.prefill_seconds),
                 static_cast<long long>(stats.decode_steps), stats.decode_seconds,
                 rate(stats.decode_steps, stats.decode_seconds),
                 stats.slides > 0 ? (", the context slid " + std::to_string(stats.slides) + " time(s)").c_str() : "",
                 batch.c_str(), closed.c_str(), opening, parts.decoder, reading, parts.handing);
  }
  // 128 + the signal: what a shell reports for a filter the signal ended (130 for SIGINT, 143 for SIGTERM).
  return sig != 0 ? 128 + sig : st::kExitOk;
}
