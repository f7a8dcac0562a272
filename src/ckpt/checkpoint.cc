#include "shardtrain/ckpt/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>

#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/log.h"

namespace fs = std::filesystem;

namespace st {
namespace {

[[noreturn]] void die_now(const char* point, int rank) {
  std::fprintf(stderr, "SHARDTRAIN_FAULT: %s on rank %d: SIGKILL\n", point, rank);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.h5", rank);
  return buf;
}

// What each rank tells rank 0 about its file: size and hash, through one fixed-size broadcast per rank. With
// hybrid sharding only the ranks of replica 0 write; `file` is the shard rank they write as (-1: no file).
struct FileRecord {
  int64_t bytes = 0;
  int32_t file = -1;
  char sha256[65] = {0};
};

std::vector<UnitSlice> slices_of(ModelBackend& model) {
  std::vector<UnitSlice> out;
  for (const UnitLayout& u : model.units()) {
    const UnitShard& sh = model.shard(u.index);
    out.push_back(UnitSlice{u.name, sh.span, sh.param.data(), sh.m.data(), sh.v.data()});
  }
  return out;
}

Manifest make_manifest(const Config& cfg, ModelBackend& model, const CheckpointState& state, int world,
                       const std::vector<FileRecord>& records) {
  Manifest m;
  m.step = state.step;
  m.world_size = world;
  m.config_ini = to_ini(cfg);
  m.model = cfg.model;
  for (const UnitLayout& u : model.units()) {
    ManifestUnit mu;
    mu.name = u.name;
    mu.numel = u.numel;
    for (const TensorSpec& t : u.tensors) mu.tensors.push_back(ManifestTensor{t.name, t.shape, t.offset});
    m.units.push_back(std::move(mu));
  }
  for (int r = 0; r < world; ++r) {
    ManifestFile f;
    f.name = rank_file_name(r);
    f.rank = r;
    f.bytes = records[static_cast<size_t>(r)].bytes;
    f.sha256 = records[static_cast<size_t>(r)].sha256;
    for (const UnitLayout& u : model.units()) f.spans.push_back(shard_span(u.numel, r, world));
    m.files.push_back(std::move(f));
  }
  m.optimizer_updates = state.optimizer_updates;
  m.lr_step = state.step;
  m.data_cursor = state.step * cfg.train.global_batch;
  m.global_batch = cfg.train.global_batch;
  m.seed = cfg.train.seed;
  m.shuffle = cfg.data.shuffle;
  m.train_windows = state.data.train_windows;
  m.rng_counters = state.rng_counters;
  if (m.rng_counters.empty()) m.rng_counters.assign(static_cast<size_t>(world), 0);
  m.loss_scale = state.loss_scale;
  m.loss_scale_good_steps = state.loss_scale_good_steps;
  m.skipped_steps = state.skipped_steps;
  m.gemm_algorithms = model.gemm_algorithms();
  return m;
}

// Renames tmp to final; a committed directory of the same step (a run that went back and saved the step
// again) is moved aside first and removed after.
void commit_rename(const fs::path& tmp, const fs::path& final_dir, const std::string& nonce) {
  fs::path old;
  if (fs::exists(final_dir)) {
    old = final_dir;
    old += ".old-" + nonce;
    if (std::rename(final_dir.c_str(), old.c_str()) != 0)
      ST_FAULT("cannot move ", final_dir.string(), " aside: ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    ST_FAULT("cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", std::strerror(errno));
  if (!old.empty()) fs::remove_all(old);
}

// Keeps the newest `keep` committed checkpoints, and `protect` (the one resumed from) whatever its age.
void apply_keep(const std::string& dir, int64_t keep, const std::string& protect) {
  if (keep <= 0) return;
  const std::vector<std::string> all = committed_checkpoints(dir);
  const fs::path keep_path = protect.empty() ? fs::path() : fs::weakly_canonical(protect);
  const int64_t old = static_cast<int64_t>(all.size()) - keep;
  for (int64_t i = 0; i < old; ++i) {
    const std::string& d = all[static_cast<size_t>(i)];
    if (!protect.empty() && fs::weakly_canonical(d) == keep_path) continue;
    fs::remove_all(d);
    ST_LOG_INFO("ckpt.keep=", keep, ": removed ", d);
  }
}

}  // namespace

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
  const int rank = comm.rank(), world = comm.world_size();
  // The files: one per rank of the sharding group (the world, or a node in hybrid), written by replica 0.
  const int file = model.shard_comm().rank(), files = model.shard_comm().world_size();
  const bool writer = model.replica_index() == 0;
  const auto t0 = std::chrono::steady_clock::now();
  model.pull_state();  // a device backend copies its shards to the host view
  // One nonce for all ranks, so they all write into the same temporary directory.
  uint64_t nonce_bits = 0;
  if (rank == 0)
    nonce_bits = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (static_cast<uint64_t>(::getpid()) << 32);
  comm.broadcast(&nonce_bits, sizeof(nonce_bits), 0);
  char nonce[20];
  std::snprintf(nonce, sizeof(nonce), "%016llx", static_cast<unsigned long long>(nonce_bits));
  const fs::path dir(cfg.ckpt.dir);
  const fs::path final_dir = dir / step_dir_name(state.step);
  const fs::path tmp = dir / (step_dir_name(state.step) + ".tmp-" + nonce);
  const fs::path my_file = tmp / rank_file_name(file);

  // 1. Every writing rank writes and fsyncs its own file (with hybrid sharding, replica 0's ranks).
  FileRecord mine;
  std::string my_error;
  if (writer) {
    try {
      std::error_code ec;
      fs::create_directories(tmp, ec);
      if (ec) ST_FAULT("cannot create ", tmp.string(), ": ", ec.message());
      const std::vector<UnitSlice> slices = slices_of(model);
      if (fault_injected("ckpt_enospc", rank, state.step))
        ST_FAULT("cannot write ", my_file.string(), ": ", std::strerror(ENOSPC), " (injected by SHARDTRAIN_FAULT)");
      if (fault_injected("ckpt_mid_write", rank, state.step)) {
        // Half the units reach the disk, then the process dies as if killed mid-write.
        write_shard_file(my_file.string(), file, files, state.step,
                         std::vector<UnitSlice>(slices.begin(), slices.begin() + static_cast<long>(slices.size() / 2)));
        die_now("ckpt_mid_write", rank);
      }
      const WrittenFile written = write_shard_file(my_file.string(), file, files, state.step, slices);
      mine.bytes = written.bytes;
      mine.file = file;
      std::snprintf(mine.sha256, sizeof(mine.sha256), "%s", written.sha256.c_str());
    } catch (const Error& e) {
      my_error = e.what();
    }
  }

  // 2. All ranks agree that all succeeded.
  std::vector<double> failed(static_cast<size_t>(world), 0.0);
  failed[static_cast<size_t>(rank)] = my_error.empty() ? 0.0 : 1.0;
  comm.all_reduce(failed.data(), world);
  std::string failed_ranks;
  for (int r = 0; r < world; ++r)
    if (failed[static_cast<size_t>(r)] != 0.0) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!failed_ranks.empty()) {
    // Every rank is past its write: the temporary directory is removed now rather than at the next start, so a
    // full disk gets its space back and nothing half-written stays beside the committed checkpoints.
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    ST_FAULT("checkpoint of step ", state.step, " not committed: rank(s) ", failed_ranks, " failed to write",
             my_error.empty() ? std::string() : ": " + my_error);
  }

