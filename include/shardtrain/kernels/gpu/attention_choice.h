// Which attention kernels a CUDA model runs (train.attention), and the kernel scratch they need. cuDNN's plans are
// built here, once, at the training shape (micro_batch x seq_len): its deterministic backward keeps dS for every
// head in its workspace (B x NH x T x T x 2 bytes), so the memory plan must know the size before anything else is
// allocated.
//
//   gpu::Cudnn cudnn;
//   const AttentionChoice a = choose_attention<bf16>(
//       {cfg.train.attention, cfg.train.deterministic, B, T, C, NH, NKV, hs}, cudnn);
//   CudaGpt<bf16> model(cfg.model, B, recompute, a.cudnn, ctx, a.backward);   // scratch >= a.scratch_bytes
//
// A grouped-query model names its K/V heads and head size too: {impl, deterministic, B, T, C, NH, NKV, hs}.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"

namespace st::gpu {

struct AttentionRequest {
  AttentionImpl impl = AttentionImpl::kAuto;  // train.attention
  bool deterministic = true;                  // train.deterministic
  int B = 0, T = 0, C = 0, NH = 0;            // the training shape
  int NKV = 0;                                // key/value heads (grouped-query attention); 0: NH
  int hs = 0;                                 // head size; 0: C / NH
};

struct AttentionChoice {
  bool cudnn = false;         // cuDNN's fused SDPA at the training shape; flash attention otherwise
  int64_t scratch_bytes = 0;  // what cuDNN's passes need in GpuContext::scratch (0 for flash)
  std::string what;           // for the log: the kernel, and why
  CudnnBackwardMode backward = CudnnBackwardMode::kDeterministic;
};

// flash when asked; cudnn when asked (kBadInput naming train.attention when cuDNN cannot run T at this shape, heads
// and head size);
// auto: cudnn where cuDNN runs the type and shape, else flash. fp32 always takes flash under auto. A fault while
// building cuDNN's plans (st::Error of kind kFault) propagates: it never turns into a choice of other kernels.
template <typename T>
AttentionChoice choose_attention(const AttentionRequest& request, Cudnn& cudnn);

}  // namespace st::gpu
