#include "fp8_gatherer.h"

#include <algorithm>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/fp8.h"
#include "shardtrain/kernels/gpu/fp8_history.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/fp8_policy.h"

namespace st::shard_internal {

template <typename T>
Fp8Gatherer<T>::Fp8Gatherer(const Config& cfg, const std::vector<UnitLayout>& units, int rank, int world)
    : rank_(rank) {
  Fp8Policy policy = fp8_policy(cfg.train.fp8);
  int64_t block = 0, k = 0;
  for (const UnitLayout& u : units) {
    plans_.push_back({fp8_gather_segment(cfg.model, u, false, world, policy),
                      fp8_gather_segment(cfg.model, u, true, world, policy)});
    for (const Fp8GatherSegment& g : plans_.back()) {
      block = std::max(block, g.block_bytes(sizeof(T)));
      k = std::max<int64_t>(k, static_cast<int64_t>(g.weights.size()));
    }
  }
  if (k == 0) return;
  if (cfg.dist.fp8_gather_keep) {  // fp8_gather_kept_bytes: what the memory plan counts
    kept_.resize(plans_.size());
    for (size_t u = 0; u < plans_.size(); ++u)
      for (size_t s = 0; s < 2; ++s) {
        const Fp8GatherSegment& g = plans_[u][s];
        if (g.empty()) continue;
        kept_[u][s].block = DeviceBuffer<uint8_t>(g.block_bytes(sizeof(T)));
        kept_[u][s].inverse = DeviceBuffer<float>(static_cast<int64_t>(g.weights.size()));
      }
  }
  send_ = DeviceBuffer<uint8_t>(block);
  recv_ = DeviceBuffer<uint8_t>(world * block);
  part_max_ = DeviceBuffer<unsigned>(k);
  all_max_ = DeviceBuffer<unsigned>(world * k);
  maxima_ = DeviceBuffer<unsigned>(k);
  picked_ = DeviceBuffer<unsigned>(k);
  inverse_ = DeviceBuffer<float>(k);
  cast_inverse_ = DeviceBuffer<float>(1);
  scratch_ = DeviceBuffer<unsigned char>(static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(1)));
}

template <typename T>
int64_t Fp8Gatherer<T>::gather(int unit, int segment, const T* source, T* full, NcclCommunicator& nccl,
                               const gpu::GpuContext& comm_ctx, CudaFp8History* history, int64_t epoch) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const Fp8GatherSegment& g = plans_[static_cast<size_t>(unit)][segment];
    gpu::GpuContext ctx = comm_ctx;
    ctx.scratch = scratch_.data();
    ctx.scratch_bytes = scratch_.bytes();
    const cudaStream_t s = ctx.stream;
    const int64_t k = static_cast<int64_t>(g.weights.size()), block = g.block_bytes(sizeof(T));
    // dist.fp8_gather_keep: in a training pass the block and inverse scales are the segment's kept ones, cast by the
    // epoch's first gather and sent as they are by its later ones.
    Kept* const kept =
        kept_.empty() || epoch < 0 ? nullptr : &kept_[static_cast<size_t>(unit)][static_cast<size_t>(segment)];
    const bool hit = this->kept(unit, segment, epoch);
    uint8_t* const send = kept != nullptr ? kept->block.data() : send_.data();
    float* const inverse = kept != nullptr ? kept->inverse.data() : inverse_.data();
    if (!hit) cast_block(g, source, send, inverse, history, nccl, ctx);
    if (kept != nullptr) kept->epoch = epoch;
    // Every rank's block; one rank's is its own, read where it lies.
    const uint8_t* const blocks = g.world == 1 ? send : recv_.data();
    if (g.world > 1) nccl.all_gather<uint8_t>(send, block, recv_.data(), s);
    // 3. Every piece into place: a weight's codes where fp8_weight_codes puts them in its region, then its inverse
    // scale; the rest at its elements.
    std::vector<uint8_t*> codes(static_cast<size_t>(k));
    for (int64_t w = 0; w < k; ++w) {
      const Fp8GatherWeight& gw = g.weights[static_cast<size_t>(w)];
      codes[static_cast<size_t>(w)] = fp8_weight_codes(full + g.base + gw.offset, gw.numel, sizeof(T));
      ST_CHECK(codes[static_cast<size_t>(w)] != nullptr, "dist.fp8_gather: a weight of ", gw.numel,
               " elements at element ", g.base + gw.offset, " of unit ", unit,
               "'s buffer has no room for its codes at a 256-byte boundary");
      ST_CUDA_CHECK(cudaMemcpyAsync(codes[static_cast<size_t>(w)] + gw.numel, inverse + w, sizeof(float),
                                    cudaMemcpyDeviceToDevice, s));
    }
    for (const Fp8GatherPiece& p : g.pieces) {
      const uint8_t* from = blocks + p.rank * block;
      if (p.weight >= 0) {
        const Fp8GatherWeight& w = g.weights[static_cast<size_t>(p.weight)];
        ST_CUDA_CHECK(cudaMemcpyAsync(codes[static_cast<size_t>(p.weight)] + (p.offset - w.offset), from + p.staged_at,
                                      static_cast<size_t>(p.count), cudaMemcpyDeviceToDevice, s));
      } else {
        ST_CUDA_CHECK(cudaMemcpyAsync(full + g.base + p.offset,
                                      reinterpret_cast<const T*>(from + g.code_stride) + p.staged_at,
                                      static_cast<size_t>(p.count) * sizeof(T), cudaMemcpyDeviceToDevice, s));
      }
    }
    return hit ? g.kept_received_bytes(sizeof(T)) : g.received_bytes(sizeof(T));
  } else {
    ST_CHECK(false, "dist.fp8_gather computes in bf16 or fp32");  // the config refuses fp16 with train.fp8
    return 0;
  }
}

