#include "shardtrain/shard/sharded_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/kernels/fp8.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/fp8_history.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/plan_search.h"
#include "shardtrain/shard/run_plan.h"

namespace st {
namespace {

int64_t bytes_of(const std::vector<float>& v) { return static_cast<int64_t>(v.size() * sizeof(float)); }

// Checks the host memory plan (shard/memory_plan.h) before the model's activations and the shards are
// allocated, so a config that cannot fit is refused at once with its breakdown (kBadInput) rather than ending
// in std::bad_alloc after minutes of allocating and initialising. The budget is split between the ranks of this
// host. A refusal names the smallest change that fits, as `shardtrain plan` finds it for this run. Returns the model
// config for the model's constructor, which runs next.
const ModelConfig& planned_model(const Config& cfg, const ShardingGroups& groups, Communicator& comm) {
  const int world = groups.shard().world_size();
  const int64_t bucket_elements = groups.replica ? replica_bucket_elements(cfg, world, sizeof(float)) : 0;
  const RunTarget run = run_target(cfg, comm);
  check_host_memory_plan(cfg, world, bucket_elements, run.host, [&] { return misfit_advice(cfg, run); });
  return cfg.model;
}

// Quantises the NF4 unit's whole frozen segment, held in sh->frozen, into this rank's words of its storage, and frees
// the segment.
void store_nf4(const UnitLayout& u, const Nf4UnitStorage& storage, UnitShard* sh) {
  std::vector<float> words(static_cast<size_t>(storage.words));
  nf4_quantize_unit(u, storage, sh->frozen.data(), storage_bytes(words));
  sh->nf4_words.assign(static_cast<size_t>(sh->nf4_slot), 0.0f);
  std::copy_n(words.begin() + sh->nf4_span.offset, sh->nf4_span.count, sh->nf4_words.begin());
  std::vector<float>().swap(sh->frozen);
}

}  // namespace

ShardedModel::ShardedModel(const Config& cfg, Communicator& comm)
    : cfg_(cfg),
      comm_(comm),
      groups_(make_sharding_groups(cfg, comm)),
      model_(model_family(cfg.model.arch)
                 .make_cpu_model(planned_model(cfg, groups_, comm), cfg.train.micro_batch, recompute_of(cfg.train))) {
  Fp8Policy fp8 = fp8_policy(cfg.train.fp8, cfg.train.fp8_amax_history);
  fp8.weights_cast = cfg.dist.fp8_gather;
  model_->set_fp8(fp8);
  if (cfg.optim.offload != OffloadMode::kNone) {
    HostAdamW::Options o;
    o.threads = static_cast<int>(cfg.optim.offload_threads);
    o.local_rank = comm.device_rank();  // the machine's CPUs, also under SHARDTRAIN_NODE_ID stand-ins
    o.local_size = comm.device_ranks();
    offload_ = std::make_unique<HostAdamW>(o);
  }
  const int world = groups_.shard().world_size(), rank = groups_.shard().rank();
  int64_t max_unit_grad = 0, max_slot = 0, nf4_full = 0;
  for (const UnitLayout& u : model_->units()) {
    UnitShard s;
    s.span = shard_span(u.numel, rank, world);
    s.slot = padded_shard_size(u.numel, world);
    s.param.assign(s.slot, 0.0f);
    s.grad.assign(s.slot, 0.0f);
    s.m.assign(s.slot, 0.0f);
    s.v.assign(s.slot, 0.0f);
    init_unit_range(u, cfg.model, cfg.train.seed, s.span.offset, s.span.end(), s.param.data());
    if (u.nf4_base) {
      // Every rank draws the whole frozen segment, as one process would, and keeps its words of the storage.
      nf4_storage_.push_back(nf4_unit_storage(u));
      s.frozen_span = ShardSpan{0, u.frozen_numel};
      s.nf4_span = shard_span(nf4_storage_.back().words, rank, world);
      s.nf4_slot = padded_shard_size(nf4_storage_.back().words, world);
      s.frozen.assign(static_cast<size_t>(u.frozen_numel), 0.0f);
      init_unit_range(u, cfg.model, cfg.train.seed, 0, u.frozen_numel, s.frozen.data(), Segment::kFrozen);
      store_nf4(u, nf4_storage_.back(), &s);
      if (world > 1) nf4_full = std::max(nf4_full, s.nf4_slot * world);
    } else {
      nf4_storage_.emplace_back();
      s.frozen_span = shard_span(u.frozen_numel, rank, world);
      s.frozen_slot = padded_shard_size(u.frozen_numel, world);
      s.frozen.assign(s.frozen_slot, 0.0f);
      init_unit_range(u, cfg.model, cfg.train.seed, s.frozen_span.offset, s.frozen_span.end(), s.frozen.data(),
                      Segment::kFrozen);
    }
    if (u.index != 0) max_unit_grad = std::max(max_unit_grad, s.slot * world);
    max_slot = std::max(max_slot, s.slot);
    shards_.push_back(std::move(s));
  }
  // Units that read their shards in place (units_in_place: one rank) leave the parameter slots' sizes. Here the host
  // AdamW (optim.offload) updates the shards themselves, and settles before a schedule runs.
  Config plain = cfg;
  plain.optim.offload = OffloadMode::kNone;
  in_place_ = units_in_place(plain, model_->units(), world);
  const UnitSizes sizes = unit_sizes(model_->units(), world, in_place_);
  emb_param_.data.assign(sizes.emb_full, 0.0f);
  emb_grad_.data.assign(shards_[0].slot * world, 0.0f);
  unit_params_.resize(cfg.dist.reshard_after_forward ? 1 : static_cast<size_t>(cfg.model.n_layer + 1));
  for (Slot& s : unit_params_) s.data.assign(sizes.unit_full, 0.0f);
  unit_grad_.data.assign(max_unit_grad, 0.0f);
  rs_scratch_.assign(world > 1 ? max_slot : 0, 0.0f);  // at one rank the shard adds the full gradient as it lies
  nf4_full_.assign(static_cast<size_t>(nf4_full), 0.0f);
  if (groups_.replica) {
    tuning_ = resolve_comm_tuning(cfg.dist, LinkKind::kNetwork, /*hybrid=*/true);
    std::vector<int64_t> slots;
    for (const UnitShard& s : shards_) slots.push_back(s.slot);
    buckets_ =
        std::make_unique<ReplicaBuckets>(std::move(slots), tuning_.bucket_bytes / static_cast<int64_t>(sizeof(float)));
    bucket_.assign(static_cast<size_t>(buckets_->capacity()), 0.0f);
  }
  counters_.gathers.assign(shards_.size(), 0);
  counters_.reduce_scatters.assign(shards_.size(), 0);
  if (cfg.dist.fp8_gather) {
    int64_t block = 0, received = 0;
    for (const UnitLayout& u : model_->units()) {
      fp8_segments_.push_back(
          {fp8_gather_segment(cfg.model, u, false, world, fp8), fp8_gather_segment(cfg.model, u, true, world, fp8)});
      for (const Fp8GatherSegment& g : fp8_segments_.back()) {
        block = std::max(block, g.block_bytes(sizeof(float)));
        received = std::max(received, g.world * g.block_bytes(sizeof(float)));
      }
    }
    fp8_send_.assign(static_cast<size_t>(block / 4), 0.0f);
    fp8_recv_.assign(static_cast<size_t>(received / 4), 0.0f);
    if (cfg.dist.fp8_gather_keep) fp8_kept_.resize(fp8_segments_.size());  // each filled by its first gather
  }
}

void ShardedModel::zero_grads() {
  settle();
  ++params_epoch_;  // a new step: the optimizer and the history's push came before it
  summed_across_nodes_ = false;
  if (buckets_) buckets_->drop();  // a step cut short (an exception in its backward) left units in a bucket
  for (UnitShard& s : shards_) std::fill(s.grad.begin(), s.grad.end(), 0.0f);
}

void ShardedModel::occupy(Slot& s, int unit) {
  ST_CHECK(s.unit == -1, "buffer for unit ", unit, " still holds unit ", s.unit, ": the schedule is inconsistent");
  s.unit = unit;
  in_use_bytes_ += bytes_of(s.data);
  peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
}

void ShardedModel::release(Slot& s, int unit) {
  ST_CHECK(s.unit == unit, "release of unit ", unit, " whose buffer holds unit ", s.unit);
  s.unit = -1;
  in_use_bytes_ -= bytes_of(s.data);
}

const float* ShardedModel::gathered(int unit) {
  Slot& s = param_slot(unit);
  ST_CHECK(s.unit == unit, "unit ", unit, " used without being gathered");
  return in_place_[static_cast<size_t>(unit)] ? shards_[static_cast<size_t>(unit)].param.data() : s.data.data();
}

float* ShardedModel::full_grad(int unit) {
  Slot& s = grad_slot(unit);
  if (s.unit != unit) {  // first use in this micro-step: a zeroed buffer, since the kernels accumulate
    occupy(s, unit);
    std::fill(s.data.begin(), s.data.begin() + shards_[static_cast<size_t>(unit)].slot * groups_.shard().world_size(),
              0.0f);
  }
  return s.data.data();
}

double ShardedModel::run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets, float dloss) {
  settle();
  mode_ = mode;
  targets_ = targets;
  dloss_ = dloss;
  loss_ = 0.0;
  run_schedule(schedule, *this);
  ST_CHECK(in_use_bytes_ == 0, "the schedule left ", in_use_bytes_, " bytes of buffers in use (n_layer ",
           cfg_.model.n_layer, ")");
  return loss_;
}

