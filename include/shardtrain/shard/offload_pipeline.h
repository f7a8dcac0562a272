// Optimizer offload on the CUDA backend (optim.offload, optim.offload_fraction, optim.offload_speculative): for the
// offloaded units (the last ones in forward order, memory_plan.h's offloaded_units) the fp32 master and AdamW
// moments live in host memory and AdamW runs on HostAdamW's threads, overlapped with the GPU.
//
// The pipeline owns, per offloaded unit: the host state (the checkpoint view: param, m, v), the pinned gradient
// and result buffers, the device copy of the parameters in the compute type that gathers read (with
// optim.offload=optimizer), and the events of its trip; plus the staging buffers that carry parameters kept on the
// host (optimizer+params) to a gather, the speculative second copy of the state, and the D2H, offload and H2D
// streams. The model calls down into it; it never reaches back.
//
// One step of an offloaded unit:
//   1. grad_final(u, grad, s): during the last micro-step, as soon as the unit's gradient shard is final on stream
//      s, it is copied to pinned memory on the D2H stream, behind the rest of the backward. With speculation, the
//      host AdamW starts on it at once with the step's unclipped runs, writing the second copy.
//   2. update(u, runs, grad, s): the step's AdamW. A speculative update whose runs equal these is kept (the copies
//      swap); otherwise the job is queued now. The offload stream waits on a host function for the job, then copies
//      the new parameters up (optimizer) or leaves them in pinned memory (optimizer+params). The trainer's thread
//      does not wait.
//   3. gather_source(u, comm): the next forward's gather waits for that on the GPU: it reads the device copy, or
//      a staging buffer filled from pinned memory just before.
// The update needs the global gradient norm (clipping, the finite check), so it starts once the backward is done
// and overlaps the next forward; host AdamW and GPU AdamW give the same bits.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/optim/host_adamw.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

template <typename T>
class OffloadPipeline {
 public:
  struct Options {
    OffloadMode mode = OffloadMode::kOptimizer;  // optimizer or optimizer+params
    bool speculative = false;            // optim.offload_speculative as the host plan resolved it (host_plan.h)
    int threads = 0;                     // optim.offload_threads (0: the machine's share)
    int local_rank = 0, local_size = 1;  // this process among the machine's GPU processes (HostAdamW's CPUs)
    int device = 0;                      // this rank's CUDA device
    bool log = false;                    // this rank logs the decisions (rank 0)
  };
  // states[u]: the host state of each unit (span and slot set; for an offloaded unit, param initialised and m, v
  // zero; others are left empty and unused). offloaded[u]: the unit's optimizer is on the host. device_copies[u]:
  // with optim.offload=optimizer, each offloaded unit's compute-type parameters on the device, which its gathers
  // read; empty otherwise. Uploads every offloaded unit's rounded parameters (synchronously).
  OffloadPipeline(const Options& options, std::vector<bool> offloaded, std::vector<UnitShard> states,
                  std::vector<DeviceBuffer<T>> device_copies);
  ~OffloadPipeline();

  bool holds(int unit) const { return offloaded_[static_cast<size_t>(unit)]; }
  bool params_on_host(int unit) const { return holds(unit) && mode_ == OffloadMode::kOptimizerParams; }
  bool any() const;
  // The unit's host state, once every host job has finished: what checkpoints read and write.
  UnitShard& state(int unit);
  // "3 of 14 units, 25.0% of the parameters; host AdamW: ..." for the log.
  std::string describe(const std::vector<UnitLayout>& units) const;

