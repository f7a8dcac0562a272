#include "shardtrain/model/cuda_model_base.h"

#include <algorithm>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"

namespace st {

template <typename T>
CudaModelBase<T>::CudaModelBase(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
                                const gpu::GpuContext& ctx, gpu::CudnnBackwardMode attention_backward,
                                int64_t scratch_bytes, const Fp8Policy& fp8)
    : cfg_(cfg),
      units_(build_units(cfg)),
      max_batch_(max_batch),
      recompute_(recompute),
      cudnn_attention_(cudnn_attention),
      attention_backward_(attention_backward),
      ctx_(ctx),
      timer_(env_get("SHARDTRAIN_PROFILE_OPS") == "1") {
  ST_CHECK(max_batch > 0);
  ST_CHECK(ctx.scratch_bytes >= static_cast<size_t>(scratch_bytes), "GPU model needs ", scratch_bytes,
           " bytes of kernel scratch, the context has ", ctx.scratch_bytes);
  ST_CHECK(!cudnn_attention || ctx.cudnn != nullptr, "cuDNN attention without a cuDNN handle in the context");
  const int64_t BTC = max_batch * cfg.seq_len * cfg.n_embd;
  io_ = CudaLmIo<T>(cfg, max_batch, ctx_.stream);
  encoded_ = DeviceBuffer<T>(BTC);
  for (int l = 0; l < cfg.n_layer; ++l) block_out_.emplace_back(BTC);
  lora_ = CudaLora<T>(cfg, units_, max_batch * cfg.seq_len, recompute);
  linear_ = CudaLinear<T>(fp8, cfg_, max_batch * cfg.seq_len);
  ST_CHECK(ctx_.scratch_bytes >= static_cast<size_t>(linear_.codes_bytes()), "train.fp8 needs ", linear_.codes_bytes(),
           " bytes of kernel scratch for its codes (cuda_model_footprint with the recipe), the context has ",
           ctx_.scratch_bytes);
}

template <typename T>
void CudaModelBase<T>::head_forward_backward(const T* head_params, const T* emb_params, const int32_t* targets,
                                             float dloss, T* head_grads, T* emb_grads) {
  // With LoRA the head and the embedding may both be wholly frozen, with no gradient buffers: the residual gradient
  // is still needed by the blocks' adapters.
  const bool backward = head_grads != nullptr || cfg_.lora.enabled();
  head_pass(head_params, emb_params, targets, dloss, head_grads, emb_grads, backward);
}

template <typename T>
void CudaModelBase<T>::head_forward(const T* head_params, const T* emb_params, const int32_t* targets) {
  head_pass(head_params, emb_params, targets, 0.0f, nullptr, nullptr, false);
}

template <typename T>
const int32_t* CudaModelBase<T>::start_batch(const int32_t* tokens, int64_t B, int64_t t) {
  ST_CHECK(B >= 1 && B <= max_batch_ && t >= 1 && t <= cfg_.seq_len, "shape [", B, ", ", t, "] exceeds [", max_batch_,
           ", ", cfg_.seq_len, "]");
  B_ = B;
  T_ = t;
  lora_.set_batch(dropout_seed_, first_sequence_, t);
  return io_.upload_tokens(tokens, B * t, ctx_.stream);
}

template <typename T>
double CudaModelBase<T>::take_loss_sum() {
  const double sum = io_.take_loss_sum(ctx_.stream);
  timer_.collect();
  return sum;
}

template <typename T>
void CudaModelBase<T>::move_loss_sum(double* dst) {
  io_.move_loss_sum(dst, ctx_.stream);
}

template <typename T>
void CudaModelBase<T>::base_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int C, int OC,
                                    bool onto, OpTimer::Laps* lap, LinearSite site, uint8_t* x_t_codes) {
  linear_.forward(out, inp, w, bias, onto ? out : nullptr, N, C, OC, ctx_, lap, site, x_t_codes);
}

template class CudaModelBase<float>;
template class CudaModelBase<bf16>;
template class CudaModelBase<fp16>;

}  // namespace st
