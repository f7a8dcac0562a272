#include "shardtrain/kernels/gpu/attention_choice.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st::gpu {

template <typename T>
AttentionChoice choose_attention(const AttentionRequest& r, Cudnn& cudnn) {
  // Our flash backward is deterministic: train.deterministic=false changes nothing there, and the log says so.
  const std::string flash_note =
      r.deterministic ? "" : "; its backward is deterministic whatever train.deterministic says";
  if (r.impl == AttentionImpl::kFlash) return {false, 0, str_cat("flash (train.attention=flash)", flash_note), {}};
  GpuContext probe;
  probe.cudnn = &cudnn;
  const CudnnBackwardMode mode =
      r.deterministic ? CudnnBackwardMode::kDeterministic : CudnnBackwardMode::kNondeterministic;
  // An hs of 0 left by a C that NH does not divide is refused by cuDNN's shape check, like any invalid shape.
  const int NKV = r.NKV > 0 ? r.NKV : r.NH;
  const int hs = r.hs > 0 ? r.hs : (r.NH > 0 && r.C % r.NH == 0 ? r.C / r.NH : 0);
  try {
    const size_t fwd = cudnn_attention_forward_scratch_bytes<T>(r.B, r.T, r.NH, NKV, hs, probe);
    const size_t bwd = cudnn_attention_backward_scratch_bytes<T>(r.B, r.T, r.NH, NKV, hs, probe, mode);
    const size_t v = cudnn_runtime_version();
    return {true, static_cast<int64_t>(std::max(fwd, bwd)),
            str_cat("cudnn ", v / 10000, ".", v / 100 % 100, " (fused SDPA, ",
                    r.deterministic ? "deterministic backward)"
                                    : "nondeterministic backward: dQ by atomics, train.deterministic=false)"),
            mode};
  } catch (const Error& e) {
    // A fault (a cuDNN call or a plan build that failed, not a shape cuDNN cannot run) is not a reason to run other
    // kernels than the same run would alone.
    if (e.kind() == ErrorKind::kFault) throw;
    if (r.impl == AttentionImpl::kCudnn) ST_BAD_INPUT("train.attention=cudnn: ", e.what());
    return {false, 0, str_cat("flash (cuDNN cannot run this shape: ", e.what(), ")", flash_note), {}};
  }
}

template AttentionChoice choose_attention<float>(const AttentionRequest&, Cudnn&);
template AttentionChoice choose_attention<bf16>(const AttentionRequest&, Cudnn&);
template AttentionChoice choose_attention<fp16>(const AttentionRequest&, Cudnn&);

}  // namespace st::gpu