void ShardedModel::gather(int unit, size_t /*at*/) {
  UnitShard& sh = shards_[static_cast<size_t>(unit)];
  const UnitLayout& u = model_->units()[static_cast<size_t>(unit)];
  Communicator& shard = groups_.shard();
  Slot& s = param_slot(unit);
  occupy(s, unit);
  const auto t0 = std::chrono::steady_clock::now();
  // The trainable slots, then the frozen ones from element numel on: they overwrite the trainable slots' padding.
  const Fp8GatherSegment* fp8 = fp8_segments_.empty() ? nullptr : fp8_segments_[static_cast<size_t>(unit)].data();
  int64_t received = 0;
  if (in_place_[static_cast<size_t>(unit)]) {  // the unit reads its shard; counted as the gather it replaces
    received += sh.slot * 4;
  } else if (fp8 != nullptr && !fp8[0].empty()) {
    received += gather_fp8(unit, 0, sh.param.data(), s.data.data());
  } else if (sh.slot > 0) {
    shard.all_gather(sh.param.data(), sh.slot, s.data.data());
    received += sh.slot * shard.world_size() * 4;
  }
  if (fp8 != nullptr && !fp8[1].empty()) {
    received += gather_fp8(unit, 1, sh.frozen.data(), s.data.data());
  } else if (sh.frozen_slot > 0) {
    shard.all_gather(sh.frozen.data(), sh.frozen_slot, s.data.data() + u.numel);
    received += sh.frozen_slot * shard.world_size() * 4;
  }
  comm_ms_ += seconds_since(t0) * 1e3;
  if (sh.nf4_slot > 0) gather_nf4(unit, s.data.data() + u.numel);
  if (shard.world_size() > 1) received += sh.nf4_slot * shard.world_size() * 4;  // gather_nf4's
  ++counters_.gathers[static_cast<size_t>(unit)];
  counters_.gathered_elements += (sh.slot + sh.frozen_slot + sh.nf4_slot) * shard.world_size();
  counters_.gathered_bytes += received;
  counters_.cross_node_bytes += groups_.shard_cross_bytes(received / shard.world_size(), 1);  // what each rank sends
}

