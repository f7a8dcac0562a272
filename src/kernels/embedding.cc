#include "shardtrain/kernels/embedding.h"

#include <algorithm>

#include "parallel.h"

namespace st {

using kernels_internal::kMinParallelWork;

namespace {
// Backward parallelises over blocks of columns: every output element is then summed by exactly one thread
// in (b, t) order, so the result does not depend on the thread count and needs no atomics.
constexpr int kColBlock = 32;
}  // namespace

namespace {

// positions: each row's own (null: row % T).
void embed(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
           const int32_t* positions) {
  const int64_t BT = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (BT * C >= kMinParallelWork)
  for (int64_t bt = 0; bt < BT; ++bt) {
    const int64_t t = positions != nullptr ? std::max<int64_t>(positions[bt], 0) : bt % T;  // idle rows: position 0
    float* o = out + bt * C;
    const float* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    if (wpe == nullptr) {
      std::copy(e, e + C, o);
      continue;
    }
    const float* p = wpe + t * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  embed(out, tokens, wte, wpe, B, T, C, nullptr);
}

void embedding_forward_at(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          const int32_t* positions, int rows, int C) {
  embed(out, tokens, wte, wpe, 1, rows, C, positions);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
  const int64_t work = static_cast<int64_t>(B) * T * C;
#pragma omp parallel for schedule(static) if (work >= kMinParallelWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kColBlock;
    const int c1 = std::min(C, c0 + kColBlock);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const int64_t bt = static_cast<int64_t>(b) * T + t;
        const float* d = dout + bt * C;
        float* gw = dwte + static_cast<int64_t>(tokens[bt]) * C;
        for (int c = c0; c < c1; ++c) gw[c] += d[c];
        if (dwpe == nullptr) continue;
        float* gp = dwpe + static_cast<int64_t>(t) * C;
        for (int c = c0; c < c1; ++c) gp[c] += d[c];
      }
    }
  }
}

}  // namespace st
