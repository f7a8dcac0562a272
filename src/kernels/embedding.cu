#include "shardtrain/kernels/gpu/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;
constexpr int kSegmentBlock = 128;

template <int kVec, typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t BT, int T_,
                                         int C, const int32_t* positions) {
  // kVec divides C (or is 1), so a pack never straddles two rows.
  for_each_pack<kVec>(BT * C, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    const int64_t bt = i / C, c = i % C;
    float e[W], p[W];
    load<W>(wte + static_cast<int64_t>(tokens[bt]) * C + c, e);
    if (wpe != nullptr) {  // null: no position embedding (llama)
      load<W>(wpe + (positions != nullptr ? max(positions[bt], 0) : bt % T_) * C + c, p);  // idle rows: row 0
      for (int k = 0; k < W; ++k) e[k] += p[k];
    }
    store<W>(out + i, e);
  });
}

// dwpe[t,c] += sum_b dout[b,t,c]: one thread per (t, c-pack), summing over b in order.
template <int kVec, typename T>
__global__ void embedding_backward_wpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
  const int64_t TC = static_cast<int64_t>(T_) * C;
  for_each_pack<kVec>(TC, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float acc[W] = {}, d[W];
    for (int b = 0; b < B; ++b) {
      load<W>(dout + b * TC + i, d);
      for (int k = 0; k < W; ++k) acc[k] += d[k];
    }
    load<W>(dwpe + i, d);
    for (int k = 0; k < W; ++k) d[k] += acc[k];
    store<W>(dwpe + i, d);
  });
}

__global__ void iota_kernel(int32_t* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

// One block per sorted position; the block at the head of a token's run (the stable sort keeps the run in
// (b,t) order) sums the run's dout rows in that order and adds the sum into dwte once. The others exit.
template <int kVec, typename T>
__global__ void embedding_backward_wte_kernel(T* dwte, const T* dout, const int32_t* sorted_tokens,
                                              const int32_t* sorted_pos, int BT, int C) {
  const int head = blockIdx.x;
  const int32_t tok = sorted_tokens[head];
  if (head > 0 && sorted_tokens[head - 1] == tok) return;  // uniform over the block
  // The run's end: the run is contiguous, so count matches a block-width window at a time.
  int end = head;
  for (int base = head; base < BT; base += blockDim.x) {
    const int j = base + threadIdx.x;
    const int matches = __syncthreads_count(j < BT && sorted_tokens[j] == tok);
    end += matches;
    if (matches < static_cast<int>(blockDim.x)) break;
  }
  for_each_pack<kVec>(C, threadIdx.x, blockDim.x, [&](int64_t c, auto w) {
    constexpr int W = decltype(w)::value;
    float acc[W] = {}, d[W];
    for (int j = head; j < end; ++j) {
      load<W>(dout + static_cast<int64_t>(sorted_pos[j]) * C + c, d);
      for (int k = 0; k < W; ++k) acc[k] += d[k];
    }
    T* g = dwte + static_cast<int64_t>(tok) * C + c;
    load<W>(g, d);
    for (int k = 0; k < W; ++k) d[k] += acc[k];
    store<W>(g, d);
  });
}

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t embedding_sort_temp_bytes(int64_t BT) {
  ST_CHECK(BT >= 0 && BT < (int64_t{1} << 31), "embedding_backward: B*T = ", BT, " does not fit in int");
  size_t bytes = 0;
  ST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(BT), 0, 32));
  return bytes;
}