int64_t ShardedModel::gather_fp8(int unit, int segment, const float* shard, float* full) {
  const Fp8GatherSegment& g = fp8_segments_[static_cast<size_t>(unit)][static_cast<size_t>(segment)];
  const std::string what = model_->units()[static_cast<size_t>(unit)].name + " (dist.fp8_gather)";
  Communicator& comm = groups_.shard();
  const int rank = comm.rank();
  const int64_t k = static_cast<int64_t>(g.weights.size()), first = int64_t{rank} * g.slot;
  const int64_t block = g.block_bytes(sizeof(float));
  const Fp8Format f = g.format;
  const bool pow2 = g.power_of_2;
  // dist.fp8_gather_keep: a training gather sends the block kept since the shard last changed, where there is one.
  KeptFp8* kept = fp8_kept_.empty() || mode_ != Mode::kTrain
                      ? nullptr
                      : &fp8_kept_[static_cast<size_t>(unit)][static_cast<size_t>(segment)];
  const bool hit = kept != nullptr && kept->epoch == params_epoch_;
  // What this rank sends: its kept block, cast into by the epoch's first gather, or the shared staging.
  std::vector<float>& send = kept != nullptr ? kept->block : fp8_send_;
  std::vector<float> inverse(static_cast<size_t>(k));
  if (hit) {
    inverse = kept->inverse;
  } else {
    const std::vector<Fp8GatherPiece> mine = g.pieces_of(rank);
    // 1. The maxima of this rank's parts of the weights, all-gathered; each weight's is the largest.
    std::vector<unsigned> part_max(static_cast<size_t>(k), 0u), all(static_cast<size_t>(k * g.world), 0u);
    for (const Fp8GatherPiece& p : mine)
      if (p.weight >= 0)
        fp8_maxima(shard + (p.offset - first), 1, p.count, Fp8Scaling::kTensor,
                   &part_max[static_cast<size_t>(p.weight)], what);
    static_assert(sizeof(unsigned) == sizeof(float));
    comm.all_gather(reinterpret_cast<const float*>(part_max.data()), k, reinterpret_cast<float*>(all.data()));
    std::vector<unsigned> maxima(static_cast<size_t>(k));
    fp8_scales_of_parts(all.data(), g.world, k, f, pow2, maxima.data(), inverse.data());
    // Delayed, in a training pass: each weight scales by the history's pick, and its maximum is recorded, as the
    // linear layers' cast of the gathered weight does (cpu_linear.cc).
    Fp8AmaxHistory* history = mode_ == Mode::kTrain ? model_->fp8_history() : nullptr;
    if (history != nullptr) {
      std::vector<unsigned> picked(static_cast<size_t>(k));
      for (int64_t w = 0; w < k; ++w)
        picked[static_cast<size_t>(w)] = history->pick(fp8_history_index(g.weights[static_cast<size_t>(w)].site, kFp8W),
                                                       maxima[static_cast<size_t>(w)], true);
      fp8_scales_of_parts(picked.data(), 1, k, f, pow2, maxima.data(), inverse.data());
    }
    // 2. This rank's codes and its rest, packed into its block.
    send.resize(std::max(send.size(), static_cast<size_t>(block / 4)));
    auto* codes = reinterpret_cast<uint8_t*>(send.data());
    float* rest = send.data() + g.code_stride / 4;
    std::fill(send.begin(), send.begin() + block / 4, 0.0f);
    for (const Fp8GatherPiece& p : mine) {
      const float* x = shard + (p.offset - first);
      if (p.weight < 0) {
        std::copy_n(x, p.count, rest + p.staged_at);
        continue;
      }
      float unused = 0.0f;
      fp8_quantize_with_maxima(x, 1, p.count, f, Fp8Scaling::kTensor, pow2, Fp8Layout::kRowMajor,
                               &maxima[static_cast<size_t>(p.weight)], codes + p.staged_at, &unused);
    }
    if (kept != nullptr) {
      kept->inverse = inverse;
      kept->epoch = params_epoch_;
    }
  }
  // Every rank's block all-gathered.
  comm.all_gather(send.data(), block / 4, fp8_recv_.data());
  // 3. Every rank's pieces into place: the weights as their codes decode (what fp8_round_trip gives the whole
  // tensor), the rest as sent.
  const auto* staged = reinterpret_cast<const uint8_t*>(fp8_recv_.data());
  for (const Fp8GatherPiece& p : g.pieces) {
    const uint8_t* from = staged + p.rank * block;
    float* to = full + g.base + p.offset;
    if (p.weight < 0) {
      std::copy_n(reinterpret_cast<const float*>(from + g.code_stride) + p.staged_at, p.count, to);
      continue;
    }
    const float inv = inverse[static_cast<size_t>(p.weight)];
    for (int64_t i = 0; i < p.count; ++i) to[i] = fp8_decode(from[p.staged_at + i], f) * inv;
  }
  return hit ? g.kept_received_bytes(sizeof(float)) : g.received_bytes(sizeof(float));
}

