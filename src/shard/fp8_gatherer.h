// Private to src/shard: dist.fp8_gather's gathers on the CUDA backend, for CudaShardedModel. Each is fp8_gather.h's
// steps queued on the communication stream: this rank's maxima of its parts of the FP8 weights, their all-gather, the
// weights' maxima and inverse scales (gpu::fp8_scales_of_parts), this rank's codes (gpu::fp8_quantize_with_maxima_async
// over each part) and rest packed into its block, the blocks' all-gather, and every piece copied into place: a
// weight's codes and inverse scale in its region of the gathered buffer where fp8_weight_codes says (what CudaLinear
// reads under Fp8Policy::weights_cast), the rest at its own elements. Under delayed, in a training pass once the
// history holds a step, the scales come from the history before any cast, and the casts
// (gpu::fp8_quantize_ahead_async) fold the parts' maxima as they read: no pass over the source takes them, and their
// all-gather follows the casts. One rank's gathers skip both all-gathers and read its maxima and block where they lie.
// With dist.fp8_gather_keep a training gather at an epoch whose block is kept skips everything before the blocks'
// all-gather.
//
//   Fp8Gatherer<bf16> fp8(cfg, units, rank, world);
//   if (fp8.applies(u, 0)) received += fp8.gather(u, 0, shards.gather_source(u), full, nccl, comm_ctx);
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/model/cuda_fp8_history.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/fp8_gather.h"

namespace st::shard_internal {

template <typename T>
class Fp8Gatherer {
 public:
  // Every unit's segments planned at `world` ranks, and staging for the largest (fp8_gather_staging_bytes).
  Fp8Gatherer(const Config& cfg, const std::vector<UnitLayout>& units, int rank, int world);

  // Whether the unit's trainable (segment 0) or frozen (1) segment gathers in FP8.
  bool applies(int unit, int segment) const { return !plans_[static_cast<size_t>(unit)][segment].empty(); }
  // Whether that segment's gather at `epoch` sends a kept block (dist.fp8_gather_keep), and so reads no source.
  bool kept(int unit, int segment, int64_t epoch) const {
    return !kept_.empty() && epoch >= 0 && applies(unit, segment) &&
           kept_[static_cast<size_t>(unit)][static_cast<size_t>(segment)].epoch == epoch;
  }
  // That segment gathered into `full`, the unit's gathered buffer, from this rank's slot of it (`source`, on the
  // device), on ctx.stream through `nccl`; returns the bytes this rank receives. Refuses a weight whose region has no
  // room for its codes at a 256-byte boundary (fp8_weight_codes: a 16 x 16 weight at most). With `history`
  // (train.fp8=delayed, recording: a training pass) each weight scales by its pick and records its maximum there;
  // ctx.stream must then follow the history's step ends. With dist.fp8_gather_keep and an `epoch` >= 0 (a training
  // pass: the caller's count of the changes to its shards and history), the segment's block and inverse scales are
  // kept, and a later gather at the same epoch sends them as they are: no maxima, no casts.
  int64_t gather(int unit, int segment, const T* source, T* full, NcclCommunicator& nccl, const gpu::GpuContext& ctx,
                 CudaFp8History* history = nullptr, int64_t epoch = -1);

 private:
  // Steps 1 and 2 of a gather (fp8_gather.h): this rank's block of segment g into `send` and the weights' inverse
  // scales into `inverse`, from its slot `source`, on ctx.stream (its scratch set).
  void cast_block(const Fp8GatherSegment& g, const T* source, uint8_t* send, float* inverse, CudaFp8History* history,
                  NcclCommunicator& nccl, const gpu::GpuContext& ctx);
  // Every rank's part maxima of segment g's weights (part_max_, all-gathered into all_max_ past one rank), on
  // ctx.stream: [world, k].
  const unsigned* all_maxima(const Fp8GatherSegment& g, NcclCommunicator& nccl, const gpu::GpuContext& ctx);

  std::vector<std::array<Fp8GatherSegment, 2>> plans_;
  int rank_ = 0;
  // dist.fp8_gather_keep: each segment's block and inverse scales, and the epoch they were cast at (-1: none yet).
  struct Kept {
    DeviceBuffer<uint8_t> block;
    DeviceBuffer<float> inverse;
    int64_t epoch = -1;
  };
  std::vector<std::array<Kept, 2>> kept_;
  DeviceBuffer<uint8_t> send_, recv_;           // this rank's block; every rank's
  DeviceBuffer<unsigned> part_max_, all_max_;   // this rank's parts' maxima; every rank's
  DeviceBuffer<unsigned> maxima_, picked_;      // each weight's; the delayed history's picks
  DeviceBuffer<float> inverse_, cast_inverse_;  // each weight's inverse scale; the casts' own (unused)
  DeviceBuffer<unsigned char> scratch_;         // the casts' scratch
};

}  // namespace st::shard_internal