namespace {

// `rows` rows, row r at position positions[r] (null: r % T_).
template <typename T>
void embed_rows(T* out, const int32_t* tokens, const T* wte, const T* wpe, const int32_t* positions, int64_t rows,
                int T_, int C, const GpuContext& ctx) {
  const int64_t BT = rows;
  if (BT == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // kVec divides C, so aligned base pointers give aligned rows.
  launch_packed<T>(C % kVec == 0 && all_aligned(16, out, wte, wpe), [&](auto w) {
    constexpr int W = decltype(w)::value;
    embedding_forward_kernel<W>
        <<<grid_for(BT * C / W, kBlock), kBlock, 0, ctx.stream>>>(out, tokens, wte, wpe, BT, T_, C, positions);
  });
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C,
                       const GpuContext& ctx) {
  embed_rows(out, tokens, wte, wpe, nullptr, static_cast<int64_t>(B) * T_, T_, C, ctx);
}

template <typename T>
void embedding_forward_at(T* out, const int32_t* tokens, const T* wte, const T* wpe, const int32_t* positions, int rows,
                          int C, const GpuContext& ctx) {
  embed_rows(out, tokens, wte, wpe, positions, rows, 1, C, ctx);
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                        const GpuContext& ctx) {
  if (B == 0 || T_ == 0 || C == 0) return;
  const size_t need = embedding_backward_scratch_bytes(B, T_, C);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "embedding_backward needs ", need,
           " bytes of scratch, ctx has ", ctx.scratch_bytes);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && all_aligned(16, dwte, dwpe, dout);

  const int BT = B * T_;  // fits: checked by the scratch size

  // dwpe: a plain ordered sum over b; none without a position embedding.
  if (dwpe != nullptr) {
    const int64_t TC = static_cast<int64_t>(T_) * C;
    launch_packed<T>(vec, [&](auto w) {
      constexpr int W = decltype(w)::value;
      embedding_backward_wpe_kernel<W><<<grid_for(TC / W, kBlock), kBlock, 0, ctx.stream>>>(dwpe, dout, B, T_, C);
    });
  }

  // dwte: group positions by token with a stable sort, so each token's rows are summed in (b,t) order by
  // one block, without atomics.
  char* s = static_cast<char*>(ctx.scratch);
  const size_t ints = align_up(static_cast<size_t>(BT) * sizeof(int32_t));
  auto* pos = reinterpret_cast<int32_t*>(s);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(s + ints);
  auto* sorted_pos = reinterpret_cast<int32_t*>(s + 2 * ints);
  // The memory plan gave CUB the documented bound (scratch_sizes.h); a CUB that asks for more is refused here, by
  // name, rather than failing inside the sort.
  size_t temp_bytes = need - embedding_sort_temp_offset(B, T_);
  const size_t cub_asks = embedding_sort_temp_bytes(BT);
  ST_CHECK(cub_asks <= temp_bytes, "embedding_backward: CUB's radix sort asks for ", cub_asks,
           " bytes of temporary storage at ", BT, " items, above the planned bound of ", temp_bytes,
           " (cub_sort_pairs_temp_bound)");
  iota_kernel<<<grid_for(BT, kBlock), kBlock, 0, ctx.stream>>>(pos, BT);
  ST_CUDA_CHECK_LAUNCH();
  ST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s + 3 * ints, temp_bytes, tokens, sorted_tokens, pos, sorted_pos, BT, 0,
                                                32, ctx.stream));
  launch_packed<T>(vec, [&](auto w) {
    embedding_backward_wte_kernel<decltype(w)::value>
        <<<BT, kSegmentBlock, 0, ctx.stream>>>(dwte, dout, sorted_tokens, sorted_pos, BT, C);
  });
}

template void embedding_forward_at<float>(float*, const int32_t*, const float*, const float*, const int32_t*, int, int,
                                          const GpuContext&);
template void embedding_forward_at<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, const int32_t*, int, int,
                                         const GpuContext&);
template void embedding_forward_at<fp16>(fp16*, const int32_t*, const fp16*, const fp16*, const int32_t*, int, int,
                                         const GpuContext&);
template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int,
                                       const GpuContext&);
template void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, int, int, int,
                                      const GpuContext&);
template void embedding_forward<fp16>(fp16*, const int32_t*, const fp16*, const fp16*, int, int, int,
                                      const GpuContext&);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int, int, int, const GpuContext&);
template void embedding_backward<bf16>(bf16*, bf16*, const bf16*, const int32_t*, int, int, int, const GpuContext&);
template void embedding_backward<fp16>(fp16*, fp16*, const fp16*, const int32_t*, int, int, int, const GpuContext&);

}  // namespace st::gpu
