// `shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB] [--section.key=value
// ...]`: the run's memory plan (shard/run_plan.h) on a target, without starting a job and without a GPU. Prints per
// rank and per node the device plan and the host plan, term by term, whether the config fits and, if not, the
// smallest change that does (shard/plan_search.h), and where that takes more ranks or nothing does, the LoRA or QLoRA
// adapters that fit the target (adapters_that_fit). The plans are the ones `train` checks at start-up.
//
//   $ shardtrain plan --config configs/llama3.1-8b.ini --world 2 --gpu-mem 24 --host-mem 64
//   plan: configs/llama3.1-8b.ini: llama, 8.03 B parameters, bf16 on cuda; 2 rank(s), 2 per node, each unit ...
//     device, per rank: sharded state 15.94 GiB, ...; total 27.36 GiB
//       budget 24.00 GiB (--gpu-mem 24.00 GiB): does not fit
//     host, per rank: optimizer state 44.87 GiB, ...; total 58.29 GiB
//       per node (2 rank(s)): 116.57 GiB; budget per rank 32.00 GiB (...): does not fit
//   does not fit; the smallest change that fits: --world 4 (2 node(s) of 2 rank(s))
//     ... (the plan with the change)
//
// With --generate [--batch N], the plan of `shardtrain generate` on the same target instead: where its decoder goes
// (whole on each rank, or its layers split over the ranks: shard/memory_plan.h, place_decoder), the sequences it
// holds (--batch, or as many as fit up to 16), each rank's device footprint and host plan (plan_decoder_host).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "config_args.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/shard/cuda_memory_plan.h"
#endif
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/format.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/plan_search.h"
#include "shardtrain/shard/run_plan.h"

namespace {

constexpr const char* kPlanUsage =
    "usage: shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB]\n"
    "                       [--generate [--batch N]] [--section.key=value ...]\n"
    "  the memory plan of a run, per rank and per node, without starting it (no GPU needed):\n"
    "  --world N           ranks (default 1)\n"
    "  --ranks-per-node N  ranks sharing one host's memory (default: min(world, 8), nodes of 8 GPUs)\n"
    "  --gpu-mem GiB       usable memory of each GPU (default: dist.max_gpu_mem_gib, else the free memory of this\n"
    "                      host's first GPU; needed for train.device=cuda on a host without one)\n"
    "  --host-mem GiB      host memory of each node (default: what this host has available for the run);\n"
    "                      dist.max_host_mem_gib caps each rank's share\n"
    "  --generate          plan `shardtrain generate` of the config's model instead of training it: the decoder\n"
    "                      whole on each rank or its layers split over them, per rank (--config may be left out\n"
    "                      for --init.from=DIR); --batch N: the sequences decoded together (default: as many as\n"
    "                      fit, up to 16)\n"
    "  exit codes: 0 fits, 3 does not fit (with the smallest change that does), 2 bad input\n";

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int kMaxWorld = 1 << 20;

struct PlanArgs {
  int world = 1;
  std::optional<int> ranks_per_node;
  std::optional<double> gpu_gib, host_gib;
  bool generate = false;
  int batch = 0;                  // --batch; 0: as many as fit
  std::vector<std::string> rest;  // --config and the overrides, for parse_config_args
};

int parse_count(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 1 || n > kMaxWorld)
    ST_BAD_INPUT("plan: ", flag, " expects a whole number from 1 to ", kMaxWorld, ", got '", st::excerpt(v), "'");
  return static_cast<int>(n);
}

