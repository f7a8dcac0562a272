// ZeRO-3 execution of the GPT model: each rank holds 1/N of every unit's parameters, gradients and AdamW
// moments, and runs the schedule of schedule.h, gathering a unit's parameters just before it is used and
// releasing them right after, and reduce-scattering each unit's full gradient into the owners' shards.
//
// Per rank and unit u with S_u = padded_shard_size(numel_u, N), the sharded state is four fp32 vectors
// of S_u elements (master params, gradient accumulator, Adam m and v): 16 * sum_u S_u bytes, i.e.
// 16 P / N plus at most 16 (N - 1) bytes of padding per unit. Nothing full-size persists between calls:
// the gather and full-gradient buffers below are scratch, allocated once.
//
//   ShardedModel m(cfg, comm);
//   m.zero_grads();
//   for (micro...) loss_sum += m.micro_step(inputs, targets, dloss);   // grads accumulate in the shards
//   // optimizer steps m.shard(u) over m.shard(u).span
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/model/unit_model.h"
#include "shardtrain/optim/host_adamw.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/fp8_gather.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/schedule.h"
#include "shardtrain/shard/schedule_runner.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/sharding.h"

namespace st {

class ShardedModel final : public ModelBackend, private ScheduleExecutor {
 public:
  // Initialises this rank's parameter shards from cfg.train.seed (identical to one process's init).
  ShardedModel(const Config& cfg, Communicator& comm);

  const std::vector<UnitLayout>& units() const override { return model_->units(); }
  UnitShard& shard(int unit) override {
    settle();
    return shards_[static_cast<size_t>(unit)];
  }
  const UnitShard& shard(int unit) const {
    settle();
    return shards_[static_cast<size_t>(unit)];
  }
  Communicator& comm() override { return comm_; }
  Communicator& shard_comm() override { return groups_.shard(); }
  int replica_index() const override { return groups_.replica_index(); }
  std::string describe() const override;
  std::string device_name() const override { return "cpu"; }

  void zero_grads() override;
  void expect_micro_steps(int64_t n) override { micro_steps_left_ = n; }

  // One training micro-step (forward, loss, backward, reduce-scatter) on this rank's micro-batch of
  // micro_batch x seq_len tokens. Gradients of the loss scaled by dloss per token accumulate into the
  // grad shards. Returns this rank's loss sum over its targets (targets < 0 are not). Collective.
  double micro_step(const int32_t* inputs, const int32_t* targets, float dloss) override;
  void set_dropout_batch(int64_t first_sequence) override { first_sequence_ = first_sequence; }
  // Forward and loss only. Collective.
  double eval_micro(const int32_t* inputs, const int32_t* targets) override;
  // Logits over the real vocabulary at the last position of tokens[0, len) (B = 1). Collective.
  void last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) override;

