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
//   for (micro...) loss += m.micro_step(inputs, targets, dloss);   // grads accumulate in the shards
//   // optimizer steps m.shard(u) over m.shard(u).span
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/gpt.h"
#include "shardtrain/shard/schedule.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

// One unit's state on this rank. Vectors hold `slot` elements: the first span.count are the owned
// elements [span.offset, span.end()) of the unit; the rest is padding that stays zero.
struct UnitShard {
  ShardSpan span;
  int64_t slot = 0;  // padded_shard_size(numel, world)
  std::vector<float> param, grad, m, v;
};

struct MemoryStats {
  int64_t sharded_state_bytes = 0;   // param + grad + m + v shards, padding included
  int64_t padding_elements = 0;      // per state vector, summed over units
  int64_t gather_buffer_bytes = 0;   // full-size parameter and gradient buffers, allocated once
  int64_t gathered_peak_bytes = 0;   // the most of those buffers in use at one time so far
};

// How often each unit was gathered and reduce-scattered since construction.
struct CommCounters {
  std::vector<int64_t> gathers, reduce_scatters;  // per unit
  int64_t gathered_elements = 0;                  // received, padding included
  int64_t reduce_scattered_elements = 0;          // sent
};

class ShardedModel {
 public:
  // Initialises this rank's parameter shards from cfg.train.seed (identical to one process's init).
  ShardedModel(const Config& cfg, Communicator& comm);

  const std::vector<UnitLayout>& units() const { return model_.units(); }
  UnitShard& shard(int unit) { return shards_[static_cast<size_t>(unit)]; }
  const UnitShard& shard(int unit) const { return shards_[static_cast<size_t>(unit)]; }
  Communicator& comm() { return comm_; }

  void zero_grads();

  // One training micro-step (forward, loss, backward, reduce-scatter) on this rank's micro-batch of
  // micro_batch x seq_len tokens. Gradients of the loss scaled by dloss per token accumulate into the
  // grad shards. Returns this rank's mean loss over its tokens. Collective.
  float micro_step(const int32_t* inputs, const int32_t* targets, float dloss);
  // Forward and loss only. Collective.
  float eval_micro(const int32_t* inputs, const int32_t* targets);
  // Logits over the real vocabulary at the last position of tokens[0, len) (B = 1). Collective.
  void last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits);

  // The unit's full flat parameter buffer (numel elements), on every rank. Collective.
  std::vector<float> gather_params(int unit);
  // Same for the gradient accumulators.
  std::vector<float> gather_grads(int unit);

  MemoryStats memory() const;
  const CommCounters& counters() const { return counters_; }

 private:
  enum class Mode { kTrain, kEval, kLogits };
  struct Slot {
    std::vector<float> data;
    int unit = -1;  // which unit's buffer it holds, -1 if free
  };
  float run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets, float dloss);
  std::vector<float> gather_full(int unit, std::vector<float> UnitShard::*state);
  Slot& param_slot(int unit) { return unit == 0 ? emb_param_ : unit_param_; }
  Slot& grad_slot(int unit) { return unit == 0 ? emb_grad_ : unit_grad_; }
  const float* gathered(int unit);
  float* full_grad(int unit);
  void occupy(Slot& s, int unit);
  void release(Slot& s, int unit);

  Config cfg_;
  Communicator& comm_;
  GptModel model_;
  std::vector<UnitShard> shards_;
  // Unit 0 (the tied embedding) is live at the same time as the head, so it has slots of its own.
  Slot emb_param_, unit_param_, emb_grad_, unit_grad_;
  std::vector<float> rs_scratch_;
  int64_t in_use_bytes_ = 0, peak_bytes_ = 0;
  CommCounters counters_;
  // The batch of the schedule being run.
  const int32_t* tokens_ = nullptr;
  int64_t batch_ = 0, len_ = 0;
  std::vector<float>* logits_out_ = nullptr;
};

}  // namespace st