double parse_gib(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double g = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(g) || g <= 0 || g > 1e9)
    ST_BAD_INPUT("plan: ", flag, " expects a positive size in GiB (e.g. 24 or 79.5), got '", st::excerpt(v), "'");
  return g;
}

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string flag = a, value;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    if (a == "--generate") {
      out.generate = true;
      continue;
    }
    if (flag != "--world" && flag != "--ranks-per-node" && flag != "--gpu-mem" && flag != "--host-mem" &&
        flag != "--batch") {
      out.rest.push_back(a);
      continue;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) ST_BAD_INPUT("plan: ", flag, " needs a value");
      value = args[++i];
    }
    if (flag == "--world") out.world = parse_count(flag, value);
    if (flag == "--ranks-per-node") out.ranks_per_node = parse_count(flag, value);
    if (flag == "--gpu-mem") out.gpu_gib = parse_gib(flag, value);
    if (flag == "--host-mem") out.host_gib = parse_gib(flag, value);
    if (flag == "--batch") out.batch = parse_count(flag, value);
  }
  return out;
}

std::string gib_text(double g) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f GiB", g);
  return b;
}

// The target's budgets: what the flags say, else what start-up would see on this host.
st::RunTarget make_target(const st::Config& cfg, const PlanArgs& a) {
  st::RunTarget t;
  t.world = a.world;
  t.ranks_per_node = a.ranks_per_node.value_or(std::min(a.world, 8));
  if (t.ranks_per_node > t.world)
    ST_BAD_INPUT("plan: --ranks-per-node ", t.ranks_per_node, " exceeds --world ", t.world);
  if (cfg.dist.sharding == st::ShardingMode::kHybrid && t.world % t.ranks_per_node != 0)
    ST_BAD_INPUT("plan: dist.sharding=hybrid needs nodes of equal size, but --world ", t.world,
                 " is not a multiple of --ranks-per-node ", t.ranks_per_node);
  if (cfg.train.device == st::Device::kCuda) {
    int64_t gpu = 0;
    if (a.gpu_gib) {
      gpu = static_cast<int64_t>(*a.gpu_gib * double(kGiB));
      t.device_name = "--gpu-mem " + gib_text(*a.gpu_gib);
    } else if (cfg.dist.max_gpu_mem_gib > 0) {
      gpu = static_cast<int64_t>(cfg.dist.max_gpu_mem_gib * double(kGiB));
      t.device_name = "dist.max_gpu_mem_gib " + gib_text(cfg.dist.max_gpu_mem_gib);
    } else {
      gpu = -1;
#ifdef SHARDTRAIN_HAVE_CUDA
      gpu = st::visible_device_free_bytes();
      t.device_name = "this host's first GPU";
#endif
      if (gpu < 0)
        ST_BAD_INPUT(
            "plan: train.device=cuda needs the GPU memory to plan for: give --gpu-mem GiB (or set "
            "dist.max_gpu_mem_gib); this host has no CUDA device to ask");
    }
    t.device.free = t.device.cap = gpu;
  }
  if (a.host_gib) {
    t.host.bytes = static_cast<int64_t>(*a.host_gib * double(kGiB)) / t.ranks_per_node;
    t.host.limited_by = st::str_cat("--host-mem gives each node ", gib_text(*a.host_gib),
                                    t.ranks_per_node > 1 ? st::str_cat(", ", st::format_gib(t.host.bytes),
                                                                       " for each of its ", t.ranks_per_node, " ranks")
                                                         : std::string());
    st::cap_host_memory_budget(&t.host, cfg.dist.max_host_mem_gib);  // the config's cap binds over the flag too
  } else {
    t.host = st::host_memory_budget(st::host_memory_limits(), t.ranks_per_node, cfg.dist.max_host_mem_gib);
  }
  return t;
}

const char* verdict(bool fits) { return fits ? "fits" : "does not fit"; }

// "12.34 GiB", or "56.7 MiB" under a GiB.
std::string bytes_text(int64_t bytes) {
  if (bytes >= kGiB) return st::format_gib(bytes);
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MiB", static_cast<double>(bytes) / double(int64_t{1} << 20));
  return b;
}