  // 3. Rank 0 learns every file's size and hash, writes the manifest and commits.
  std::vector<FileRecord> records(static_cast<size_t>(files));
  for (int r = 0; r < world; ++r) {
    FileRecord rec = (r == rank) ? mine : FileRecord{};
    comm.broadcast(&rec, sizeof(rec), r);
    if (rec.file >= 0) records[static_cast<size_t>(rec.file)] = rec;
  }
  if (rank == 0) {
    const Manifest m = make_manifest(cfg, model, state, files, records);
    write_file_atomic((tmp / "manifest.json").string(), manifest_to_json(m));
    if (fault_injected("ckpt_before_rename", rank, state.step)) die_now("ckpt_before_rename", rank);
    commit_rename(tmp, final_dir, nonce);
    fsync_path(dir.string());
    check_latest_file(cfg.ckpt.dir);  // a directory made at `latest` during the run: bad input, the step committed
    write_file_atomic((dir / "latest").string(), step_dir_name(state.step) + "\n");
    apply_keep(cfg.ckpt.dir, cfg.ckpt.keep, protect);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t total = 0;
    for (const FileRecord& r : records) total += r.bytes;
    ST_LOG_INFO("checkpoint: saved step ", state.step, " to ", final_dir.string(), " (", files, " files, ", total,
                " bytes, ", sec, " s)");
  }
  comm.barrier();
  return final_dir.string();
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
    ST_BAD_INPUT("ckpt.resume: checkpoint directory '", cfg.resume, "' does not exist (use auto or none to start fresh)");
  if (!fs::exists(fs::path(cfg.resume) / "manifest.json"))
    ST_BAD_INPUT("ckpt.resume: '", cfg.resume, "' has no manifest.json: it is not a committed checkpoint");
  return cfg.resume;
}

CheckpointState load_checkpoint(const std::string& step_dir, const Config& cfg, ModelBackend& model,
                                Communicator& comm) {
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
    // A file this world reads no element of is still accounted for.
    if (rank == 0) check_rank_file_sizes(step_dir, m);
  });

  model.pull_state();  // a device backend sizes its host view; every owned element is overwritten below
  on_all_ranks(comm, [&] {
    // Old files are opened (and checked) only when one of this rank's spans meets theirs.
    std::map<int, std::unique_ptr<ShardFileReader>> readers;
    auto reader = [&](int r) -> const ShardFileReader& {
      auto it = readers.find(r);
      if (it != readers.end()) return *it->second;
      return *readers.emplace(r, std::make_unique<ShardFileReader>(open_rank_file(step_dir, m, r))).first->second;
    };
    for (const UnitLayout& u : units) {
      UnitShard& sh = model.shard(u.index);
      for (int r = 0; r < m.world_size; ++r) {
        const ShardSpan part = intersect(sh.span, m.files[static_cast<size_t>(r)].spans[static_cast<size_t>(u.index)]);
        if (part.count == 0) continue;
        const ShardFileReader& f = reader(r);
        const int64_t at = part.offset - sh.span.offset;
        f.read(u.name, ShardState::kParam, part, sh.param.data() + at);
        f.read(u.name, ShardState::kExpAvg, part, sh.m.data() + at);
        f.read(u.name, ShardState::kExpAvgSq, part, sh.v.data() + at);
      }
    }
  });
  model.push_state();
  if (!m.gemm_algorithms.empty()) model.use_gemm_algorithms(m.gemm_algorithms);
  CheckpointState s;
  s.step = m.step;
  s.optimizer_updates = m.optimizer_updates;
  s.skipped_steps = m.skipped_steps;
  s.loss_scale = m.loss_scale;
  s.loss_scale_good_steps = m.loss_scale_good_steps;
  if (m.world_size == world) s.rng_counters = m.rng_counters;
  s.data = DataOrder{m.global_batch, m.seed, m.shuffle, m.train_windows};
  comm.barrier();
  if (rank == 0)
    ST_LOG_INFO("checkpoint: resumed from ", step_dir, " (step ", m.step, ", written by ", m.world_size,
                " rank(s), loaded by ", world, ")");
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