void ShardedModel::gather_nf4(int unit, float* segment) {
  const UnitShard& sh = shards_[static_cast<size_t>(unit)];
  const float* words = sh.nf4_words.data();  // one rank holds the whole storage
  if (groups_.shard().world_size() > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    groups_.shard().all_gather(sh.nf4_words.data(), sh.nf4_slot, nf4_full_.data());
    comm_ms_ += seconds_since(t0) * 1e3;
    words = nf4_full_.data();
  }
  nf4_dequantize_unit(model_->units()[static_cast<size_t>(unit)], nf4_storage_[static_cast<size_t>(unit)],
                      reinterpret_cast<const uint8_t*>(words), segment);
}

void ShardedModel::embedding_forward() { model_->embedding_forward(gathered(0), tokens_, batch_, len_); }

void ShardedModel::block_forward(int unit) { model_->block_forward(unit - 1, gathered(unit)); }

void ShardedModel::head(int unit) {
  if (mode_ == Mode::kLogits) {
    model_->head_logits(gathered(unit), gathered(0), len_ - 1, logits_out_);
  } else if (mode_ == Mode::kEval) {
    loss_ = model_->head_forward(gathered(unit), gathered(0), targets_);
  } else {
    float* head_grad = full_grad(unit);
    float* emb_grad = full_grad(0);
    loss_ = model_->head_forward_backward(gathered(unit), gathered(0), targets_, dloss_, head_grad, emb_grad);
  }
}