template <typename T>
void Fp8Gatherer<T>::cast_block(const Fp8GatherSegment& g, const T* source, uint8_t* send, float* inverse,
                                CudaFp8History* history, NcclCommunicator& nccl, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const cudaStream_t s = ctx.stream;
    const int64_t k = static_cast<int64_t>(g.weights.size()), first = int64_t{rank_} * g.slot;
    const std::vector<Fp8GatherPiece> mine = g.pieces_of(rank_);
    const auto site = [&](int64_t w) { return fp8_history_index(g.weights[static_cast<size_t>(w)].site, kFp8W); };
    // Delayed, in a training pass, once the history holds a step: each weight's scale is the history's largest
    // maximum, known before the cast, as the linear layers' own casts ahead take it (CudaLinear, the fused
    // producers: 1 for a weight 0 throughout its history), so that no pass over the source takes the maxima. Each
    // cast folds this rank's part's maximum in as it reads; the ranks then trade those, and the history records
    // each weight's.
    const bool ahead = history != nullptr && history->recording() && history->filled() > 0 && !g.power_of_2;
    ST_CUDA_CHECK(cudaMemsetAsync(part_max_.data(), 0, static_cast<size_t>(k) * sizeof(unsigned), s));
    if (ahead) {
      for (int64_t w = 0; w < k; ++w)  // the inverse scales alone, for the weights this rank holds none of too
        gpu::fp8_quantize_ahead_async<T>(nullptr, 0, 0, g.format, history->history_max() + site(w), nullptr, nullptr,
                                         inverse + w, nullptr, ctx);
    } else {
      // 1. The maxima of this rank's parts (0 for a weight it has none of), every rank's, each weight's.
      for (const Fp8GatherPiece& p : mine)
        if (p.weight >= 0)
          gpu::fp8_maxima_async<T>(source + (p.offset - first), 1, p.count, Fp8Scaling::kTensor,
                                   part_max_.data() + p.weight, ctx);
      const unsigned* all = all_maxima(g, nccl, ctx);
      gpu::fp8_scales_of_parts(all, g.world, k, g.format, g.power_of_2, maxima_.data(), inverse, ctx);
      // Delayed, in a training pass, while the history holds no step: each weight scales by the history's pick (its
      // own maximum), which records it, as the linear layers' cast of the gathered weight does (cuda_linear.cu).
      if (history != nullptr && history->recording()) {
        for (int64_t w = 0; w < k; ++w) {
          const unsigned* pick = history->pick(site(w), maxima_.data() + w, ctx);
          ST_CUDA_CHECK(cudaMemcpyAsync(picked_.data() + w, pick, sizeof(unsigned), cudaMemcpyDeviceToDevice, s));
        }
        gpu::fp8_scales_of_parts(picked_.data(), 1, k, g.format, g.power_of_2, maxima_.data(), inverse, ctx);
      }
    }
    // 2. This rank's block: its codes where its elements sit in its slot, then its rest packed.
    T* rest = reinterpret_cast<T*>(send + g.code_stride);
    for (const Fp8GatherPiece& p : mine) {
      const T* x = source + (p.offset - first);
      if (p.weight < 0)
        ST_CUDA_CHECK(cudaMemcpyAsync(rest + p.staged_at, x, static_cast<size_t>(p.count) * sizeof(T),
                                      cudaMemcpyDeviceToDevice, s));
      else if (ahead)
        gpu::fp8_quantize_ahead_async<T>(x, 1, p.count, g.format, history->history_max() + site(p.weight),
                                         send + p.staged_at, nullptr, cast_inverse_.data(), part_max_.data() + p.weight,
                                         ctx);
      else
        gpu::fp8_quantize_with_maxima_async<T>(x, 1, p.count, g.format, Fp8Scaling::kTensor, g.power_of_2,
                                               Fp8Layout::kRowMajor, maxima_.data() + p.weight, send + p.staged_at,
                                               cast_inverse_.data(), ctx);
    }
    if (ahead) {  // each weight's maximum, the largest of the parts' its casts folded, into the step's maxima
      const unsigned* all = all_maxima(g, nccl, ctx);
      const unsigned* whole = all;
      if (g.world > 1) {
        gpu::fp8_max_over_ranks(all, g.world, k, maxima_.data(), ctx);
        whole = maxima_.data();
      }
      for (int64_t w = 0; w < k; ++w) history->pick(site(w), whole + w, ctx);
    }
  }
}

template <typename T>
const unsigned* Fp8Gatherer<T>::all_maxima(const Fp8GatherSegment& g, NcclCommunicator& nccl,
                                           const gpu::GpuContext& ctx) {
  if (g.world == 1) return part_max_.data();
  const int64_t k = static_cast<int64_t>(g.weights.size());
  nccl.all_gather<float>(reinterpret_cast<const float*>(part_max_.data()), k, reinterpret_cast<float*>(all_max_.data()),
                         ctx.stream);
  return all_max_.data();
}

template class Fp8Gatherer<float>;
template class Fp8Gatherer<bf16>;
template class Fp8Gatherer<fp16>;

}  // namespace st::shard_internal
