#include "shardtrain/model/classifier.h"

#include <algorithm>

#include "shardtrain/kernels/matmul.h"
#include "shardtrain/kernels/softmax_cross_entropy.h"

namespace st {
namespace {
constexpr int64_t kLogitsChunkElems = int64_t{8} << 20;
}  // namespace

int64_t classifier_chunk_rows(int64_t N, int64_t Vp) {
  return std::max<int64_t>(1, std::min<int64_t>(N, kLogitsChunkElems / Vp));
}

double chunked_classifier(const float* x, const float* w, const int32_t* targets, int64_t N, int C, int V, int Vp,
                          float dloss, float* chunk, float* losses, float* dx, float* dw) {
  const bool backward = dx != nullptr;
  const int64_t chunk_rows = classifier_chunk_rows(N, Vp);
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, N - r0);
    matmul_forward(chunk, x + r0 * C, w, nullptr, rows, C, Vp);
    softmax_cross_entropy(losses + r0, backward ? chunk : nullptr, chunk, targets + r0, rows, V, Vp, dloss);
    if (backward) matmul_backward(dx + r0 * C, dw, nullptr, chunk, x + r0 * C, w, rows, C, Vp);
  }
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += losses[i];  // a row that is not a target adds its 0
  return sum;
}

}  // namespace st