  double grad_sum_of_squares() override;
  void fp8_step_end(bool applied) override {
    fp8_history_step_end(model_->fp8_history(), comm_, applied);
    ++params_epoch_;  // the history's pick moved
  }
  std::vector<std::vector<float>> fp8_history() override;
  void load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) override;
  void adamw(int unit, const std::vector<AdamWRun>& runs) override;

  // The unit's full flat parameter buffer (numel elements), on every rank. Collective.
  std::vector<float> gather_params(int unit) override;
  // Same for the gradient accumulators.
  std::vector<float> gather_grads(int unit) override;
  std::vector<float> gather_frozen(int unit) override;
  // The view is the state, except an NF4 unit's frozen view (model_backend.h): pull fills it with
  // unwritten_frozen(), push quantises what a loader wrote there, and both push and release free it.
  void pull_unit(int unit) override;
  void push_unit(int unit) override;
  void release_unit(int unit) override;

  MemoryStats memory() const override;
  int64_t peak_memory_bytes() override;
  const CommCounters& counters() const override { return counters_; }
  double take_exposed_comm_ms() override {
    const double ms = comm_ms_;
    comm_ms_ = 0;
    return ms;
  }

 private:
  enum class Mode { kTrain, kEval, kLogits };
  struct Slot {
    std::vector<float> data;
    int unit = -1;  // which unit's buffer it holds, -1 if free
  };
  double run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets, float dloss);
  // ScheduleExecutor: each collective blocks; compute runs on this thread.
  void gather(int unit, size_t at) override;
  void embedding_forward() override;
  void block_forward(int unit) override;
  void head(int unit) override;
  void block_backward(int unit) override;
  void embedding_backward() override;
  void reduce_scatter(int unit) override;
  void release(int unit) override;
  // The unit's `state` vectors of every rank, cut to `numel` elements (slot and slot_count: the state's per-rank
  // size, the trainable or the frozen one).
  std::vector<float> gather_full(int unit, std::vector<float> UnitShard::*state, int64_t UnitShard::*slot,
                                 int64_t numel);
  // Blocks and the head share one buffer under ZeRO-3; without resharding after forward each keeps its own.
  Slot& param_slot(int unit) {
    if (unit == 0) return emb_param_;
    return unit_params_[unit_params_.size() == 1 ? 0 : static_cast<size_t>(unit - 1)];
  }
  Slot& grad_slot(int unit) { return unit == 0 ? emb_grad_ : unit_grad_; }
  const float* gathered(int unit);
  // An NF4 unit's frozen segment, gathered and dequantised into `segment` (frozen_numel floats).
  void gather_nf4(int unit, float* segment);
  // Segment `segment` (0 trainable, 1 frozen) of `unit` gathered into `full` (the unit's gathered buffer) as
  // fp8_gather.h says, from this rank's slot of it (`shard`): its FP8 weights as the values their codes decode to, the
  // rest as they are; with dist.fp8_gather_keep, in training, from the block kept since the shard last changed. Returns
  // the bytes this rank received.
  int64_t gather_fp8(int unit, int segment, const float* shard, float* full);
  float* full_grad(int unit);
  void occupy(Slot& s, int unit);
  void release(Slot& s, int unit);
  // Hybrid: unit's gradient shard is final for this step (its last micro-step's reduce-scatter is in): into the
  // replica buckets, and every full bucket summed across nodes.
  void finish_grad(int unit);

  // With optim.offload the optimizer runs on the HostAdamW threads while this thread goes on; everything that
  // reads the shards first waits for it.
  void settle() const {
    if (offload_) offload_->wait_all();
  }

  Config cfg_;
  Communicator& comm_;
  ShardingGroups groups_;               // dist.sharding: the world (full) or this node's ranks plus the replica group
  std::unique_ptr<UnitModel> model_;    // the family's CPU model
  std::unique_ptr<HostAdamW> offload_;  // optim.offload=optimizer: the host AdamW engine, else null
  std::vector<UnitShard> shards_;
  // Unit 0 (the tied embedding) is live at the same time as the head, so it has slots of its own.
  Slot emb_param_, emb_grad_, unit_grad_;
  std::vector<Slot> unit_params_;
  std::vector<bool> in_place_;  // per unit: it reads its parameters from its shard (units_in_place: one rank)
  std::vector<float> rs_scratch_;
  std::vector<Nf4UnitStorage> nf4_storage_;  // per unit (empty parts for units without an NF4 base)
  std::vector<float> nf4_full_;              // an NF4 unit's gathered storage (world > 1)
  // dist.fp8_gather: each unit's trainable and frozen segments' plans (empty: gathered in fp32), and the staging that
  // every gather shares: one rank's block of codes and rest, every rank's.
  std::vector<std::array<Fp8GatherSegment, 2>> fp8_segments_;
  std::vector<float> fp8_send_, fp8_recv_;
  // dist.fp8_gather_keep: each segment's block and inverse scales as a training gather sent them, and the shard's
  // epoch they were cast at; params_epoch_ moves wherever a shard or the amax history may change (a step's start, the
  // optimizer, a load), so that a kept block serves only gathers of the same shard and history.
  struct KeptFp8 {
    std::vector<float> block, inverse;
    int64_t epoch = -1;
  };
  std::vector<std::array<KeptFp8, 2>> fp8_kept_;
  int64_t params_epoch_ = 0;
  CommTuning tuning_;                        // dist.bucket_mb resolved (hybrid)
  std::unique_ptr<ReplicaBuckets> buckets_;  // hybrid: the cross-node all-reduce's buckets
  std::vector<float> bucket_;                // hybrid: one bucket's shards, contiguous
  int64_t micro_steps_left_ = 0;             // expect_micro_steps(), counted down by micro_step()
  bool last_micro_ = true;                   // the running micro-step is the step's last
  bool summed_across_nodes_ = false;         // hybrid: this step's gradients went across nodes (zero_grads clears)
  int64_t in_use_bytes_ = 0, peak_bytes_ = 0;
  double comm_ms_ = 0;  // time inside the schedule's collectives, for take_exposed_comm_ms()
  CommCounters counters_;
  // The schedule being run: its batch, mode, targets and loss scale, and the loss its head computed.
  const int32_t* tokens_ = nullptr;
  int64_t batch_ = 0, len_ = 0;
  std::vector<float>* logits_out_ = nullptr;
  Mode mode_ = Mode::kTrain;
  const int32_t* targets_ = nullptr;
  float dloss_ = 0.0f;
  double loss_ = 0.0;            // the head's loss sum
  int64_t first_sequence_ = -1;  // set_dropout_batch, for the next micro-step only
};

}  // namespace st
