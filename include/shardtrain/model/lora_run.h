// What the CPU and the CUDA models share about running the blocks' adapters (CpuLora, CudaLora): the adapter list
// (every block has the same layout), the scale, the sizes of the buffers each keeps and where an adapter's h lies in
// them, and the dropout key of the running micro-batch. The models keep the buffers themselves, in their memory.
//
// The adapters of one weight (llama's q, k and v; gate and up) run as one stack (kernels/lora.h), which add_lora lays
// out for: one input read, one input gradient written. With dropout each adapter draws its own mask of the input, so
// a micro-batch that drops runs each adapter as a stack of its own.
//
//   LoraRun run(cfg, units, max_batch * cfg.seq_len, recompute ? 1 : cfg.n_layer);
//   h_.assign(run.h_elems(), 0);
//   for (const LoraRun::Stack& s : run.stacks()) if (s.weight == weight) ... h_.data() + run.h_offset(layer, s.first)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/lora.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/model/units.h"

namespace st {

class LoraRun {
 public:
  // Adapters first .. first + shape.slices.size() of adapters(), on one weight, with their A and B stacked at
  // a_offset and b_offset of the unit (and of its gradient buffer).
  struct Stack {
    std::string weight;
    size_t first = 0;
    LoraStack shape;
    int64_t a_offset = 0, b_offset = 0;
  };

  LoraRun() = default;
  // recompute.sets(n_layer) blocks keep their h at once (model/recompute.h: one a block, the recomputed blocks
  // sharing one), each for up to max_rows tokens.
  LoraRun(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, Recompute recompute);

  const std::vector<LoraAdapter>& adapters() const { return adapters_; }
  float scale() const { return scale_; }
  int rank() const { return static_cast<int>(rank_); }
  int64_t max_rows() const { return max_rows_; }
  // Whether `weight` (a block tensor's name) has adapters, and whether they write every column of its output of
  // `width` columns (an update that can write the output instead of adding to it).
  bool adapts(const std::string& weight) const;
  bool covers(const std::string& weight, int64_t width) const;
  // The stacks the running micro-batch runs, in adapter order: one per weight, or one per adapter while it drops.
  const std::vector<Stack>& stacks() const { return dropping_ ? singles_ : stacked_; }

  // The buffers a model keeps, in elements: h [slots][adapters][max_rows][rank] (a stack's h [max_rows][count *
  // rank] where its adapters' lie), dh [max_rows][rank x the most adapters a stack has], and with dropout the
  // dropped input and its gradient [max_rows][the widest adapter input] each (0 without). Their sum is
  // lora_activation_elems (model/lora.h), which the footprints count.
  int64_t h_elems() const { return slots_ * static_cast<int64_t>(adapters_.size()) * max_rows_ * rank_; }
  int64_t dh_elems() const { return max_rows_ * rank_ * widest_stack_; }
  int64_t dropout_elems() const { return dropout_elems_; }
  // Where `layer`'s adapter i (or the stack it starts) keeps its h in the h buffer.
  int64_t h_offset(int layer, size_t adapter) const;

  // The micro-batch the next calls run: its first sequence's global index and its active length (rows per
  // sequence), which key the dropout masks with `seed`; first_sequence < 0 runs without dropout (evaluation).
  void set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence);
  // Whether the running micro-batch drops (its stacks are single adapters, each with its own key).
  bool dropping() const { return dropping_; }
  // The dropout key of `layer`'s adapter i, or null without dropout for the running micro-batch.
  const LoraDropoutKey* dropout(int layer, size_t i);

 private:
  std::vector<LoraAdapter> adapters_;
  std::vector<int> linear_index_;  // each adapter's place in the family's lora_linears
  std::vector<Stack> stacked_, singles_;
  float scale_ = 0.0f;
  int64_t rank_ = 0, max_rows_ = 0, slots_ = 0, dropout_elems_ = 0, widest_stack_ = 0;
  Recompute recompute_;  // which slot a layer keeps its h in
  LoraDropoutKey key_;   // p, seed and batch; stream set per adapter
  bool dropping_ = false;
};

}  // namespace st