  // A new step: the compute stream (which the reduce-scatters that overwrite the gradient shards follow) waits for
  // the last step's gradient copies.
  void start_step(cudaStream_t compute);
  // Step 1 above: `grad` is final once `final_stream` has run what it has queued so far.
  void grad_final(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  // Step 2 above.
  void update(int unit, const std::vector<AdamWRun>& runs, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  // Step 3 above: the source a gather of `unit` issued on `comm` reads, ready on `comm`; *staged says whether it is a
  // staging buffer (then gather_issued() must follow the gather on `comm`).
  const T* gather_source(int unit, cudaStream_t comm, bool* staged);
  void gather_issued(cudaStream_t comm);

  // Whether updates start during the backward on a second copy of the state (Options::speculative).
  bool speculates() const { return speculative_; }
  // The coming step's unclipped runs of every unit (ModelBackend::speculate_optimizer).
  void set_speculative_runs(std::vector<std::vector<AdamWRun>> runs) { speculative_runs_ = std::move(runs); }
  // The step was skipped: drop every speculative update and restore what it changed.
  void drop_speculation();

  // A checkpoint snapshot reads the host state: from now on, a job of unit u is held until copied[u] is true (the
  // writer has released it), so that no update overwrites what the checkpoint has not written yet.
  void hold_updates_until(std::shared_ptr<const std::vector<std::atomic<bool>>> copied) { copied_ = std::move(copied); }
  // After checkpoint load wrote state(unit): its rounded copy goes where gathers read it (synchronous).
  void push(int unit);
  void wait_all() { host_adamw_->wait_all(); }
  // Every copy this pipeline queued has finished.
  void synchronize();

 private:
  // The host AdamW waits on the offload stream for its job (a CUDA host function: it may block, and calls no CUDA
  // API), so the stream's H2D copy of the new shard starts the moment the CPU is done.
  struct CpuWait {
    HostAdamW* engine = nullptr;
    int64_t ticket = -1;
  };
  static void wait_for_cpu(void* arg);
  struct Unit {
    PinnedBuffer<float> grad;   // the finished gradient shard, copied from the device during backward
    PinnedBuffer<T> out;        // the new parameters in T, written by the host AdamW, copied to the device
    DeviceBuffer<T> device;     // optimizer: the parameters in T on the device, which gathers read
    CudaEvent grad_copied;      // the gradient has arrived in `grad`
    CudaEvent params_ready;     // the host AdamW is done (and, with params on the device, they are there)
    bool grad_on_host = false;  // this step's copy has been issued
    // What the offload stream's host function waits on, one per submission in turn: with speculation this thread
    // may queue the next step's job before the stream has run the last one's function (at most one ahead).
    CpuWait waits[2];
    int64_t submissions = 0;
    int64_t ticket = -1;      // the last job submitted
    bool speculated = false;  // this step's speculative update is queued
    // optim.offload_speculative: the second copy of the host state, which a speculative update writes.
    std::vector<float> next_param, next_m, next_v;
  };
  // optim.offload=optimizer+params: a gather's source, copied up from `out` just before the all-gather.
  struct Staging {
    DeviceBuffer<T> data;
    CudaEvent ready, free;
  };
  void copy_grad_to_host(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  HostAdamW::Job job_for(int unit, const std::vector<AdamWRun>& runs);
  void hold_for_snapshot(int unit, HostAdamW::Job* job) const;
  void upload_after_host_update(int unit);
  void upload(int unit);  // synchronous: `out` = the host master rounded to T, and its device copy
  void speculate(int unit);

  OffloadMode mode_;
  HalfKind kind_;
  int device_;
  bool log_;
  std::vector<bool> offloaded_;
  std::vector<UnitShard> states_;
  std::unique_ptr<HostAdamW> host_adamw_;
  std::vector<Unit> units_;
  bool speculative_ = false;
  std::vector<std::vector<AdamWRun>> speculative_runs_;           // this step's, by unit
  std::shared_ptr<const std::vector<std::atomic<bool>>> copied_;  // hold_updates_until(); null: nothing held
  int64_t spec_kept_ = 0, spec_redone_ = 0, spec_dropped_ = 0;    // for the log
  std::vector<Staging> staging_;
  size_t next_staging_ = 0;
  Staging* staged_ = nullptr;  // the source of the gather being issued, when staged
  CudaEvent final_mark_;
  CudaStream d2h_stream_, offload_stream_, h2d_stream_;
};

}  // namespace st
