// What every family's CUDA model (CudaGpt, CudaLlama) keeps besides its own activations, and the CudaUnitModel calls
// that need nothing else: the config and unit list, the context and attention choice, the active shape, the op
// timer, the token embedding's output and each block's output (the next block's input), the two ends (CudaLmIo:
// uploads, the chunked classifier, the loss accumulator) and the blocks' LoRA adapters (CudaLora).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/model/cuda_linear.h"
#include "shardtrain/model/cuda_lm_io.h"
#include "shardtrain/model/cuda_lora.h"
#include "shardtrain/model/cuda_unit_model.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaModelBase : public CudaUnitModel<T> {
 public:
  const std::vector<UnitLayout>& units() const override { return units_; }
  double take_loss_sum() override;
  void move_loss_sum(double* dst) override;
  OpTimer& timer() override { return timer_; }
  // head_pass with backward, or (head_grads null without LoRA) without.
  void head_forward_backward(const T* head_params, const T* emb_params, const int32_t* targets, float dloss,
                             T* head_grads, T* emb_grads) override;
  void head_forward(const T* head_params, const T* emb_params, const int32_t* targets) override;
  int64_t fp8_workspace_bytes() const override { return linear_.allocated_bytes(); }
  CudaFp8History* fp8_history() override { return linear_.history(); }
  void set_dropout_batch(uint64_t seed, int64_t first_sequence) override {
    dropout_seed_ = seed;
    first_sequence_ = first_sequence;
  }

 protected:
  // Checks that ctx holds scratch_bytes of kernel scratch (and a cuDNN handle with cudnn_attention), and allocates
  // the ends, the block outputs, the adapters and the linear layers' FP8 scales (fp8: train.fp8's policy; off: none)
  // for micro-batches of up to max_batch x cfg.seq_len tokens; with FP8 the scratch must also hold the codes.
  CudaModelBase(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
                const gpu::GpuContext& ctx, gpu::CudnnBackwardMode attention_backward, int64_t scratch_bytes,
                const Fp8Policy& fp8);

  // Checks [B, t] against [max_batch, seq_len], makes it the active shape and uploads the tokens (host [B, t]);
  // returns them on the device.
  const int32_t* start_batch(const int32_t* tokens, int64_t B, int64_t t);
  // Passes at the full shape (every training micro-step) run cuDNN's fused attention when the model was made for it;
  // others (sampling, short evaluations) flash attention. Both compute the same function.
  bool cudnn_shape() const { return cudnn_attention_ && B_ == max_batch_ && T_ == cfg_.seq_len; }
  // Which set of block activations layer `layer` uses: its own, or where it recomputes the one shared set.
  size_t acts_index(int layer) const { return static_cast<size_t>(recompute_.set_of(layer)); }
  // The family's head: final norm, classifier and loss, and with `backward` the start of backward
  // (head_forward_backward's gradients).
  virtual void head_pass(const T* head_params, const T* emb_params, const int32_t* targets, float dloss, T* head_grads,
                         T* emb_grads, bool backward) = 0;
  // Block `layer`'s input: the embedding's output or the previous block's; final_output() is the head's input.
  const T* block_input(int layer) const {
    return layer == 0 ? encoded_.data() : block_out_[static_cast<size_t>(layer - 1)].data();
  }
  const T* final_output() const { return block_input(cfg_.n_layer); }
  // An adapted base GEMM's forward, out[N, OC] = inp @ w^T + bias (linear_: in FP8 where the policy says), as
  // CudaLora::forward's base(onto) runs it: with onto, added to what out holds (the adapters' update). x_t_codes:
  // CudaLinear::forward's.
  void base_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int C, int OC, bool onto,
                    OpTimer::Laps* lap, LinearSite site, uint8_t* x_t_codes = nullptr);
  // Under train.fp8 a block may keep a linear layer's x^T codes (CudaLinear::forward's x_t_codes) in place of its
  // input x, where only the layer's weight gradient reads x in the backward (fp8_input_codes): the input then passes
  // through a backward buffer that is idle in the forward. input(): where the forward writes x, the block's own
  // buffer, or `idle` where the block keeps none. codes(): the block's codes, or null where it keeps x.
  static T* input(DeviceBuffer<T>& own, DeviceBuffer<T>& idle) { return own.size() > 0 ? own.data() : idle.data(); }
  static uint8_t* codes(DeviceBuffer<uint8_t>& c) { return c.size() > 0 ? c.data() : nullptr; }
  // A block's buffer for such an input of n elements: the input itself (own) or, where coded, its codes.
  static void allocate_input(bool coded, int64_t n, DeviceBuffer<T>* own, DeviceBuffer<uint8_t>* codes) {
    if (coded)
      *codes = DeviceBuffer<uint8_t>(n);
    else
      *own = DeviceBuffer<T>(n);
  }
  // Where block `layer`'s forward writes the codes: codes(c), unless its activations serve no backward (in a block
  // that recomputes, only the forward that block_backward runs again writes them).
  uint8_t* codes_to_keep(int layer, DeviceBuffer<uint8_t>& c) const {
    return !recompute_.of(layer) || recomputing_ ? codes(c) : nullptr;
  }
  // Whether the running forward may leave out the output of linear layer `weight`: with recompute, the re-run of a
  // block's last layer, whose output is the next block's saved input, when no adapter of it keeps an activation of
  // its own (CudaLinear::forward_without_output then does the rest).
  bool output_unread(const char* weight) const { return recomputing_ && !lora_.adapts(weight); }
  // block_backward's first act with recompute: the block's forward again, from its saved input.
  void recompute_forward(int layer, const T* block_params) {
    struct Flag {  // cleared however block_forward ends
      bool& on;
      explicit Flag(bool& f) : on(f) { on = true; }
      ~Flag() { on = false; }
    } flag(recomputing_);
    this->block_forward(layer, block_params);
  }

  ModelConfig cfg_;
  std::vector<UnitLayout> units_;
  int64_t max_batch_;
  Recompute recompute_;
  bool recomputing_ = false;  // recompute_forward is running
  bool cudnn_attention_;
  gpu::CudnnBackwardMode attention_backward_;
  gpu::GpuContext ctx_;
  OpTimer timer_;
  int64_t B_ = 0, T_ = 0;
  CudaLmIo<T> io_;                          // tokens and targets, the chunked classifier, the loss accumulator
  DeviceBuffer<T> encoded_;                 // [B, T, C]: the token embedding's output
  std::vector<DeviceBuffer<T>> block_out_;  // [B, T, C] per block
  uint64_t dropout_seed_ = 0;
  int64_t first_sequence_ = -1;  // set_dropout_batch
  CudaLora<T> lora_;             // the blocks' adapters, h in acts_index's slots (nothing without LoRA)
  CudaLinear<T> linear_;         // the blocks' linear layers' GEMMs (train.fp8)
};

}  // namespace st