void print_plan(const st::RunPlan& p, const st::RunTarget& t) {
  if (p.device == st::Device::kCuda)
    std::printf("  device, per rank: %s\n    budget %s (%s): %s\n", p.device_plan.breakdown().c_str(),
                st::format_gib(t.device.usable()).c_str(), t.device_name.c_str(), verdict(p.device_fits));
  std::printf("  host, per rank: %s%s\n", p.host_breakdown().c_str(),
              p.device == st::Device::kCuda && p.cuda_host.speculated_units > 0 ? " (with the speculative copy)" : "");
  std::printf("    per node (%d rank(s)): %s; budget per rank %s (%s): %s\n", t.ranks_per_node,
              st::format_gib(p.host_total() * t.ranks_per_node).c_str(), st::format_gib(t.host.bytes).c_str(),
              t.host.limited_by.c_str(), verdict(p.host_fits));
  const st::StepTraffic& s = p.traffic;
  const std::string across =
      s.across_nodes > 0 ? st::str_cat(", all-reduce across nodes ", bytes_text(s.across_nodes)) : std::string();
  std::printf(
      "  communication, per rank and step (%lld micro-step(s)): all-gathers %s, reduce-scatters %s%s; %s of it "
      "between ranks\n",
      static_cast<long long>(s.micro_steps), bytes_text(s.gathered).c_str(), bytes_text(s.reduce_scattered).c_str(),
      across.c_str(), bytes_text(s.from_peers()).c_str());
}

