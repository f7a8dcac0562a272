// The interface StepEngine, checkpoints and init.from use to drive a ZeRO-3 sharded model, whatever the
// device: ShardedModel (CPU, fp32, the reference; sharded_model.h) and CudaShardedModel (one GPU per
// rank, NCCL; cuda_sharded_model.h) implement it. make_model_backend() picks one from train.device.
//
// Both hold, per unit u, the fp32 master parameter shard, gradient accumulator and AdamW moments over
// this rank's ShardSpan (the same spans for the same world, whatever the backend), so a checkpoint is
// the same file on either. The host view shard(u) is the state itself on the CPU; a device backend
// keeps the state in device memory and fills one unit's host view on pull_unit(u) and reads it back on
// push_unit(u): checkpoint save pulls, load and init.from pull and push, one unit at a time.
//
//   std::unique_ptr<ModelBackend> m = make_model_backend(cfg, comm);
//   m->zero_grads();
//   loss_sum += m->micro_step(inputs, targets, dloss);  // grads accumulate in the shards
//   double sq = m->grad_sum_of_squares();               // local, over owned spans
//   m->adamw(u, runs);                                  // per unit, runs from adamw_runs()
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/gemm_algorithms.h"
#include "shardtrain/model/fp8_history.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/host_views.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/state_snapshot.h"

namespace st {

struct MemoryStats {
  int64_t sharded_state_bytes = 0;  // param + grad + m + v shards (+ compute-precision copies), padding included
  int64_t padding_elements = 0;     // per state vector, summed over units
  int64_t gather_buffer_bytes = 0;  // full-size parameter and gradient buffers, allocated once
  int64_t gathered_peak_bytes = 0;  // the most of those buffers in use at one time so far
  int64_t activation_bytes = 0;     // saved activations and backward scratch (device backends)
  int64_t workspace_bytes = 0;      // kernel scratch and library workspaces (device backends)
  int64_t device_in_use_bytes = 0;  // device memory in use now (cudaMemGetInfo; device backends). Every
                                    // buffer is allocated at set-up, so after it this is also the peak.
};

// How often each unit was gathered and reduce-scattered since construction.
struct CommCounters {
  std::vector<int64_t> gathers, reduce_scatters;  // per unit
  int64_t gathered_elements = 0;                  // received, padding included
  int64_t gathered_bytes = 0;                     // received, padding included (dist.fp8_gather: codes and maxima)
  int64_t reduce_scattered_elements = 0;          // sent
  int64_t replica_reduced_elements = 0;           // gradient shard elements all-reduced across nodes (hybrid)
  // Bytes this rank exchanged with ranks on other nodes: what an all-gather receives from them, what a
  // reduce-scatter sends them, and 2(r-1)/r of an all-reduce across r nodes (the volume of a ring or of direct
  // exchange; the number carries to any link).
  int64_t cross_node_bytes = 0;
};

class ModelBackend : public HostViews {
 public:
  // The ranks the state is sharded over (spans, gathers, the gradient norm's sum): the world, or with
  // dist.sharding=hybrid the ranks of this node. replica_index() is which copy of that sharded state this
  // rank holds (its node, in hybrid; always 0 in full); copy 0 writes the checkpoint files.
  virtual Communicator& shard_comm() { return comm(); }
  virtual int replica_index() const { return 0; }
  // "cpu/fp32", "cuda/bf16 on NVIDIA H200", for logs.
  virtual std::string describe() const = 0;
  // "cpu", or the CUDA device name ("NVIDIA H200"), which keys the MFU peak table (train/mfu.h).
  virtual std::string device_name() const = 0;

