// Optimizer offload on the CUDA backend (optim.offload, optim.offload_fraction, optim.offload_speculative): for the
// offloaded units (the last ones in forward order, memory_plan.h's offloaded_units) the fp32 master and AdamW
// moments live in host memory and AdamW runs on HostAdamW's threads, overlapped with the GPU.
//
// The pipeline owns, per offloaded unit: the host state (the checkpoint view: param, m, v), the device copy of the
// parameters in the compute type that gathers read (with optim.offload=optimizer) or their pinned copy (with
// optimizer+params), and the events of its trip; plus the pinned staging that carries gradients down and results up,
// the staging buffers that carry parameters kept on the host to a gather, the speculative second copy of the state,
// and the D2H, offload and H2D streams. The model calls down into it; it never reaches back.
//
// One step of an offloaded unit that does not speculate (none does when the host has no room for a second copy):
//   1. update(u, runs, grad, s): the step's AdamW, once the gradient norm is known. The unit goes to the stager, a
//      thread of this pipeline that takes room in the staging ring (staging_ring.h) once earlier units have given
//      it back, copies the gradient shard down into it on the D2H stream, and queues the host AdamW's job behind that
//      copy. The offload stream waits on a host function for the job, then copies the new parameters up from the
//      ring (optimizer) or leaves them in their pinned copy (optimizer+params). The trainer's thread does not wait.
//   2. gather_source(u, comm): the next forward's gather waits for that on the GPU: it reads the device copy, or
//      a staging buffer filled from pinned memory just before. The next step's reduce-scatter into the gradient shard
//      follows that gather, so the copy down has read the shard by then.
// A unit that speculates (optim.offload_speculative: the last offloaded units, as many as the host plan holds with
// their second copies; host_plan.h's speculated_units) has a pinned gradient and result buffer of its own instead:
// grad_final(u, grad, s) copies the shard down as soon as it is final, during the backward, and the host AdamW starts
// on it at once with the step's unclipped runs, writing the second copy; update() keeps it when its runs equal the
// step's, else queues the job again. Where units of both kinds exist, the speculated units' copies up go through the
// stager's queue too, so that the offload stream runs every unit's copy up in unit order.
// The update needs the global gradient norm (clipping, the finite check), so it starts once the backward is done
// and overlaps the next forward; host AdamW and GPU AdamW give the same bits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/optim/host_adamw.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/staging_ring.h"

namespace st {

template <typename T>
class OffloadPipeline {
 public:
  struct Options {
    OffloadMode mode = OffloadMode::kOptimizer;  // optimizer or optimizer+params
    int speculated_units = 0;            // how many of the offloaded units speculate, from the last back (host_plan.h)
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
  // the last step's gradient copies of the speculated units.
  void start_step(cudaStream_t compute);
  // For a unit that speculates, the copy down and the speculative update: `grad` is final once `final_stream` has run
  // what it has queued so far. For one that does not, nothing (update() copies it).
  void grad_final(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  // Step 1 above. `grad` must stay unchanged until the unit's next gather_source().
  void update(int unit, const std::vector<AdamWRun>& runs, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  // Step 2 above: the source a gather of `unit` issued on `comm` reads, ready on `comm`; *staged says whether it is a
  // staging buffer (then gather_issued() must follow the gather on `comm`).
  const T* gather_source(int unit, cudaStream_t comm, bool* staged);
  void gather_issued(cudaStream_t comm);

  // Whether any unit's update starts during the backward on a second copy of the state (Options::speculated_units).
  bool speculates() const { return speculated_ > 0; }
  bool speculates(int unit) const { return speculative_[static_cast<size_t>(unit)]; }
  // The coming step's unclipped runs of every unit (ModelBackend::speculate_optimizer).
  void set_speculative_runs(std::vector<std::vector<AdamWRun>> runs) { speculative_runs_ = std::move(runs); }
  // The step was skipped: drop every speculative update and restore what it changed.
  void drop_speculation();

  // A checkpoint snapshot reads the host state: from now on, a job of unit u is held until copied[u] is true (the
  // writer has released it), so that no update overwrites what the checkpoint has not written yet.
  void hold_updates_until(std::shared_ptr<const std::vector<std::atomic<bool>>> copied);
  // After checkpoint load wrote state(unit): its rounded copy goes where gathers read it (synchronous).
  void push(int unit);
  // Every update queued so far has finished on the host.
  void wait_all();
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
    PinnedBuffer<float> grad;   // speculating: the finished gradient shard, copied from the device during backward
    PinnedBuffer<T> out;        // speculating or params on the host: the new parameters in T, written by the host
                                // AdamW (otherwise, with params on the device, they pass through the ring)
    DeviceBuffer<T> device;     // optimizer: the parameters in T on the device, which gathers read
    CudaEvent final_mark;       // not speculating: the gradient shard is final (update())
    CudaEvent grad_copied;      // the gradient has arrived on the host
    CudaEvent params_ready;     // the host AdamW is done (and, with params on the device, they are there)
    CudaEvent uploaded;         // not speculating, params on the device: the copy up has left the ring
    bool grad_on_host = false;  // speculating: this step's copy has been issued
    int64_t requested = 0;      // requests given to the stager (trainer thread, under stage_mu_)
    int64_t staged = 0;         // ... and issued by it (under stage_mu_)
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
  // An update given to the stager (a unit that does not speculate), or a speculated unit's copy up, whose job is
  // submitted (upload_only).
  struct StageRequest {
    int unit;
    std::vector<AdamWRun> runs;
    const float* grad;  // the device shard
    int64_t bytes;
    bool upload_only = false;
  };
  // A range of the ring in use, oldest first: free once the job has finished and, with params on the device, the
  // copy up has landed (the stager's own).
  struct InFlight {
    int unit;
    int64_t ticket;
  };
  void copy_grad_to_host(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream);
  HostAdamW::Job job_for(int unit, const std::vector<AdamWRun>& runs);
  void hold_for_snapshot(int unit, HostAdamW::Job* job) const;
  void upload_after_host_update(int unit, const T* out);
  void upload(int unit);    // synchronous: the host master rounded to T, into `out` or its device copy
  T* out_buffer(int unit);  // where upload() rounds to: `out`, or the start of the idle ring
  void speculate(int unit);
  void upload_speculated(int unit);
  void give_stager(StageRequest r);
  void run_stager();
  void stage(const StageRequest& r);
  void wait_staged(int unit);  // until the stager has issued every update of `unit` given to it
  void drain();                // until the stager has issued everything given to it

  // For the units that do not speculate: the staging ring and its memory, and the stager thread with its queue.
  StagingRing ring_{0};
  PinnedBuffer<float> ring_memory_;
  std::deque<InFlight> in_flight_;  // the stager's
  std::mutex stage_mu_;
  std::condition_variable stage_cv_, staged_cv_;
  std::deque<StageRequest> stage_queue_;
  bool stage_busy_ = false, stage_stop_ = false;
  std::exception_ptr stage_error_;
  std::thread stager_;

  OffloadMode mode_;
  HalfKind kind_;
  int device_;
  bool log_;
  std::vector<bool> offloaded_;
  std::vector<UnitShard> states_;
  std::unique_ptr<HostAdamW> host_adamw_;
  std::vector<Unit> units_;
  std::vector<bool> speculative_;                                 // by unit: host_plan.h's speculated_units
  int speculated_ = 0;                                            // how many
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