void ShardedModel::block_backward(int unit) { model_->block_backward(unit - 1, gathered(unit), full_grad(unit)); }

void ShardedModel::embedding_backward() { model_->embedding_backward(full_grad(0)); }

void ShardedModel::reduce_scatter(int unit) {
  UnitShard& sh = shards_[static_cast<size_t>(unit)];
  Communicator& shard = groups_.shard();
  Slot& g = grad_slot(unit);
  ST_CHECK(g.unit == unit, "reduce-scatter of unit ", unit, " without a gradient");
  if (sh.slot == 0) {  // wholly frozen: no gradient to reduce
    if (buckets_ && last_micro_) finish_grad(unit);
    release(g, unit);
    return;
  }
  const float* part = g.data.data();  // at one rank the full gradient is the shard's
  if (shard.world_size() > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    shard.reduce_scatter(g.data.data(), sh.slot, rs_scratch_.data());
    comm_ms_ += seconds_since(t0) * 1e3;
    part = rs_scratch_.data();
  }
  for (int64_t i = 0; i < sh.span.count; ++i) sh.grad[static_cast<size_t>(i)] += part[i];
  if (buckets_ && last_micro_) finish_grad(unit);
  release(g, unit);
  ++counters_.reduce_scatters[static_cast<size_t>(unit)];
  counters_.reduce_scattered_elements += sh.slot * shard.world_size();
  counters_.cross_node_bytes += groups_.shard_cross_bytes(sh.slot, sizeof(float));
}

void ShardedModel::release(int unit) { release(param_slot(unit), unit); }

