#include "shardtrain/ckpt/checkpoint_saver.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/file_transfer.h"
#include "shardtrain/ckpt/file_write.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/node_local.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/log.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

std::string format_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", ms);
  return buf;
}

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

// What a rank reports about its file. With hybrid sharding only the ranks of replica 0 write; `file` is the shard
// rank they write as (-1: no file).
struct FileRecord {
  int64_t bytes = 0;
  int file = -1;
  std::string digest;  // file_digest with kDigestPieceBytes, lowercase hex
};

// One rank's slot of the control words, summed over ranks (every other rank adds zeros to it). Every value is an
// integer below 2^53, so the sum carries it exactly: the digest goes as eight 32-bit words.
enum Word : int { kStatus, kFile, kBytes, kSha, kCommit = kSha + 8, kSlot };
enum Status : int { kWriting = 0, kWritten = 1, kWriteFailed = 2 };
enum Commit : int { kNotYet = 0, kCommitted = 1, kCommitFault = 2, kCommitBadInput = 3 };

void put_record(const FileRecord& r, double* slot) {
  slot[kFile] = r.file + 1;
  slot[kBytes] = static_cast<double>(r.bytes);
  for (int i = 0; i < 8 && r.digest.size() == 64; ++i)
    slot[kSha + i] = static_cast<double>(std::stoul(r.digest.substr(static_cast<size_t>(8 * i), 8), nullptr, 16));
}

FileRecord take_record(const double* slot) {
  FileRecord r;
  r.file = static_cast<int>(slot[kFile]) - 1;
  r.bytes = static_cast<int64_t>(slot[kBytes]);
  char hex[9];
  for (int i = 0; i < 8; ++i) {
    std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(slot[kSha + i]));
    r.digest += hex;
  }
  return r;
}

