// The host side of optimizer offload: AdamW over host-resident shards on a pool of worker threads, with the
// SIMD kernels of kernels/adamw_host.h. Jobs (one per unit) are queued and taken by priority (lowest first), in
// submission order among equals; each is cut into tiles of kTileElements that the workers share, so one large
// unit (the tied embedding) uses every thread. The caller goes on while they run and waits for a job only when it needs that unit's result.
//
//   HostAdamW::Options o;
//   o.local_rank = comm.local_rank();
//   o.local_size = comm.local_size();
//   HostAdamW engine(o);
//   const int64_t t = engine.submit({param, m, v, grad, runs, HalfKind::kBF16, out});
//   ...                                                 // e.g. the GPU's work for other units
//   engine.wait(t);                                     // param/m/v/out of that unit are final
//
// Threads: the ranks of a node split the CPUs this process may run on (sched_getaffinity) into equal slices by
// local rank. Each rank's workers are pinned to its slice except the slice's first CPU, which is left to the
// rank's own thread, the one that feeds the GPU. threads = 0 takes every other CPU of the slice.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {

class HostAdamW {
 public:
  // 32 Ki floats: 128 KiB per state array, about 0.6 MiB of a tile's arrays in flight: L2-sized.
  static constexpr int64_t kTileElements = int64_t{1} << 15;

  struct Options {
    int threads = 0;  // 0: one per CPU of this rank's slice but the first
    int local_rank = 0, local_size = 1;
    SimdIsa isa = fastest_simd_isa();
  };
  // One shard's update: runs (from adamw_runs) over param/m/v/grad, and the rounded copy in `out` (kind). The new
  // state goes to param_out/m_out/v_out where set (arrays beside the ones read, not overlapping them), else in place.
  struct Job {
    float* param = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    const float* grad = nullptr;
    std::vector<AdamWRun> runs;
    HalfKind kind = HalfKind::kNone;
    uint16_t* out = nullptr;
    float* param_out = nullptr;
    float* m_out = nullptr;
    float* v_out = nullptr;
    int64_t priority = 0;  // lower runs first (the unit index: the next forward needs unit 0 first)
    // When set, the job starts only once this returns true (its gradient has landed: a CUDA event query). Asked
    // by one worker at a time, under the pool's lock, every 200 us, for the oldest gated job only (so gates must
    // open in submission order), until it does; it must not block.
    std::function<bool()> ready;
  };

  explicit HostAdamW(const Options& options);
  ~HostAdamW();
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  // Queues a job; returns its ticket.
  int64_t submit(Job job);
  // Blocks until job `ticket` has finished.
  void wait(int64_t ticket);
  // Blocks until every submitted job has finished.
  void wait_all();

  int threads() const { return static_cast<int>(workers_.size()); }
  SimdIsa isa() const { return isa_; }
  // "8 threads pinned to CPUs 17-24, avx512", for the log.
  std::string describe() const { return describe_; }

 private:
  struct Tile {
    int run;
    int64_t offset, count;  // within the run
  };
  struct Pending {
    Job job;
    std::vector<Tile> tiles;
    size_t next = 0, finished = 0;
    bool open = false;  // job.ready() has returned true (or there is none)
  };
  void work(int cpu);
  void run_tile(const Job& job, const Tile& tile) const;

  SimdIsa isa_;
  std::string describe_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::map<int64_t, std::unique_ptr<Pending>> pending_;  // by ticket, until finished
  int64_t next_ticket_ = 0;
  bool stop_ = false;
  bool polling_ = false;  // a worker is polling the oldest gate
  std::vector<std::thread> workers_;
};

}  // namespace st
