#include "shardtrain/kernels/gpu/sample.h"

#include <cmath>
#include <cub/block/block_scan.cuh>

#include "candidates.cuh"
#include "gpu_pack.cuh"
#include "sample_noise.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

using namespace kernels_internal;        // gpu_pack.cuh
using namespace ::st::kernels_internal;  // sample_noise.h

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kSelectThreads = 1024;
constexpr int kScoreThreads = 256;
constexpr int kRadixBits = 8;
constexpr int kBins = 1 << kRadixBits;
constexpr int kBinsPerLane = kBins / kWarpSize;

// A row's k-th candidate: its logit's key and id. A candidate's key is larger, or equal with an id no larger.
struct Pivot {
  uint32_t key;
  int32_t id;
};
using Best = Candidate<double>;  // a chunk's best (candidates.cuh)
static_assert(sizeof(Best) == 16 && sizeof(Pivot) == 8, "sample_rows_scratch_bytes counts 16 and 8 bytes");

// Adds one to hist[digit] for each lane with `in`, one shared atomic per distinct digit of the warp: a row's logits
// crowd into few bins of the top digit, where lane-by-lane atomics would queue.
__device__ __forceinline__ void count_digit(unsigned* hist, unsigned digit, bool in) {
  const unsigned lanes = __ballot_sync(kFullMask, in);
  if (!in) return;
  const unsigned peers = __match_any_sync(lanes, digit);
  if (static_cast<int>(threadIdx.x % kWarpSize) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
}

// Warp 0: the bin, from the top, that holds the element of rank *rank (1-based, descending) among those counted;
// appends its digit to *prefix, leaves the rank within the bin in *rank and the bin's count in *ties.
__device__ void pick_digit(const unsigned* hist, int shift, uint32_t* prefix, unsigned* rank, unsigned* ties) {
  const int lane = static_cast<int>(threadIdx.x);
  const int top = kBins - 1 - lane * kBinsPerLane;  // lane 0 holds the highest bins
  unsigned sum = 0;
  for (int j = 0; j < kBinsPerLane; ++j) sum += hist[top - j];
  unsigned through = sum;  // the counts of lanes 0 .. lane
  for (int d = 1; d < kWarpSize; d *= 2) {
    const unsigned other = __shfl_up_sync(kFullMask, through, d);
    if (lane >= d) through += other;
  }
  const unsigned want = *rank;
  __syncwarp();
  unsigned before = through - sum;
  if (before >= want || want > through) return;
  for (int j = 0; j < kBinsPerLane; ++j) {
    const unsigned count = hist[top - j];
    if (want <= before + count) {
      *prefix |= static_cast<uint32_t>(top - j) << shift;
      *rank = want - before;
      *ties = count;
      return;
    }
    before += count;
  }
}

// The keys of a row's logits i .. i + kVec - 1 that lie below V (the others: 0, and in[j] false), read as one pack
// where the pack is whole.
template <int kVec, typename T>
__device__ __forceinline__ void load_keys(const T* row, int i, int V, uint32_t (&key)[kVec], bool (&in)[kVec]) {
  if (i + kVec <= V) {
    const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(row + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) key[j] = logit_key(to_f32(pk.v[j])), in[j] = true;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      in[j] = i + j < V;
      key[j] = in[j] ? logit_key(to_f32(row[i + j])) : 0u;
    }
  }
}

// One block per row: the row's k-th candidate (1 <= k < V) into pivots[row]. Each radix pass reads the row in packs
// of kVec (rows 16-byte aligned; else kVec 1), every thread kVec logits at a time.
template <int kVec, typename T>
__global__ void __launch_bounds__(kSelectThreads)
    select_kernel(const T* logits, int64_t ld, int V, int k, Pivot* pivots) {
  __shared__ unsigned hist[kBins];
  __shared__ uint32_t prefix;
  __shared__ unsigned rank, ties;
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan;
  const T* row = logits + blockIdx.x * ld;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) prefix = 0, rank = static_cast<unsigned>(k);
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int b = tid; b < kBins; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t high = shift + kRadixBits >= 32 ? 0u : ~0u << (shift + kRadixBits);  // the digits found so far
    const uint32_t want = prefix & high;
    for (int base = 0; base < V; base += kSelectThreads * kVec) {  // the same trip count on every thread
      uint32_t key[kVec];
      bool in[kVec];
      load_keys<kVec>(row, base + tid * kVec, V, key, in);
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        count_digit(hist, (key[j] >> shift) & (kBins - 1), in[j] && (key[j] & high) == want);
    }
    __syncthreads();
    if (tid < kWarpSize) pick_digit(hist, shift, &prefix, &rank, &ties);
    __syncthreads();
  }
  const uint32_t key = prefix;
  if (ties == rank) {  // every logit equal to the k-th is a candidate
    if (tid == 0) pivots[blockIdx.x] = Pivot{key, V - 1};
    return;
  }
  // The rank-th lowest id among the logits equal to the k-th: each thread counts them in its own run of ids (whole
  // packs), and an exclusive scan over the runs finds the run that holds it.
  const int per = (V + kSelectThreads * kVec - 1) / (kSelectThreads * kVec) * kVec;
  const int lo = min(V, tid * per), hi = min(V, lo + per);
  int count = 0;
  for (int i = lo; i < hi; i += kVec) {
    uint32_t keys[kVec];
    bool in[kVec];
    load_keys<kVec>(row, i, V, keys, in);
#pragma unroll
    for (int j = 0; j < kVec; ++j) count += in[j] && keys[j] == key ? 1 : 0;
  }
  int before = 0;
  Scan(scan).ExclusiveSum(count, before);
  const int target = static_cast<int>(rank);
  if (before >= target || target > before + count) return;
  int left = target - before;
  for (int i = lo; i < hi; i += kVec) {
    uint32_t keys[kVec];
    bool in[kVec];
    load_keys<kVec>(row, i, V, keys, in);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (in[j] && keys[j] == key && --left == 0) {
        pivots[blockIdx.x] = Pivot{key, i + j};
        return;
      }
    }
  }
}