  virtual void zero_grads() = 0;
  // How many micro_step calls the step after zero_grads() will make (gradient accumulation). A backend that
  // moves the finished gradients somewhere (optimizer offload copies them to the host; hybrid sharding sums them
  // across nodes) does so during the last one; without this hint it treats every micro-step as the last, and
  // hybrid then refuses a second micro-step before zero_grads().
  virtual void expect_micro_steps(int64_t n) {}
  // The global index of the next micro_step's first sequence (data/sampler.h), which keys adapter dropout
  // (lora.dropout); -1: none. Evaluation and logits passes never drop.
  virtual void set_dropout_batch(int64_t first_sequence) {}
  // One training micro-step (forward, loss, backward, reduce-scatter) on this rank's micro_batch x
  // seq_len tokens (host arrays). Gradients of the loss, scaled by dloss per token, accumulate into the
  // grad shards. A target < 0 is not a target (a masked position): no loss, no gradient. Returns this rank's sum of
  // the per-token losses over its targets. Collective.
  virtual double micro_step(const int32_t* inputs, const int32_t* targets, float dloss) = 0;
  // Forward and loss only: the same sum. Collective.
  virtual double eval_micro(const int32_t* inputs, const int32_t* targets) = 0;
  // Logits over the real vocabulary at the last position of tokens[0, len) (B = 1). Collective.
  virtual void last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) = 0;

  // Sum of squares of this rank's owned gradient elements (not all-reduced), in double.
  virtual double grad_sum_of_squares() = 0;
  // AdamW on unit u's owned span: each run covers [offset, offset + count) relative to the span start,
  // with its own parameters (adamw_runs() in optim splits the span at tensor boundaries).
  virtual void adamw(int unit, const std::vector<AdamWRun>& runs) = 0;
  // The step's end with no host round trip between the backward and the optimizer (gates_on_device(): the cuda
  // backend without optimizer offload). The step's last micro-step goes in by micro_step_queued(), which returns
  // before the loss is known. queue_gated_update() then all-reduces the sum of squares and the losses on the device,
  // decides the step there (decide_step: norm, clip, skip) and queues every unit's AdamW with runs[unit], whose
  // grad_scale the decision replaces. finish_gated_step() waits for the decision alone, not for AdamW:
  //   m->micro_step_queued(in, tgt, dloss);
  //   m->queue_gated_update(earlier_losses, loss_scale, grad_clip, runs);   // runs: adamw_runs() of every unit
  //   GatedStep g = m->finish_gated_step();   // g.gate.skip: nothing was updated
  virtual bool gates_on_device() const { return false; }
  virtual void micro_step_queued(const int32_t* inputs, const int32_t* targets, float dloss);
  // earlier_losses: this rank's sum of the step's earlier micro-steps' loss sums (0 for one micro-step); a non-finite
  // one anywhere skips the step, as a non-finite last loss does.
  virtual void queue_gated_update(double earlier_losses, double loss_scale, float grad_clip,
                                  const std::vector<std::vector<AdamWRun>>& runs);
  struct GatedStep {
    double last_loss_sum = 0;  // this rank's loss sum of the last micro-step, as micro_step() returns it
    StepGate gate;             // what the device decided (grad_norm global)
  };
  virtual GatedStep finish_gated_step();

  // Whether the backend starts the optimizer during the backward (optim.offload_speculative resolved): the step
  // engine then hands it speculate_optimizer() before each step.
  virtual bool speculates() const { return false; }
  // optim.offload_speculative: the runs of every unit (by index) that the coming step's adamw() calls pass if the
  // step is neither clipped nor skipped. Called before the step's first micro-step. A backend that speculates
  // starts each offloaded unit's update as soon as its gradient reaches the host, beside the state it reads, and
  // adamw() keeps that result when its runs equal these exactly (else it redoes the update); empty runs: the step
  // speculates nothing. Only the cuda backend speculates (the config refuses the key elsewhere).
  virtual void speculate_optimizer(std::vector<std::vector<AdamWRun>> runs) {}
  // The step was skipped (non-finite): drop every speculative update and restore what it changed.
  virtual void drop_speculation() {}

