// What every CUDA model (CudaGpt, CudaLlama) does at its two ends, in one place: tokens and targets go up from the
// host through pinned staging (asynchronously), the classifier runs in row chunks that compute logits, the
// cross-entropy and dlogits in place and feed them straight back (full logits never exist: at a 152k vocabulary they
// would be 300 KiB per token in bf16), and the per-token losses are summed into a device accumulator.
//
//   CudaLmIo<T> io(cfg, max_batch, stream);
//   const int32_t* tokens = io.upload_tokens(host_tokens, N, stream);
//   ... forward to the final norm's output xn [N, C] ...
//   io.upload_targets(host_targets, N, stream);
//   io.classify(xn, w, N, dloss, dxn, dw, GradWrite::kAccumulate, lap, ctx);   // dxn, dw null: forward only
//   double loss_sum = io.take_loss_sum(stream);                                  // synchronises
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/model/cuda_footprint.h"

namespace st {

template <typename T>
class CudaLmIo {
 public:
  CudaLmIo() = default;
  // Allocates for micro-batches of up to max_batch x cfg.seq_len tokens (cuda_lm_io_device_bytes, cuda_footprint.h);
  // zeroes the loss accumulator on `stream`.
  CudaLmIo(const ModelConfig& cfg, int64_t max_batch, cudaStream_t stream);

  // Copies n host tokens (or targets) to the device on `stream` and returns where they are. The pinned staging area
  // is reused by the next upload: the caller synchronises the stream once per micro-step in between (take_loss_sum,
  // logits_of_row, or its own synchronisation after move_loss_sum).
  const int32_t* upload_tokens(const int32_t* host, int64_t n, cudaStream_t stream);
  const int32_t* upload_targets(const int32_t* host, int64_t n, cudaStream_t stream);
  const int32_t* tokens() const { return tokens_.data(); }

  // The classifier on x [N, C] (the final norm's output) with weight w [Vp, C], against the uploaded targets: each
  // token's cross-entropy goes into the loss accumulator (a target < 0 is not a target: it adds 0, and its dlogits
  // row is 0, so it adds nothing to dx or dw either). With dx non-null (backward; each token's loss gradient
  // scaled by dloss), writes dx [N, C] and adds the weight's gradient to dw [Vp, C], or writes it for the first
  // chunk when dw_write is kOverwrite; dw may be null (a frozen classifier: no weight gradient). Laps:
  // head.classifier_fwd, head.softmax_xent, head.classifier_bwd, head.loss_sum.
  void classify(const T* x, const T* w, int64_t N, float dloss, T* dx, T* dw, GradWrite dw_write, OpTimer::Laps& lap,
                const gpu::GpuContext& ctx);
  // Logits over the real vocabulary of one normalised row x [C]; synchronises ctx.stream.
  void logits_of_row(const T* x, const T* w, std::vector<float>* logits, const gpu::GpuContext& ctx);

  // Sum of the per-token losses since the last call; synchronises the stream.
  double take_loss_sum(cudaStream_t stream);
  // The same sum, moved to *dst (device memory) on the stream without waiting; the accumulator restarts at 0.
  void move_loss_sum(double* dst, cudaStream_t stream);

 private:
  const int32_t* upload(DeviceBuffer<int32_t>& dst, int64_t staging_offset, const int32_t* host, int64_t n,
                        cudaStream_t stream);

  int C_ = 0, V_ = 0, Vp_ = 0;
  int64_t max_tokens_ = 0, chunk_rows_ = 0;
  DeviceBuffer<int32_t> tokens_, targets_;
  PinnedBuffer<int32_t> staging_;  // host tokens, then targets, pass through here so the uploads are asynchronous
  DeviceBuffer<T> logits_chunk_;
  DeviceBuffer<float> losses_;
  DeviceBuffer<double> loss_sum_;
};

}  // namespace st