// `plan --generate`: the decoder's placement on the target and each rank's device and host plans. A placement that
// does not fit prints place_decoder's refusal, which names what to lower.
int plan_generate(const st::Config& cfg, const st::RunTarget& t, int batch) {
  st::Config decode = cfg;
  decode.model = st::base_model(cfg.model);
  const bool cuda = cfg.train.device == st::Device::kCuda;
  const int want = batch > 0 ? batch : 16;
  st::DecoderPlacement placed{want, 1};
  if (cuda) {
    try {
      placed = st::place_decoder(decode, want, batch == 0, st::LayerSplit::kAuto, t.world, t.device,
                                 "the GPU (" + t.device_name + ")");
    } catch (const st::Error& e) {
      if (e.kind() != st::ErrorKind::kBadInput) throw;
      std::string why = e.what();
      const std::string prefix = st::process_prefix() + " ";
      if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      std::printf("  decoder: %s\ndoes not fit\n", why.c_str());
      return kExitDoesNotFit;
    }
  }
  const std::vector<st::UnitRange> ranges = st::split_units(decode.model, placed.max_batch, placed.stages);
  std::printf("  decoder: %s, %d sequence(s) of %lld positions\n",
              placed.stages > 1 ? st::str_cat("its layers split over ", placed.stages, " ranks (",
                                              st::describe_split(decode.model, ranges), ")")
                                      .c_str()
                                : "whole on each rank",
              placed.max_batch, static_cast<long long>(cfg.model.seq_len));
  int64_t host_most = 0;
  std::string host_breakdown;
  for (int s = 0; s < placed.stages; ++s) {
    const st::DecoderStage stage{s, placed.stages, ranges[static_cast<size_t>(s)], nullptr};
    const std::string who = placed.stages > 1 ? st::str_cat("rank ", s, ": ") : std::string();
    if (cuda)
      std::printf(
          "    device, %s%s\n", who.empty() ? "per rank: " : who.c_str(),
          st::decoder_footprint(decode.model, cfg.compute_dtype(), placed.max_batch, stage).breakdown().c_str());
    const st::DecoderHostPlan host = st::plan_decoder_host(cfg, placed.max_batch, stage);
    if (host.total() >= host_most) {
      host_most = host.total();
      host_breakdown = who + host.breakdown();
    }
  }
  if (cuda)
    std::printf("      budget %s (%s): fits\n", st::format_gib(t.device.usable()).c_str(), t.device_name.c_str());
  const bool host_fits = host_most <= t.host.bytes;
  std::printf("    host, %s%s\n      budget per rank %s (%s): %s\n",
              placed.stages > 1 ? "largest: " : "per rank: ", host_breakdown.c_str(),
              st::format_gib(t.host.bytes).c_str(), t.host.limited_by.c_str(), verdict(host_fits));
  std::puts(verdict(host_fits));
  return host_fits ? st::kExitOk : kExitDoesNotFit;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  const PlanArgs a = parse_plan_args(args);
  const ConfigArgs parsed = parse_config_args(a.rest);
  if (parsed.help) {
    std::fputs(kPlanUsage, stdout);
    return st::kExitOk;
  }
  if (!parsed.config && !a.generate) ST_BAD_INPUT("plan: --config FILE is required (the config whose run to plan)");
  if (a.batch > 0 && !a.generate) ST_BAD_INPUT("plan: --batch N plans generate's sequences: give --generate too");
  for (const std::string& o : parsed.overrides)
    if (o.rfind("--", 0) != 0 || o.find('.') == std::string::npos)
      ST_BAD_INPUT("plan: unknown argument '", st::excerpt(o),
                   "' (expected --world, --ranks-per-node, --gpu-mem, --host-mem, --generate, --batch, --config or "
                   "--section.key=value)");
  const st::Config cfg = st::load_config(parsed.config, parsed.overrides);
  const st::RunTarget t = make_target(cfg, a);
  const double p9 = static_cast<double>(st::count_params(st::build_units(cfg.model))) / 1e9;
  char count[32];
  std::snprintf(count, sizeof(count), "%.*f %s", p9 >= 1 ? 2 : 1, p9 >= 1 ? p9 : p9 * 1000, p9 >= 1 ? "B" : "M");
  const std::string what = st::str_cat(cfg.source, ": ", st::to_string(cfg.model.arch), ", ", count, " parameters, ",
                                       st::to_string(cfg.compute_dtype()), " on ", st::to_string(cfg.train.device));
  if (a.generate) {
    std::printf("plan: %s; generate on %d rank(s), %d per node\n", what.c_str(), t.world, t.ranks_per_node);
    return plan_generate(cfg, t, a.batch);
  }
  const st::RunPlan p = st::plan_run(cfg, t);
  std::printf("plan: %s; %d rank(s), %d per node, each unit sharded over %d%s\n", what.c_str(), t.world,
              t.ranks_per_node, p.shard_world, p.hybrid ? " (hybrid: one replica per node)" : "");
  print_plan(p, t);
  if (p.fits()) {
    std::puts("fits");
    if (const std::optional<st::PlanChange> fewer = st::fewest_recomputed_blocks(cfg, t)) {
      std::printf("with fewer blocks recomputed (less compute) it fits too: %s\n", fewer->overrides.c_str());
      print_plan(fewer->plan, fewer->target);
    }
    return st::kExitOk;
  }
  const std::optional<st::PlanChange> c = st::smallest_fitting_change(cfg, t);
  if (!c) {
    std::puts("does not fit; no change of recompute, micro-batch, offload or world size (up to 64 times) fits");
  } else {
    const int w = c->target.world, per_node = c->target.ranks_per_node;
    std::printf("does not fit; the smallest change that fits: %s%s\n", c->overrides.c_str(),
                w == t.world
                    ? ""
                    : st::str_cat(" (", (w + per_node - 1) / per_node, " node(s) of ", per_node, " rank(s))").c_str());
    print_plan(c->plan, c->target);
  }
  // Another way to train the model on this target, where the run's own knobs need more ranks or find nothing.
  if (!c || c->target.world != t.world)
    if (const std::optional<st::PlanChange> a = st::adapters_that_fit(cfg, t)) {
      std::printf("at this world size, LoRA adapters on a frozen base fit: %s\n", a->overrides.c_str());
      print_plan(a->plan, a->target);
    }
  return kExitDoesNotFit;
}