  // train.fp8=delayed (model/fp8_history.h): the step's end for the casts' scales. The maxima the casts of every rank
  // took over the step's micro-steps are reduced (max) over the world and become the histories' newest entry when
  // `applied`, or are dropped (a skipped step). The step engine calls it at the end of every step that ran; nothing
  // under any other recipe. Collective.
  virtual void fp8_step_end(bool applied) {}
  // The amax history's entries, newest first (empty without delayed scaling or before the first applied step), for
  // checkpoints; and a checkpoint's entries for the casts from now on, ignored without delayed scaling. Refused
  // (kBadInput naming `from`) when an entry holds other than the model's sites x 3 maxima.
  virtual std::vector<std::vector<float>> fp8_history() { return {}; }
  virtual void load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) {}

  // The unit's full flat parameter (or gradient accumulator) buffer of numel elements, on every rank.
  // Collective.
  virtual std::vector<float> gather_params(int unit) = 0;
  virtual std::vector<float> gather_grads(int unit) = 0;
  // The unit's frozen segment (frozen_numel elements, units.h), in fp32, on every rank; empty for a unit without
  // frozen tensors. Collective.
  virtual std::vector<float> gather_frozen(int unit) = 0;

  // How many units' host views a device backend holds filled now, offloaded units not counted (0 on the CPU): what
  // tests check the streaming above with.
  virtual int64_t held_unit_views() const { return 0; }
  // Every unit at once: pull_unit over all units, for a whole-model copy (the default snapshot_state).
  void pull_state();
  // Copies this rank's param/m/v shards (owned elements) into `snap`, reusing its storage when big enough, for a
  // checkpoint written in the background. Between steps, on the thread that trains. The copy reflects every update
  // made so far and none made later; snap->wait() returns once it is complete. The default copies synchronously
  // after pull_state(); the cuda backend copies its device-resident units into pinned memory on a stream of its own,
  // behind the step's last update, holding each unit's next update until that unit is copied, and points at the
  // offloaded units' host state itself, holding their next updates until the writer calls snap->release().
  virtual void snapshot_state(StateSnapshot* snap);
  // Gives `snap` the storage snapshot_state() needs (pinned on cuda), so that the first snapshot does not pay for it.
  virtual void reserve_snapshot(StateSnapshot* snap);

  virtual MemoryStats memory() const = 0;
  // The most memory this rank has held at once so far, in bytes, for the metrics' mem_peak_bytes: on the
  // CPU the process's peak resident set (core/process_memory.h; ranks that share a process share it); on a
  // GPU the most device memory found in use (cudaMemGetInfo: total - free, which covers the CUDA context,
  // NCCL's and the libraries' own buffers), sampled after set-up, after every micro-step and at each call.
  // Never decreases.
  virtual int64_t peak_memory_bytes() = 0;
  virtual const CommCounters& counters() const = 0;
  // Milliseconds the computation spent waiting for communication since the last call: on the GPU, the
  // compute stream's stalls on the communication stream (timed with events around each wait); on the CPU,
  // where every collective blocks, the time inside the collectives of the schedule.
  virtual double take_exposed_comm_ms() = 0;
  // The per-op GPU time table over `steps` steps when SHARDTRAIN_PROFILE_OPS=1 (core/cuda_timer.h);
  // empty otherwise and on the CPU.
  virtual std::string op_profile(int64_t steps) { return ""; }

  // The GEMM algorithms in use (cuda: cuBLASLt's pick for every GEMM planned so far; empty elsewhere), for the
  // checkpoint; and a checkpoint's, for the GEMMs planned from now on. use_gemm_algorithms takes them only when
  // they were picked on this kind of device with this cuBLASLt, and otherwise says in the log that it picks anew.
  virtual GemmAlgorithms gemm_algorithms() const { return {}; }
  virtual void use_gemm_algorithms(const GemmAlgorithms& algorithms) {}
  // Starts the op profile afresh (the trainer calls it after the first step, whose one-time costs would
  // otherwise dominate a short run's table).
  virtual void reset_op_profile() {}
};

// fp8_step_end for a history every rank holds alike: the ranks' step maxima all-gathered over comm, their largest
// pushed (applied) or dropped. Nothing when history is null.
void fp8_history_step_end(Fp8AmaxHistory* history, Communicator& comm, bool applied);
// load_fp8_history's check: every entry holds the maxima of `sites` sites' three operands (kBadInput naming `from`).
void check_fp8_history_entries(const std::vector<std::vector<float>>& entries, int64_t sites, const std::string& from);

// The backend train.device names: ShardedModel for cpu, CudaShardedModel for cuda (kBadInput if this
// build has no CUDA backend or no device is visible).
std::unique_ptr<ModelBackend> make_model_backend(const Config& cfg, Communicator& comm);

}  // namespace st