// Hybrid sums each gradient shard across nodes once per optimizer step, after the last micro-step has accumulated
// into it: gradient accumulation does not multiply the traffic between nodes.
void ShardedModel::finish_grad(int unit) {
  for (const ReplicaBuckets::Bucket& b : buckets_->add(unit)) {
    for (size_t i = 0; i < b.units.size(); ++i) {
      const UnitShard& sh = shards_[static_cast<size_t>(b.units[i])];
      std::copy(sh.grad.begin(), sh.grad.begin() + sh.slot, bucket_.begin() + b.offsets[i]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    groups_.replica->all_reduce(bucket_.data(), b.elements);
    comm_ms_ += seconds_since(t0) * 1e3;
    for (size_t i = 0; i < b.units.size(); ++i) {
      UnitShard& sh = shards_[static_cast<size_t>(b.units[i])];
      std::copy(bucket_.begin() + b.offsets[i], bucket_.begin() + b.offsets[i] + sh.slot, sh.grad.begin());
    }
    counters_.replica_reduced_elements += b.elements;
    counters_.cross_node_bytes += groups_.replica_cross_bytes(b.elements, sizeof(float));
  }
  summed_across_nodes_ = buckets_->joined_units() == 0;  // the step's last unit went out
}

double ShardedModel::micro_step(const int32_t* inputs, const int32_t* targets, float dloss) {
  ST_CHECK(!summed_across_nodes_,
           "micro_step after this step's gradients were summed across nodes: call zero_grads() "
           "and expect_micro_steps() first");
  last_micro_ = --micro_steps_left_ <= 0;
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  model_->set_dropout_batch(cfg_.train.seed, first_sequence_);
  model_->set_fp8_recording(true);
  first_sequence_ = -1;
  return run(training_schedule(cfg_.model.n_layer, cfg_.dist.reshard_after_forward), Mode::kTrain, targets, dloss);
}

double ShardedModel::eval_micro(const int32_t* inputs, const int32_t* targets) {
  model_->set_dropout_batch(cfg_.train.seed, -1);
  model_->set_fp8_recording(false);
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  return run(eval_schedule(cfg_.model.n_layer), Mode::kEval, targets, 0.0f);
}

void ShardedModel::last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) {
  model_->set_dropout_batch(cfg_.train.seed, -1);
  model_->set_fp8_recording(false);
  tokens_ = tokens;
  batch_ = 1;
  len_ = len;
  logits_out_ = logits;
  run(eval_schedule(cfg_.model.n_layer), Mode::kLogits, nullptr, 0.0f);
  logits_out_ = nullptr;
}

std::vector<float> ShardedModel::gather_full(int unit, std::vector<float> UnitShard::*state, int64_t UnitShard::*slot,
                                             int64_t numel) {
  settle();
  const UnitShard& sh = shards_[static_cast<size_t>(unit)];
  std::vector<float> full(static_cast<size_t>(sh.*slot * groups_.shard().world_size()));
  if (sh.*slot > 0) groups_.shard().all_gather((sh.*state).data(), sh.*slot, full.data());
  full.resize(static_cast<size_t>(numel));
  return full;
}

double ShardedModel::grad_sum_of_squares() {
  settle();
  double s = 0.0;
  for (const UnitShard& sh : shards_) s += sum_of_squares(sh.grad.data(), sh.span.count);  // bit-reproducible
  return s;
}

std::vector<std::vector<float>> ShardedModel::fp8_history() {
  const Fp8AmaxHistory* h = model_->fp8_history();
  return h == nullptr ? std::vector<std::vector<float>>{} : h->entries();
}

void ShardedModel::load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) {
  ++params_epoch_;
  Fp8AmaxHistory* h = model_->fp8_history();
  if (h == nullptr) return;
  check_fp8_history_entries(entries, h->sites(), from);
  h->load(entries);
}

std::string ShardedModel::describe() const {
  return str_cat(
      "cpu/fp32", offload_ ? str_cat(", optimizer on host AdamW threads (", offload_->describe(), ")") : std::string(),
      "; sharding ", groups_.why,
      buckets_ ? str_cat("; all-reduce across nodes once per step in buckets of ",
                         tuning_.bucket_bytes == 0 ? std::string("one unit") : str_cat(tuning_.bucket_bytes, " bytes"))
               : std::string(),
      fp8_segments_.empty() ? "" : "; the blocks' FP8 weights gathered as E4M3 codes (dist.fp8_gather)");
}

