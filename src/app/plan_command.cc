// `shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB] [--section.key=value
// ...]`: the run's memory plan (shard/run_plan.h) on a target, without starting a job and without a GPU. Prints per
// rank and per node the device plan and the host plan, term by term, whether the config fits and, if not, the
// smallest change that does (shard/plan_search.h). The plans are the ones `train` checks at start-up.
//
//   $ shardtrain plan --config configs/llama3.1-8b.ini --world 2 --gpu-mem 24 --host-mem 64
//   plan: configs/llama3.1-8b.ini: llama, 8.03 B parameters, bf16 on cuda; 2 rank(s), 2 per node, each unit ...
//     device, per rank: sharded state 15.94 GiB, ...; total 27.36 GiB
//       budget 24.00 GiB (--gpu-mem 24.00 GiB): does not fit
//     host, per rank: optimizer state 44.87 GiB, ...; total 58.29 GiB
//       per node (2 rank(s)): 116.57 GiB; budget per rank 32.00 GiB (...): does not fit
//   does not fit; the smallest change that fits: --world 4 (2 node(s) of 2 rank(s))
//     ... (the plan with the change)
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
#include "shardtrain/model/units.h"
#include "shardtrain/shard/plan_search.h"
#include "shardtrain/shard/run_plan.h"

namespace {

constexpr const char* kPlanUsage =
    "usage: shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB]\n"
    "                       [--section.key=value ...]\n"
    "  the memory plan of a run, per rank and per node, without starting it (no GPU needed):\n"
    "  --world N           ranks (default 1)\n"
    "  --ranks-per-node N  ranks sharing one host's memory (default: min(world, 8), nodes of 8 GPUs)\n"
    "  --gpu-mem GiB       usable memory of each GPU (default: dist.max_gpu_mem_gib, else the free memory of this\n"
    "                      host's first GPU; needed for train.device=cuda on a host without one)\n"
    "  --host-mem GiB      host memory of each node (default: what this host has available for the run)\n"
    "  exit codes: 0 fits, 3 does not fit (with the smallest change that does), 2 bad input\n";

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int kMaxWorld = 1 << 20;

struct PlanArgs {
  int world = 1;
  std::optional<int> ranks_per_node;
  std::optional<double> gpu_gib, host_gib;
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
    if (flag != "--world" && flag != "--ranks-per-node" && flag != "--gpu-mem" && flag != "--host-mem") {
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
  } else {
    t.host = st::host_memory_budget(st::host_memory_limits(), t.ranks_per_node);
  }
  return t;
}

const char* verdict(bool fits) { return fits ? "fits" : "does not fit"; }

void print_plan(const st::RunPlan& p, const st::RunTarget& t) {
  if (p.device == st::Device::kCuda)
    std::printf("  device, per rank: %s\n    budget %s (%s): %s\n", p.device_plan.breakdown().c_str(),
                st::format_gib(t.device.usable()).c_str(), t.device_name.c_str(), verdict(p.device_fits));
  std::printf("  host, per rank: %s%s\n", p.host_breakdown().c_str(),
              p.device == st::Device::kCuda && p.speculative ? " (with the speculative copy)" : "");
  std::printf("    per node (%d rank(s)): %s; budget per rank %s (%s): %s\n", t.ranks_per_node,
              st::format_gib(p.host_total() * t.ranks_per_node).c_str(), st::format_gib(t.host.bytes).c_str(),
              t.host.limited_by.c_str(), verdict(p.host_fits));
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  const PlanArgs a = parse_plan_args(args);
  const ConfigArgs parsed = parse_config_args(a.rest);
  if (parsed.help) {
    std::fputs(kPlanUsage, stdout);
    return st::kExitOk;
  }
  if (!parsed.config) ST_BAD_INPUT("plan: --config FILE is required (the config whose run to plan)");
  for (const std::string& o : parsed.overrides)
    if (o.rfind("--", 0) != 0 || o.find('.') == std::string::npos)
      ST_BAD_INPUT("plan: unknown argument '", st::excerpt(o),
                   "' (expected --world, --ranks-per-node, --gpu-mem, --host-mem, --config or --section.key=value)");
  const st::Config cfg = st::load_config(parsed.config, parsed.overrides);
  const st::RunTarget t = make_target(cfg, a);
  const st::RunPlan p = st::plan_run(cfg, t);
  const double p9 = static_cast<double>(st::count_params(st::build_units(cfg.model))) / 1e9;
  std::printf("plan: %s: %s, %.*f %s parameters, %s on %s; %d rank(s), %d per node, each unit sharded over %d%s\n",
              cfg.source.c_str(), st::to_string(cfg.model.arch), p9 >= 1 ? 2 : 1, p9 >= 1 ? p9 : p9 * 1000,
              p9 >= 1 ? "B" : "M", st::to_string(cfg.compute_dtype()), st::to_string(cfg.train.device), t.world,
              t.ranks_per_node, p.shard_world, p.hybrid ? " (hybrid: one replica per node)" : "");
  print_plan(p, t);
  if (p.fits()) {
    std::puts("fits");
    return st::kExitOk;
  }
  const std::optional<st::PlanChange> c = st::smallest_fitting_change(cfg, t);
  if (!c) {
    std::puts("does not fit; no change of recompute, micro-batch, offload or world size (up to 64 times) fits");
    return kExitDoesNotFit;
  }
  const int w = c->target.world, per_node = c->target.ranks_per_node;
  std::printf("does not fit; the smallest change that fits: %s%s\n", c->overrides.c_str(),
              w == t.world
                  ? ""
                  : st::str_cat(" (", (w + per_node - 1) / per_node, " node(s) of ", per_node, " rank(s))").c_str());
  print_plan(c->plan, c->target);
  return kExitDoesNotFit;
}
