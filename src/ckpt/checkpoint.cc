#include "shardtrain/ckpt/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>

#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/checkpoint_saver.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace fs = std::filesystem;

namespace st {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string hdf5_file_locking_mode() {
  std::string v = env_get("HDF5_USE_FILE_LOCKING");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (v == "FALSE") return "off (HDF5_USE_FILE_LOCKING=FALSE)";
  if (v == "BEST_EFFORT") return "best effort (HDF5_USE_FILE_LOCKING=BEST_EFFORT)";
  return "on (HDF5 default)";
}

std::string save_checkpoint(const Config& cfg, ModelBackend& model, const CheckpointState& state, Communicator& comm,
                            const std::string& protect) {
  Config sync = cfg;  // written and committed before this returns; a failure throws
  sync.ckpt.async = false;
  sync.ckpt.on_error = CkptOnError::kStop;
  CheckpointSaver saver(sync, model, comm, protect);
  saver.save(state);
  return saver.last_committed();
}

std::vector<std::string> committed_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  static const std::regex name_re("step_[0-9]{8}");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory() || !std::regex_match(e.path().filename().string(), name_re)) continue;
    if (fs::exists(e.path() / "manifest.json")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_latest_file(const std::string& dir) {
  if (dir.empty()) return;
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(latest, ec);  // a symlink is replaced, never followed
  if (ec || !fs::exists(st) || fs::is_regular_file(st) || fs::is_symlink(st)) return;
  ST_BAD_INPUT(latest.string(), " is ", fs::is_directory(st) ? "a directory" : "not a regular file",
               ": it must be a file holding the name of the newest committed step directory (e.g. step_00000100), "
               "written by shardtrain after each checkpoint. Remove it (checkpoints are found without it)");
}

std::optional<std::string> resolve_resume(const CkptConfig& cfg) {
  check_latest_file(cfg.dir);
  if (cfg.resume == "none") return std::nullopt;
  if (cfg.resume == "auto") {
    const std::vector<std::string> all = committed_checkpoints(cfg.dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  std::error_code ec;
  if (!fs::is_directory(cfg.resume, ec))
    ST_BAD_INPUT("ckpt.resume: checkpoint directory '", cfg.resume,
                 "' does not exist (use auto or none to start fresh)");
  if (!fs::exists(fs::path(cfg.resume) / "manifest.json"))
    ST_BAD_INPUT("ckpt.resume: '", cfg.resume, "' has no manifest.json: it is not a committed checkpoint");
  return cfg.resume;
}

namespace {

// The frozen base a LoRA checkpoint's adapters apply to: the files of init.from (this run's, which may have moved)
// with the digests the manifest recorded, read into the model; or the random base of the seed the model was
// initialised from, which must be the checkpoint's. Returns the base as this run read it (on rank 0, which hashed
// the files; empty elsewhere), for the run's next checkpoints.
ManifestBase load_lora_base(const Manifest& m, const Config& cfg, ModelBackend& model, Communicator& comm,
                            const std::string& manifest_path) {
  ManifestBase now;
  on_all_ranks(
      comm,
      [&] {
        if (comm.rank() == 0) now = check_base_of_checkpoint(m, cfg.init.from, cfg.train.seed, manifest_path);
      },
      "refused the LoRA base");
  if (!cfg.init.from.empty()) init_from_weights(cfg.init.from, cfg.model, model);
  if (comm.rank() == 0) ST_LOG_INFO("checkpoint: ", lora_base_read_text(m, cfg.init.from, cfg.train.seed));
  return now;
}

}  // namespace

CheckpointState load_checkpoint(const std::string& step_dir, const Config& cfg, ModelBackend& model, Communicator& comm,
                                CheckpointLoad purpose) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::string manifest_path = (fs::path(step_dir) / "manifest.json").string();
  const std::vector<UnitLayout>& units = model.units();
  Manifest m;
  on_all_ranks(comm, [&] {
    m = open_checkpoint(step_dir);
    check_model_matches(m, cfg.model, manifest_path);
    if (m.units.size() != units.size())
      ST_BAD_INPUT(manifest_path, ": ", m.units.size(), " units, the model has ", units.size());
    for (const UnitLayout& u : units) {
      const ManifestUnit& mu = m.units[static_cast<size_t>(u.index)];
      if (mu.name != u.name || mu.numel != u.numel)
        ST_BAD_INPUT(manifest_path, ": units[", u.index, "] is ", mu.name, " of ", mu.numel,
                     " elements, the model has ", u.name, " of ", u.numel);
    }
    // A file this world reads no element of is still accounted for: by rank 0, or in node-local copies
    // (ckpt.replicas = 1, each node's step_dir its own) by each node's leader for the files its copy holds.
    if (m.node_local ? comm.local_rank() == 0 : rank == 0) check_rank_file_sizes(step_dir, m);
  });

  // Unit by unit, in the order the files hold them: each unit's host view is filled from the old files that hold a
  // part of this rank's span, then pushed, before the next unit's is filled. Each old file this rank reads is read
  // once, in order, across the units (RankFileLoad), its digest checked at the end. At most kFilesOpenAtOnce files
  // are open at a time (three descriptors each): a load that reads more goes over the units once per batch of files,
  // each pull bringing back what the batches before pushed.
  constexpr size_t kFilesOpenAtOnce = 64;
  on_all_ranks(comm, [&] {
    std::vector<int> needed;  // a file this rank reads nothing of is not opened
    for (int r = 0; r < m.world_size; ++r)
      for (const UnitLayout& u : units)
        if (intersect(model.shard(u.index).span, m.files[static_cast<size_t>(r)].spans[static_cast<size_t>(u.index)])
                .count > 0) {
          needed.push_back(r);
          break;
        }
    for (size_t batch = 0; batch < needed.size(); batch += kFilesOpenAtOnce) {
      std::map<int, RankFileLoad> files;
      for (size_t i = batch; i < std::min(needed.size(), batch + kFilesOpenAtOnce); ++i)
        files.try_emplace(needed[i], step_dir, m, needed[i]);
      for (const UnitLayout& u : units) {
        auto part_in = [&](int r) {
          return intersect(model.shard(u.index).span,
                           m.files[static_cast<size_t>(r)].spans[static_cast<size_t>(u.index)]);
        };
        if (std::none_of(files.begin(), files.end(), [&](const auto& f) { return part_in(f.first).count > 0; }))
          continue;
        model.pull_unit(u.index);  // a device backend sizes its host view; the batches overwrite every owned element
        UnitShard& sh = model.shard(u.index);
        for (auto& [r, file] : files) {
          const ShardSpan part = part_in(r);
          if (part.count == 0) continue;
          const int64_t at = part.offset - sh.span.offset;
          file.read({SliceRead{u.name, ShardState::kParam, part, sh.param.data() + at},
                     SliceRead{u.name, ShardState::kExpAvg, part, sh.m.data() + at},
                     SliceRead{u.name, ShardState::kExpAvgSq, part, sh.v.data() + at}});
        }
        model.push_unit(u.index);
      }
      for (auto& [r, file] : files) file.finish();
    }
  });
  if (!m.gemm_algorithms.empty()) model.use_gemm_algorithms(m.gemm_algorithms);
  model.load_fp8_history(m.fp8_amax_history, manifest_path);
  CheckpointState s;
  s.step = m.step;
  s.optimizer_updates = m.optimizer_updates;
  s.skipped_steps = m.skipped_steps;
  s.loss_scale = m.loss_scale;
  s.loss_scale_good_steps = m.loss_scale_good_steps;
  if (m.world_size == world) s.rng_counters = m.rng_counters;
  s.data = DataOrder{m.global_batch, m.seed, m.shuffle, m.train_windows};
  if (m.model.lora.enabled()) s.base = load_lora_base(m, cfg, model, comm, manifest_path);
  comm.barrier();
  if (rank == 0 && purpose == CheckpointLoad::kResume)
    ST_LOG_INFO("checkpoint: resumed from ", step_dir, " (step ", m.step, ", written by ", m.world_size,
                " rank(s), loaded by ", world, ")");
  if (rank == 0 && purpose == CheckpointLoad::kRead)
    ST_LOG_INFO("checkpoint: loaded step ", m.step, " from ", step_dir, " (written by ", m.world_size,
                " rank(s), read by ", world, ")");
  return s;
}

void clean_uncommitted(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  static const std::regex tmp_re("step_[0-9]{8}\\.(tmp|old)-[0-9a-f]+");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory() && std::regex_match(e.path().filename().string(), tmp_re)) {
      ST_LOG_INFO("checkpoint: removing uncommitted ", e.path().string());
      fs::remove_all(e.path());
    }
  }
}

}  // namespace st