void ShardedModel::adamw(int unit, const std::vector<AdamWRun>& runs) {
  ++params_epoch_;
  UnitShard& sh = shards_[static_cast<size_t>(unit)];
  for (const AdamWRun& r : runs) {
    ST_CHECK(r.offset >= 0 && r.offset + r.count <= sh.span.count, "AdamW run [", r.offset, ", +", r.count,
             ") outside unit ", unit, "'s span of ", sh.span.count);
  }
  if (offload_) {  // queued; settle() waits before the shards are read
    HostAdamW::Job job;
    job.param = sh.param.data();
    job.m = sh.m.data();
    job.v = sh.v.data();
    job.grad = sh.grad.data();
    job.runs = runs;
    offload_->submit(std::move(job));
    return;
  }
  adamw_update_runs(sh.param.data(), sh.m.data(), sh.v.data(), sh.grad.data(), runs);
}

std::vector<float> ShardedModel::gather_params(int unit) {
  return gather_full(unit, &UnitShard::param, &UnitShard::slot, model_->units()[static_cast<size_t>(unit)].numel);
}

std::vector<float> ShardedModel::gather_grads(int unit) {
  return gather_full(unit, &UnitShard::grad, &UnitShard::slot, model_->units()[static_cast<size_t>(unit)].numel);
}

std::vector<float> ShardedModel::gather_frozen(int unit) {
  const UnitLayout& u = model_->units()[static_cast<size_t>(unit)];
  if (!u.nf4_base) return gather_full(unit, &UnitShard::frozen, &UnitShard::frozen_slot, u.frozen_numel);
  settle();
  std::vector<float> segment(static_cast<size_t>(u.frozen_numel));
  gather_nf4(unit, segment.data());
  return segment;
}

void ShardedModel::pull_unit(int unit) {
  settle();
  ++params_epoch_;  // a load may write the shard
  const UnitLayout& u = model_->units()[static_cast<size_t>(unit)];
  if (u.nf4_base)
    shards_[static_cast<size_t>(unit)].frozen.assign(static_cast<size_t>(u.frozen_numel), unwritten_frozen());
}

void ShardedModel::push_unit(int unit) {
  ++params_epoch_;
  const UnitLayout& u = model_->units()[static_cast<size_t>(unit)];
  UnitShard& sh = shards_[static_cast<size_t>(unit)];
  if (!u.nf4_base || sh.frozen.empty()) return;
  if (nf4_view_written(u, sh.frozen.data())) {
    store_nf4(u, nf4_storage_[static_cast<size_t>(unit)], &sh);
  } else {
    std::vector<float>().swap(sh.frozen);
  }
}

void ShardedModel::release_unit(int unit) {
  if (model_->units()[static_cast<size_t>(unit)].nf4_base)
    std::vector<float>().swap(shards_[static_cast<size_t>(unit)].frozen);
}

MemoryStats ShardedModel::memory() const {
  MemoryStats m;
  for (const UnitShard& s : shards_) {
    m.sharded_state_bytes += bytes_of(s.param) + bytes_of(s.grad) + bytes_of(s.m) + bytes_of(s.v) + bytes_of(s.frozen) +
                             bytes_of(s.nf4_words);
    m.padding_elements += s.slot - s.span.count;
  }
  for (const Slot& s : unit_params_) m.gather_buffer_bytes += bytes_of(s.data);
  m.gather_buffer_bytes += bytes_of(emb_param_.data) + bytes_of(emb_grad_.data) + bytes_of(unit_grad_.data) +
                           bytes_of(rs_scratch_) + bytes_of(bucket_) + bytes_of(nf4_full_) + bytes_of(fp8_send_) +
                           bytes_of(fp8_recv_);
  m.gathered_peak_bytes = peak_bytes_;
  return m;
}

int64_t ShardedModel::peak_memory_bytes() { return process_peak_rss_bytes(); }

}  // namespace st
