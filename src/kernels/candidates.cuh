// Private to src/kernels/*.cu: picking a row's token from chunks of candidates, shared by the greedy argmax
// (argmax.cu: score = the logit) and the sampled draw (sample.cu: score = logit / T + noise). A candidate is
// (score, id); the larger score wins, then the lower id, so the choice does not depend on the order in which threads
// meet. A block reduces its chunk of a row to one Candidate, then a warp a row reduces the row's chunks.
#pragma once

#include <cstdint>

#include "gpu_pack.cuh"

namespace st::gpu::kernels_internal {

// The best candidate of a chunk (id V: none), and whether the chunk holds a non-finite logit.
template <typename S>
struct Candidate {
  S score;
  int32_t id;
  int32_t bad;
};

template <typename S>
__device__ __forceinline__ bool better_candidate(S score, int id, S best, int best_id) {
  return score > best || (score == best && id < best_id);
}

// The best of a warp's candidates, in every lane.
template <typename S>
__device__ __forceinline__ void warp_best(S* score, int* id) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    const S s = __shfl_xor_sync(0xffffffffu, *score, off);
    const int i = __shfl_xor_sync(0xffffffffu, *id, off);
    if (better_candidate(s, i, *score, *id)) *score = s, *id = i;
  }
}

// The best of a block's kThreads candidates and whether any thread saw a non-finite logit, written by thread 0 to
// *out (every thread of the block calls it).
template <int kThreads, typename S>
__device__ __forceinline__ void block_best(S score, int id, int bad, Candidate<S>* out) {
  __shared__ S scores[kThreads / kWarpSize];
  __shared__ int ids[kThreads / kWarpSize];
  bad = __syncthreads_or(bad);
  warp_best(&score, &id);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) scores[warp] = score, ids[warp] = id;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / kWarpSize; ++w)
    if (better_candidate(scores[w], ids[w], score, id)) score = scores[w], id = ids[w];
  *out = Candidate<S>{score, id, bad};
}

// One warp per row: the best of the row's `chunks` candidates into tokens[row], or -1 when a chunk saw a non-finite
// logit. Launched after its predecessor where the caller asks (launch_after_predecessor), else an ordinary launch.
template <typename S>
__global__ void best_of_chunks_kernel(const Candidate<S>* part, int chunks, int V, int32_t* tokens) {
  allow_dependents();
  wait_for_predecessor();
  const int r = static_cast<int>(blockIdx.x), lane = static_cast<int>(threadIdx.x);
  S best = -INFINITY;
  int best_id = V, bad = 0;
  for (int c = lane; c < chunks; c += kWarpSize) {
    const Candidate<S> b = part[r * chunks + c];
    bad |= b.bad;
    if (better_candidate(b.score, b.id, best, best_id)) best = b.score, best_id = b.id;
  }
  bad = __any_sync(0xffffffffu, bad != 0) ? 1 : 0;
  warp_best(&best, &best_id);
  if (lane == 0) tokens[r] = bad != 0 ? -1 : best_id;
}

}  // namespace st::gpu::kernels_internal