// Renames tmp to final; a committed directory of the same step (a run that went back and saved the step
// again) is moved aside first and removed after.
void commit_rename(const fs::path& tmp, const fs::path& final_dir, const std::string& nonce) {
  fs::path old;
  if (fs::exists(final_dir)) {
    old = final_dir;
    old += ".old-" + nonce;
    if (std::rename(final_dir.c_str(), old.c_str()) != 0)
      ST_FAULT("cannot move ", final_dir.string(), " aside: ", errno_text());
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    ST_FAULT("cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", errno_text());
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

// One piece of background work at a time: a thread that runs `fn` and records how it ended.
class Job {
 public:
  ~Job() { join(); }
  void start(std::function<void()> fn) {
    join();
    done_.store(false, std::memory_order_relaxed);
    thread_ = std::thread([this, fn = std::move(fn)] { record(fn); });
  }
  // Runs `fn` on this thread, recorded as start() records it: a synchronous save writes on the thread that trains,
  // which is the one that may pull the state from the device.
  void run_here(const std::function<void()>& fn) {
    join();
    record(fn);
  }
  // True once the work has ended; error() and kind() are then this run's.
  bool finished() const { return !thread_.joinable() || done_.load(std::memory_order_acquire); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::string& error() const { return error_; }
  ErrorKind kind() const { return kind_; }

 private:
  void record(const std::function<void()>& fn) {
    error_.clear();
    kind_ = ErrorKind::kFault;
    try {
      fn();
    } catch (const Error& e) {
      error_ = e.what();
      kind_ = e.kind();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done_.store(true, std::memory_order_release);
  }

  std::thread thread_;
  std::atomic<bool> done_{true};
  std::string error_;
  ErrorKind kind_ = ErrorKind::kFault;
};

}  // namespace

struct CheckpointSaver::Impl {
  enum class Phase { kIdle, kWriting, kCommitting };

  const Config& cfg;
  ModelBackend& model;
  Communicator& comm;
  std::string protect;
  int rank = 0, world = 1;
  int file = 0, files = 1;  // this rank's file and the number of files (the sharding group)
  bool writer = true;       // replica 0 writes the files
  bool leader = true;       // commits: rank 0, or with ckpt.replicas = 1 each node's local rank 0 (its own dir)
  std::string dir;          // ckpt.dir, or with ckpt.replicas = 1 this node's (node_ckpt_dir)
  std::string nonce;
  std::string last_committed;
  // ckpt.replicas = 1: the ring of replica holders, and the communicator the write job sends replicas over (a dup:
  // the training thread's collectives never see its traffic).
  bool replicas = false;
  NodeLayout layout;
  std::unique_ptr<Communicator> replica_comm;
  std::vector<int> committers;  // the ranks whose commit ends a save: rank 0, or every node's leader

  StateSnapshot snap;
  GemmAlgorithms gemm;
  std::vector<std::vector<float>> fp8_history;  // train.fp8=delayed's, as of the step saved
  Phase phase = Phase::kIdle;
  CheckpointState state;
  fs::path tmp, final_dir;
  Clock::time_point started;
  double snapshot_ms = 0;
  double wait_ms = 0;  // the last save()'s wait for the save before it
  bool warned_wait = false;
  Job job;
  FileRecord mine;                  // set by the write job before it ends
  FileTake replica;                 // ckpt.replicas = 1: the source rank's file, received by the write job
  std::vector<FileRecord> records;  // every file's, once all are written
  std::vector<int> file_of_rank;    // which file each rank wrote (-1: none), once all are written

  Impl(const Config& c, ModelBackend& m, Communicator& co, std::string p)
      : cfg(c), model(m), comm(co), protect(std::move(p)) {
    rank = comm.rank();
    world = comm.world_size();
    file = model.shard_comm().rank();
    files = model.shard_comm().world_size();
    writer = model.replica_index() == 0;
    leader = rank == 0;
    dir = cfg.ckpt.dir;
    committers = {0};
    replicas = cfg.ckpt.replicas == 1;
    if (replicas) {
      layout = node_layout(comm);
      check_replica_layout(layout);
      check_replica_sharding(model, comm);
      leader = comm.local_rank() == 0;
      dir = node_ckpt_dir(cfg.ckpt.dir, comm.node_id());
      committers.clear();
      for (const std::vector<int>& on : layout.ranks) committers.push_back(on[0]);
      replica_comm = comm.dup();
    }
    // One nonce for all ranks and all of this run's saves: the step names the directory, the nonce the run.
    uint64_t bits = 0;
    if (rank == 0)
      bits = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (static_cast<uint64_t>(::getpid()) << 32);
    comm.broadcast(&bits, sizeof(bits), 0);
    char buf[20];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(bits));
    nonce = buf;
    // The snapshot's memory is taken now, not at the first save's step (pinning gigabytes takes a while).
    if (cfg.ckpt.async && writer && !cfg.ckpt.dir.empty()) model.reserve_snapshot(&snap);
  }

  // The write job: this rank's file, into the temporary directory: from the snapshot (ckpt.async), or from the state
  // itself, one unit at a time (each pulled to the host as the write reaches it and released after).
  void write_file() {
    // However the write ends, the state it reads from may change again afterwards.
    struct Release {
      StateSnapshot& s;
      ~Release() {
        if (s.release) std::exchange(s.release, nullptr)();
      }
    } release{snap};
    snap.wait();
    std::error_code ec;
    fs::create_directories(tmp, ec);
    if (ec) ST_FAULT("cannot create ", tmp.string(), ": ", ec.message());
    const fs::path path = tmp / rank_file_name(file);
    std::vector<UnitSlice> slices;
    if (cfg.ckpt.async) {
      for (const StateSnapshot::Unit& u : snap.units)
        slices.push_back(UnitSlice{u.name, u.span, u.param, u.exp_avg, u.exp_avg_sq});
    } else {
      for (const UnitLayout& u : model.units()) slices.push_back(UnitSlice{u.name, model.shard(u.index).span});
    }
    const UnitSource pulled{
        [this](size_t i) {
          const int u = static_cast<int>(i);
          model.pull_unit(u);
          const UnitShard& sh = model.shard(u);
          return UnitSlice{model.units()[i].name, sh.span, sh.param.data(), sh.m.data(), sh.v.data()};
        },
        [this](size_t i) { model.release_unit(static_cast<int>(i)); }};
    // Hashed as written.
    auto write = [&](const std::vector<UnitSlice>& units) {
      return cfg.ckpt.async ? write_shard_file(path.string(), file, files, state.step, units)
                            : write_shard_file(path.string(), file, files, state.step, units, pulled);
    };
    if (fault_injected("ckpt_enospc", rank, state.step))
      ST_FAULT("cannot write ", path.string(), ": ", errno_text(ENOSPC), " (injected by SHARDTRAIN_FAULT)");
    if (fault_injected("ckpt_mid_write", rank, state.step)) {
      // Half the units reach the disk, then the process dies as if killed mid-write.
      write(std::vector<UnitSlice>(slices.begin(), slices.begin() + static_cast<long>(slices.size() / 2)));
      die_now("ckpt_mid_write", rank);
    }
    const WrittenFile written = write(slices);
    mine.bytes = written.bytes;
    mine.digest = written.digest;
    mine.file = file;
  }

  // The write job with ckpt.replicas = 1: this rank's file, then the exchange of the ring (this file to the holder,
  // the source's file from it, at once). The exchange runs whatever the write did, since the holder waits for this
  // rank's header and this rank holds for its source; a failed write offers nothing and fails the save.
  void write_and_replicate() {
    std::exception_ptr failed;
    try {
      write_file();
    } catch (...) {
      failed = std::current_exception();
    }
    FileOffer offer;
    if (!failed)
      offer =
          FileOffer{mine.file, (tmp / rank_file_name(mine.file)).string(), mine.bytes, mine.digest, kDigestPieceBytes};
    replica = FileTake{};
    try {
      transfer_files(*replica_comm, layout.holder_of(rank), &offer, layout.source_of(rank), &replica,
                     [this](int f) { return (tmp / rank_file_name(f)).string(); });
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
  }

  Manifest make_manifest() const {
    Manifest m;
    m.step = state.step;
    m.world_size = files;
    m.config_ini = to_ini(cfg);
    m.model = cfg.model;
    for (const UnitLayout& u : model.units()) {
      ManifestUnit mu;
      mu.name = u.name;
      mu.numel = u.numel;
      for (const TensorSpec& t : u.tensors)
        if (!t.frozen) mu.tensors.push_back(ManifestTensor{t.name, t.shape, t.offset});
      m.units.push_back(std::move(mu));
    }
    for (int r = 0; r < files; ++r) {
      ManifestFile f;
      f.name = rank_file_name(r);
      f.rank = r;
      f.bytes = records[static_cast<size_t>(r)].bytes;
      f.digest = records[static_cast<size_t>(r)].digest;
      for (const UnitLayout& u : model.units()) f.spans.push_back(shard_span(u.numel, r, files));
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
    if (m.rng_counters.empty()) m.rng_counters.assign(static_cast<size_t>(files), 0);
    m.loss_scale = state.loss_scale;
    m.loss_scale_good_steps = state.loss_scale_good_steps;
    m.skipped_steps = state.skipped_steps;
    m.gemm_algorithms = gemm;
    m.fp8_amax_history = fp8_history;
    m.base = state.base;
    if (replicas) {
      ManifestNodeLocal nl;
      nl.node = comm.node_id();
      nl.nodes = layout.nodes;
      for (int r : layout.ranks[static_cast<size_t>(nl.node)])
        nl.primaries.push_back(file_of_rank[static_cast<size_t>(r)]);
      for (int r : layout.ranks[static_cast<size_t>((nl.node + 1) % nl.nodes)])
        nl.replicas.push_back(file_of_rank[static_cast<size_t>(r)]);
      std::sort(nl.primaries.begin(), nl.primaries.end());
      std::sort(nl.replicas.begin(), nl.replicas.end());
      m.node_local = std::move(nl);
    }
    return m;
  }

  // The commit job, on each committer (rank 0, or every node's leader in its own directory) once every file is
  // written. On failure the temporary directory goes too, unless the rename happened (then the step is committed
  // and only `latest` or ckpt.keep failed).
  void commit() {
    bool renamed = false;
    try {
      const Manifest m = make_manifest();
      write_file_atomic((tmp / "manifest.json").string(), manifest_to_json(m));
      if (fault_injected("ckpt_before_rename", rank, state.step)) die_now("ckpt_before_rename", rank);
      commit_rename(tmp, final_dir, nonce);
      renamed = true;
      fsync_path(dir);
      check_latest_file(dir);  // a directory made at `latest` during the run: bad input, the step committed
      write_file_atomic((fs::path(dir) / "latest").string(), step_dir_name(state.step) + "\n");
      apply_keep(dir, cfg.ckpt.keep, protect);
      int64_t total = 0;
      for (const FileRecord& r : records) total += r.bytes;
      ST_LOG_INFO("checkpoint: saved step ", state.step, " to ", final_dir.string(), " (", files, " files, ", total,
                  " bytes, ", seconds_since(started), " s",
                  cfg.ckpt.async ? str_cat(", in the background after a ", format_ms(snapshot_ms), " snapshot") : "",
                  m.node_local ? str_cat("; this node's ", m.node_local->primaries.size(), " files and node ",
                                         (m.node_local->node + 1) % m.node_local->nodes, "'s ",
                                         m.node_local->replicas.size(), " as replicas")
                               : "",
                  ")");
    } catch (...) {
      if (!renamed) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      }
      throw;
    }
  }

  void start(const CheckpointState& s) {
    state = s;
    started = Clock::now();
    final_dir = fs::path(dir) / step_dir_name(state.step);
    tmp = fs::path(dir) / (step_dir_name(state.step) + ".tmp-" + nonce);
    gemm = model.gemm_algorithms();
    fp8_history = model.fp8_history();
    mine = FileRecord{};
    records.clear();
    phase = Phase::kWriting;
    if (!writer) return;  // hybrid: another node's ranks hold the same shards and write them
    if (!cfg.ckpt.async) {
      // Written from the state itself while training waits, on this thread, one unit at a time: no second copy in
      // host memory.
      snap.units.clear();
      snap.ready = nullptr;
      if (replicas) {
        job.run_here([this] { write_and_replicate(); });
      } else {
        job.run_here([this] { write_file(); });
      }
      return;
    }
    model.snapshot_state(&snap);
    snapshot_ms = seconds_since(started) * 1e3;
    if (replicas) {
      job.start([this] { write_and_replicate(); });
    } else {
      job.start([this] { write_file(); });
    }
  }

  int64_t words() const { return phase == Phase::kIdle ? 0 : static_cast<int64_t>(world) * kSlot; }

  void put(double* w) const {
    std::fill(w, w + words(), 0.0);
    double* slot = w + static_cast<size_t>(rank) * kSlot;
    if (phase == Phase::kWriting) {
      if (!writer) {
        slot[kStatus] = kWritten;  // nothing to write
      } else if (job.finished()) {
        slot[kStatus] = job.error().empty() ? kWritten : kWriteFailed;
        if (job.error().empty()) put_record(mine, slot);
      }
    } else if (phase == Phase::kCommitting && leader && job.finished()) {
      slot[kCommit] = job.error().empty()                  ? kCommitted
                      : job.kind() == ErrorKind::kBadInput ? kCommitBadInput
                                                           : kCommitFault;
    }
  }

  // A failed save: every rank logs (warn) or throws (stop) the same outcome, with its own error where it has one.
  void fail(ErrorKind kind, const std::string& what) {
    job.join();
    phase = Phase::kIdle;
    const std::string mine_text = job.error().empty() ? std::string() : ": " + job.error();
    const std::string message = str_cat("checkpoint of step ", state.step, " not committed: ", what, mine_text);
    if (cfg.ckpt.on_error == CkptOnError::kWarn) {
      if (leader || !mine_text.empty())
        ST_LOG_WARN(message, "; training goes on (ckpt.on_error = warn); ",
                    last_committed.empty() ? std::string("no save of this run has committed yet")
                                           : "the newest committed checkpoint is " + last_committed);
      return;
    }
    if (kind == ErrorKind::kBadInput) ST_BAD_INPUT(message);
    ST_FAULT(message);
  }

  void take(const double* w) {
    if (phase == Phase::kWriting) {
      std::string failed;
      for (int r = 0; r < world; ++r) {
        const double s = w[static_cast<size_t>(r) * kSlot + kStatus];
        if (s == kWriting) return;  // a rank is still writing: all act only once every write has ended
        if (s == kWriteFailed) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
      }
      job.join();
      if (!failed.empty()) {
        // Every rank is past its write: the temporary directory goes now rather than at the next start, so a
        // full disk gets its space back and nothing half-written stays beside the committed checkpoints.
        if (leader) {
          std::error_code ec;
          fs::remove_all(tmp, ec);
        }
        // No rank stops before the leaders have removed it: under mpirun the first rank to exit ends the others.
        comm.barrier();
        fail(ErrorKind::kFault, str_cat("rank(s) ", failed, " failed to write"));
        return;
      }
      records.assign(static_cast<size_t>(files), FileRecord{});
      file_of_rank.assign(static_cast<size_t>(world), -1);
      for (int r = 0; r < world; ++r) {
        const FileRecord rec = take_record(w + static_cast<size_t>(r) * kSlot);
        file_of_rank[static_cast<size_t>(r)] = rec.file;
        if (rec.file >= 0) records[static_cast<size_t>(rec.file)] = rec;
      }
      phase = Phase::kCommitting;
      if (leader) job.start([this] { commit(); });
      return;
    }
    if (phase == Phase::kCommitting) {
      // Every committer's slot: the save ends once all have ended, committed or not.
      std::string failed;
      bool bad_input = false;
      for (int c : committers) {
        const double v = w[static_cast<size_t>(c) * kSlot + kCommit];
        if (v == kNotYet) return;
        if (v == kCommitted) continue;
        bad_input = bad_input || v == kCommitBadInput;
        failed += str_cat(failed.empty() ? "" : ", ",
                          replicas ? layout.describe_node(layout.node_of[static_cast<size_t>(c)]) : "rank 0");
      }
      if (failed.empty()) {
        job.join();
        phase = Phase::kIdle;
        last_committed = final_dir.string();
        return;
      }
      fail(bad_input ? ErrorKind::kBadInput : ErrorKind::kFault, str_cat(failed, " could not commit it"));
    }
  }

  void drain() {
    while (phase != Phase::kIdle) {
      job.join();  // this rank's part first: the all-reduce below then waits only for the others
      std::vector<double> w(static_cast<size_t>(words()));
      put(w.data());
      comm.all_reduce(w.data(), static_cast<int64_t>(w.size()));
      take(w.data());
    }
  }
};

CheckpointSaver::CheckpointSaver(const Config& cfg, ModelBackend& model, Communicator& comm, std::string protect)
    : impl_(std::make_unique<Impl>(cfg, model, comm, std::move(protect))) {}

CheckpointSaver::~CheckpointSaver() = default;

void CheckpointSaver::save(const CheckpointState& state) {
  Impl& d = *impl_;
  ST_CHECK(!d.cfg.ckpt.dir.empty(), "CheckpointSaver::save without ckpt.dir");
  const bool was_pending = pending();
  const int64_t previous = d.state.step;
  const auto t0 = Clock::now();
  d.drain();
  d.wait_ms = seconds_since(t0) * 1e3;
  if (was_pending && d.leader && !d.warned_wait) {
    d.warned_wait = true;
    ST_LOG_WARN("checkpoint: the save of step ", state.step, " waited ", format_ms(d.wait_ms), " for step ", previous,
                "'s to commit: saves come faster than they are written (ckpt.every = ", d.cfg.ckpt.every,
                "); the metrics' ckpt_wait_ms has each wait. Raise ckpt.every, or see docs/performance.md");
  }
  d.start(state);
  if (!impl_->cfg.ckpt.async) impl_->drain();
}

int64_t CheckpointSaver::control_words() const { return impl_->words(); }
void CheckpointSaver::put_control(double* words) const { impl_->put(words); }
void CheckpointSaver::take_control(const double* summed) { impl_->take(summed); }
void CheckpointSaver::drain() { impl_->drain(); }
bool CheckpointSaver::pending() const { return impl_->phase != Impl::Phase::kIdle; }
std::string CheckpointSaver::last_committed() const { return impl_->last_committed; }
double CheckpointSaver::last_wait_ms() const { return impl_->wait_ms; }

}  // namespace st
