#include "shardtrain/kernels/gpu/column_sums.h"

#include <algorithm>
#include <type_traits>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

struct Jobs {
  ColumnSums::Job job[ColumnSums::kMaxQueued];
};

// blockIdx.y picks the job, blockIdx.x its 32 columns (the grid covers the widest job; narrower ones' extra blocks
// return at once, whole, before the block's barrier).
template <typename T>
__global__ void __launch_bounds__(kWarpSize* kFinishLanes) finish_queued_kernel(const Jobs jobs) {
  wait_for_predecessor();  // launched by launch_after_predecessor
  const ColumnSums::Job& j = jobs.job[blockIdx.y];
  if (static_cast<int64_t>(blockIdx.x) * kWarpSize >= j.C) return;
  finish_column_sums_block(static_cast<T*>(j.out), j.part, j.chunks, j.C, j.accumulate != 0,
                           static_cast<int>(blockIdx.x));
}

}  // namespace

ColumnSums::ColumnSums(size_t bytes) : buffer_(static_cast<int64_t>(bytes)) {}

float* ColumnSums::reserve(int64_t floats) {
  const size_t need = reserved_bytes(floats);
  ST_CHECK(used_ + need <= capacity_bytes(), "ColumnSums: ", need, " more bytes of partial sums do not fit (", used_,
           " of ", capacity_bytes(), " in use): its owner sized it for less than it queues between two finishes");
  float* p = reinterpret_cast<float*>(buffer_.data() + used_);
  used_ += need;
  return p;
}

template <typename T>
void ColumnSums::queue(T* out, const float* part, int64_t chunks, int C, GradWrite write) {
  if (C <= 0) return;
  const Type t = std::is_same_v<T, float> ? Type::kFloat : (std::is_same_v<T, bf16> ? Type::kBf16 : Type::kFp16);
  ST_CHECK(type_ == Type::kNone || type_ == t, "ColumnSums: the sums queued for one finish must share their type");
  ST_CHECK(jobs_.size() < static_cast<size_t>(kMaxQueued), "ColumnSums: more than ", kMaxQueued,
           " sums queued; finish() first");
  type_ = t;
  jobs_.push_back({out, part, chunks, C, write == GradWrite::kAccumulate ? 1 : 0});
}

void ColumnSums::finish(cudaStream_t stream) {
  if (!jobs_.empty()) {
    Jobs jobs{};
    int widest = 0;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      jobs.job[i] = jobs_[i];
      widest = std::max(widest, jobs_[i].C);
    }
    const dim3 grid(static_cast<unsigned>((widest + kWarpSize - 1) / kWarpSize), static_cast<unsigned>(jobs_.size()));
    const dim3 block(kWarpSize, kFinishLanes);
    if (type_ == Type::kFloat)
      launch_after_predecessor(finish_queued_kernel<float>, grid, block, 0, stream, jobs);
    else if (type_ == Type::kBf16)
      launch_after_predecessor(finish_queued_kernel<bf16>, grid, block, 0, stream, jobs);
    else
      launch_after_predecessor(finish_queued_kernel<fp16>, grid, block, 0, stream, jobs);
  }
  jobs_.clear();
  used_ = 0;
  type_ = Type::kNone;
}

template void ColumnSums::queue<float>(float*, const float*, int64_t, int, GradWrite);
template void ColumnSums::queue<bf16>(bf16*, const float*, int64_t, int, GradWrite);
template void ColumnSums::queue<fp16>(fp16*, const float*, int64_t, int, GradWrite);

}  // namespace st::gpu
