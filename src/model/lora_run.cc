#include "shardtrain/model/lora_run.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

LoraRun::LoraRun(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, Recompute recompute)
    : adapters_(block_lora_adapters(units, cfg)),
      max_rows_(max_rows),
      slots_(recompute.sets(cfg.n_layer)),
      recompute_(recompute) {
  if (adapters_.empty()) return;
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  linear_index_ = lora_linear_indices(adapters_, cfg);
  key_.p = cfg.lora.dropout;
  key_.seq_stride = cfg.seq_len;
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    const Stack one{
        a.linear.weight, i,
        LoraStack{static_cast<int>(a.linear.in), static_cast<int>(rank_), {LoraSlice{a.linear.row0, a.linear.rows}}},
        a.a_offset, a.b_offset};
    singles_.push_back(one);
    if (i == 0 || stacked_.back().weight != a.linear.weight) {
      stacked_.push_back(one);
      continue;
    }
    // add_lora stacks the A and B matrices of one weight's adapters: the next ones follow the stack's last.
    Stack& s = stacked_.back();
    ST_ENFORCE_EQ(a.a_offset, s.a_offset + int64_t{s.shape.width()} * s.shape.in);
    ST_ENFORCE_EQ(a.b_offset, s.b_offset + s.shape.b_rows() * rank_);
    s.shape.slices.push_back(one.shape.slices[0]);
  }
  for (const Stack& s : stacked_) widest_stack_ = std::max<int64_t>(widest_stack_, s.shape.slices.size());
  dropout_elems_ = key_.p > 0 ? max_rows * widest_lora_input(adapters_) : 0;
  ST_ENFORCE_EQ(h_elems() + dh_elems() + 2 * dropout_elems_, lora_activation_elems(cfg, max_rows, slots_));
}

bool LoraRun::adapts(const std::string& weight) const {
  for (const LoraAdapter& a : adapters_)
    if (a.linear.weight == weight) return true;
  return false;
}

bool LoraRun::covers(const std::string& weight, int64_t width) const {
  int64_t rows = 0;
  for (const LoraAdapter& a : adapters_)
    if (a.linear.weight == weight) rows += a.linear.rows;
  return rows == width;  // the adapters' slices of one output are disjoint
}

int64_t LoraRun::h_offset(int layer, size_t adapter) const {
  const int64_t slot = recompute_.set_of(layer);
  ST_CHECK(slot >= 0 && slot < slots_, "LoRA slot ", slot, " of ", slots_);
  return (slot * static_cast<int64_t>(adapters_.size()) + static_cast<int64_t>(adapter)) * max_rows_ * rank_;
}

void LoraRun::set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
  dropping_ = key_.p > 0 && first_sequence >= 0;
  key_.seed = seed;
  key_.first_sequence = first_sequence;
  key_.rows_per_sequence = rows_per_sequence;
}

const LoraDropoutKey* LoraRun::dropout(int layer, size_t i) {
  if (!dropping_) return nullptr;
  key_.stream = lora_dropout_stream(layer, linear_index_[i]);
  return &key_;
}

}  // namespace st