// Block (chunk c, row r): the best candidate of ids [c kSampleChunk, (c + 1) kSampleChunk) of row r into
// part[r chunks + c]. pivots null: every id is a candidate.
template <typename T>
__global__ void __launch_bounds__(kScoreThreads)
    score_kernel(const T* logits, int64_t ld, int V, const uint64_t* draws, double temperature, uint64_t seed,
                 const Pivot* pivots, Best* part, int chunks) {
  const int r = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const T* row = logits + r * ld;
  const uint64_t first = draws[r] * static_cast<uint64_t>(V);
  const Pivot pivot = pivots != nullptr ? pivots[r] : Pivot{0u, V};
  double best = -INFINITY;
  int best_id = V;  // none yet: any candidate beats it
  int bad = 0;
  const int end = min(V, (c + 1) * kSampleChunk);
  for (int i = c * kSampleChunk + static_cast<int>(threadIdx.x); i < end; i += kScoreThreads) {
    const float v = to_f32(row[i]);
    if (!isfinite(v)) {
      bad = 1;
      continue;
    }
    if (pivots != nullptr) {
      const uint32_t key = logit_key(v);
      if (key < pivot.key || (key == pivot.key && i > pivot.id)) continue;
    }
    const double score = sample_score(v, temperature, seed, first + static_cast<uint64_t>(i));
    if (sample_better(score, i, best, best_id)) best = score, best_id = i;
  }
  block_best<kScoreThreads>(best, best_id, bad, part + r * chunks + c);
}

}  // namespace

template <typename T>
void sample_rows(const T* logits, int64_t ld, int rows, int V, const uint64_t* draws, const SamplingOptions& o,
                 int32_t* tokens, const GpuContext& ctx) {
  ST_CHECK(rows >= 0 && rows <= 65535 && V >= 1 && ld >= V, "sampling ", rows, " rows of ", V,
           " logits with a row stride of ", ld);
  ST_CHECK(o.temperature > 0 && std::isfinite(o.temperature) && o.top_k >= 0, "sampling at temperature ", o.temperature,
           " among the top ", o.top_k, " (greedy is argmax_rows)");
  if (rows == 0) return;
  const size_t need = sample_rows_scratch_bytes(rows, V);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "sample_rows needs ", need,
           " bytes of scratch, ctx has ", ctx.scratch_bytes);
  const int chunks = sample_chunks(V);
  auto* part = static_cast<Best*>(ctx.scratch);
  Pivot* pivots = nullptr;
  if (o.top_k > 0 && o.top_k < V) {
    pivots = reinterpret_cast<Pivot*>(part + int64_t{rows} * chunks);
    constexpr int kVec = 16 / sizeof(T);
    launch_packed<T>(all_aligned(16, logits) && ld % kVec == 0, [&](auto w) {
      select_kernel<decltype(w)::value, T><<<static_cast<unsigned>(rows), kSelectThreads, 0, ctx.stream>>>(
          logits, ld, V, static_cast<int>(o.top_k), pivots);
    });
  }
  score_kernel<T><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), kScoreThreads, 0, ctx.stream>>>(
      logits, ld, V, draws, o.temperature, o.seed, pivots, part, chunks);
  best_of_chunks_kernel<double><<<static_cast<unsigned>(rows), kWarpSize, 0, ctx.stream>>>(part, chunks, V, tokens);
  ST_CUDA_CHECK_LAUNCH();
}

template void sample_rows<float>(const float*, int64_t, int, int, const uint64_t*, const SamplingOptions&, int32_t*,
                                 const GpuContext&);
template void sample_rows<bf16>(const bf16*, int64_t, int, int, const uint64_t*, const SamplingOptions&, int32_t*,
                                const GpuContext&);
template void sample_rows<fp16>(const fp16*, int64_t, int, int, const uint64_t*, const SamplingOptions&, int32_t*,
                                const GpuContext&);

}  // namespace st::gpu
