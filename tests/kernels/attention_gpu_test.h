// Shared by the attention kernels' GPU tests (flash_attention_gpu_test.cc, cudnn_attention_gpu_test.cc,
// attention_gqa_gpu_test.cc): the shape with its tensor sizes, the comparison rule, the q/k/v split of a qkv
// tensor, a double-precision logsumexp reference and the CPU problem (inputs and st::attention_* results) each GPU
// run is checked against.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/attention.h"

namespace st::test {

// max |got - want| <= rtol * max |want|: the attention kernels' products consume P and dS rounded to T, whose
// error scales with the terms rather than with the result.
inline ::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  double amax = 0;
  for (float w : want) amax = std::max(amax, std::fabs(static_cast<double>(w)));
  return all_close(got, want, rtol, amax);
}

// Causal self-attention over qkv [B,T,(NH+2 NKV) hs] with NH query heads of size hs = C / NH and NKV key/value
// heads (NKV = 0: NH, qkv [B,T,3C]); query head h reads K/V head h / (NH/NKV).
struct AttentionShape {
  int B, T, C, NH;
  int NKV = 0;
  int kv() const { return NKV > 0 ? NKV : NH; }
  int hs() const { return C / NH; }
  int64_t ld() const { return static_cast<int64_t>(NH + 2 * kv()) * hs(); }  // qkv's row stride
  int64_t qkv_size() const { return static_cast<int64_t>(B) * T * ld(); }
  int64_t out_size() const { return static_cast<int64_t>(B) * T * C; }
  int64_t att_size() const { return static_cast<int64_t>(B) * NH * T * T; }
  int64_t lse_size() const { return static_cast<int64_t>(B) * NH * T; }
};

inline std::ostream& operator<<(std::ostream& os, const AttentionShape& s) {
  return os << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " NKV=" << s.kv() << " hs=" << s.hs();
}

// The q (which = 0), k or v part of a qkv tensor: their gradients differ in scale, so each is compared against
// its own magnitude.
inline std::vector<float> part(const std::vector<float>& qkv, int which, const AttentionShape& s) {
  const int64_t kv_width = static_cast<int64_t>(s.kv()) * s.hs();
  const int64_t offset = which == 0 ? 0 : s.C + (which - 1) * kv_width;
  const int64_t width = which == 0 ? s.C : kv_width;
  std::vector<float> x;
  x.reserve(static_cast<size_t>(s.B) * s.T * width);
  for (int64_t row = 0; row < static_cast<int64_t>(s.B) * s.T; ++row) {
    const auto first = qkv.begin() + row * s.ld() + offset;
    x.insert(x.end(), first, first + width);
  }
  return x;
}

// lse[b,h,i] = log sum_{j<=i} exp(q_i.k_j / sqrt(hs)), from scores computed in double.
inline std::vector<float> cpu_lse(const std::vector<float>& qkv, const AttentionShape& s) {
  const int hs = s.hs();
  const int64_t C3 = s.ld();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<float> lse(s.lse_size());
  std::vector<double> sc(s.T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const float* q = qkv.data() + static_cast<int64_t>(b) * s.T * C3 + h * hs;
      const float* k = qkv.data() + static_cast<int64_t>(b) * s.T * C3 + s.C + (h / (s.NH / s.kv())) * hs;
      for (int i = 0; i < s.T; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += static_cast<double>(q[i * C3 + d]) * k[j * C3 + d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(sc[j] - mx);
        lse[(static_cast<int64_t>(b) * s.NH + h) * s.T + i] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
  return lse;
}

// The gradient dqkv0 the CPU backward starts from: zero, which is what a backward that overwrites dqkv must
// produce, or random at about the gradients' scale (normals * 0.1), which one that accumulates must add to.
enum class InitialGrad { kZero, kRandom };

// Inputs (rounded through T) and the CPU results on them. qkv, dout and a random dqkv0 are drawn from the
// random streams first_stream, first_stream + 1 and first_stream + 2.
template <typename T>
struct AttentionProblem {
  AttentionProblem(const AttentionShape& s, uint64_t first_stream, InitialGrad initial_grad)
      : qkv(random_input<T>(s.qkv_size(), first_stream)),
        dout(random_input<T>(s.out_size(), first_stream + 1)),
        dqkv0(initial_grad == InitialGrad::kRandom ? random_input<T>(s.qkv_size(), first_stream + 2, 0.1f)
                                                   : std::vector<float>(s.qkv_size(), 0.0f)),
        out(s.out_size()),
        att(s.att_size()),
        lse(cpu_lse(qkv, s)),
        dqkv(dqkv0) {
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  }
  std::vector<float> qkv, dout, dqkv0;
  std::vector<float> out, att, lse, dqkv;  // CPU results
};

}  // namespace st::test
