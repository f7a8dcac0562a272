// The products of a decoding step (gemv: at most 4 rows, bf16) at a llama's shapes, for each way gemv can run (its
// rows staged in shared memory or not, 16-byte weight packs in flight a lane, in registers or through a shared-memory
// ring, and the cap on its grid in blocks a multiprocessor, 0: a warp for each output column;
// kernels_internal::GemvLaunch),
// against the device's copy bandwidth: microseconds and the weights' GB/s for each product, then a whole step's
// products (layers x (q/k/v, o, gate/up, down) + the classifier) and the tokens/s they alone would allow, fastest
// first.
//
//   ./build/bench_decode_gemv [--hidden 2048] [--qkv 3072] [--ffn 8192] [--vocab 128256] [--layers 16] [--iters 30]
//
// The defaults are Llama-3.2-1B's (q/k/v 2048 + 2 x 512 columns); Llama-3.1-8B: --hidden 4096 --qkv 6144 --ffn 14336
// --layers 32. Each product reads its weights from the next of enough copies to span 1 GiB, so that they come from
// memory and not the L2, as in a step, where the other layers' weights pass through it in between; the rows stay
// cached, as they do there. The products with the RMSNorm folded in (q/k/v, gate/up, classifier) take it; o and down
// take the residual. `down+SwiGLU` is the down projection as the decoder runs it where the rows' SwiGLU fits a block
// (gemv_swiglu, staged whatever the launch says): listed for its rows, not summed into the step, which counts `down`.
// Each timing is the median of `iters` runs of 20 calls back to back (CUDA events), launched as the decoder launches
// them (after their predecessor). Every variant must give the defaults' bits on weights that differ column by column,
// or the bench stops with an error. One GPU, no MPI.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "../src/kernels/gemv.cuh"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/stats.h"

namespace st {
namespace {

constexpr int kCalls = 20;
constexpr int64_t kSpan = int64_t{1} << 30;  // bytes of weight copies a product cycles through
const int kCaps[] = {0, 1, 2, 3, 4, 8};
const int kDepths[] = {8, 4};

// The first copy of a product's weights: bf16 values of either sign in [2^-7, 2^-6), a different sequence in every
// column, so that a column summed against the wrong row, or not at all, shows.
void fill_distinct(bf16* w, int64_t n, cudaStream_t s) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  uint32_t state = 12345;
  for (uint16_t& v : h) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint16_t>(0x3C00u | ((state >> 8) & 0xFFu) | ((state >> 31) << 15));
  }
  ST_CUDA_CHECK(cudaMemcpyAsync(w, h.data(), sizeof(uint16_t) * h.size(), cudaMemcpyHostToDevice, s));
  ST_CUDA_CHECK(cudaStreamSynchronize(s));
}

std::vector<uint16_t> output_bits(const DeviceBuffer<bf16>& out, int64_t n, cudaStream_t s) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  ST_CUDA_CHECK(cudaMemcpyAsync(h.data(), out.data(), sizeof(uint16_t) * h.size(), cudaMemcpyDeviceToHost, s));
  ST_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

std::string describe(const gpu::kernels_internal::GemvLaunch& how) {
  return str_cat(how.staged ? "staged" : "not staged", ", depth ", how.depth, ", cap ", how.blocks_per_sm,
                 how.ring ? ", ring" : "");
}

struct Product {
  const char* name;
  int C, OC;
  bool norm;  // the RMSNorm folded in; else the residual added
  int per_step;
  bool swiglu = false;  // gemv_swiglu: the rows' SwiGLU of [rows, 2C] gate/up rows staged, the residual added
};

void run(int hidden, int qkv, int ffn, int vocab, int layers, int iters) {
  CudaStream stream;
  const cudaStream_t s = stream.get();
  const gpu::GpuContext ctx{s, nullptr, nullptr, 0, nullptr};
  // The ceiling: a device-to-device copy of 1 GiB, its bytes read and written.
  DeviceBuffer<char> a(kSpan), b(kSpan);
  const double copy_ms = bench::median_ms(s, iters, [&] {
    ST_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), static_cast<size_t>(kSpan), cudaMemcpyDeviceToDevice, s));
  });
  const double copy_gbs = 2.0 * static_cast<double>(kSpan) / (copy_ms * 1e6);
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("# %s, %d multiprocessors; device copy %.0f GB/s (1 GiB, read + written)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);
  std::printf("# hidden %d, q/k/v %d, ffn %d, vocabulary %d, %d layers; bf16; medians of %d runs of %d calls\n", hidden,
              qkv, ffn, vocab, layers, iters, kCalls);
  const std::vector<Product> products = {
      {"q/k/v", hidden, qkv, true, layers},       {"o", hidden, hidden, false, layers},
      {"gate/up", hidden, 2 * ffn, true, layers}, {"down", ffn, hidden, false, layers},
      {"classifier", hidden, vocab, true, 1},     {"down+SwiGLU", ffn, hidden, false, 0, true},
  };
  const int max_in = std::max(hidden, ffn), max_out = std::max({qkv, 2 * ffn, vocab, hidden});
  const DeviceBuffer<bf16> x = bench::random_device<bf16>(int64_t{4} * max_in, 1);
  const DeviceBuffer<bf16> gate_up = bench::random_device<bf16>(int64_t{4} * 2 * ffn, 4);
  const DeviceBuffer<bf16> g = bench::random_device<bf16>(max_in, 2, 0.1, 1.0);
  const DeviceBuffer<bf16> res = bench::random_device<bf16>(int64_t{4} * max_out, 3);
  DeviceBuffer<bf16> out(int64_t{4} * max_out);
  std::printf("%-5s %-11s %-7s %-6s %-4s %-5s %10s %9s %7s\n", "rows", "product", "staged", "depth", "cap", "ring",
              "us/call", "GB/s", "x copy");
  struct Step {
    int rows;
    gpu::kernels_internal::GemvLaunch how;
    double us;
  };
  std::vector<Step> steps;
  double step_bytes = 0;
  for (int rows : {1, 4}) {
    std::vector<Step> row_steps;
    for (bool ring : {false, true})
      for (bool staged : {false, true})
        for (int depth : kDepths)
          for (int cap : kCaps) row_steps.push_back({rows, {cap, depth, staged, ring}, 0.0});
    step_bytes = 0;
    for (const Product& p : products) {
      if (p.swiglu && !gpu::kernels_internal::gemv_stage_fits<bf16>(rows, p.C)) continue;  // the two kernels run
      const int64_t elems = int64_t{p.C} * p.OC, bytes = elems * static_cast<int64_t>(sizeof(bf16));
      const int64_t copies = std::max<int64_t>(1, kSpan / bytes);
      DeviceBuffer<bf16> w(copies * elems);
      ST_CUDA_CHECK(cudaMemsetAsync(w.data(), 0x3C, static_cast<size_t>(w.bytes()), s));  // 0x3C3C: 0.0115
      fill_distinct(w.data(), elems, s);
      step_bytes += static_cast<double>(bytes) * p.per_step;
      auto call = [&](int64_t copy, const gpu::kernels_internal::GemvLaunch& how) {
        if (p.swiglu)
          gpu::kernels_internal::gemv_swiglu<bf16>(out.data(), gate_up.data(), w.data() + copy * elems, nullptr,
                                                   res.data(), rows, p.C, p.OC, ctx, how);
        else
          gpu::kernels_internal::gemv<bf16>(out.data(), x.data(), p.norm ? g.data() : nullptr, 1e-5f,
                                            w.data() + copy * elems, nullptr, p.norm ? nullptr : res.data(), rows, p.C,
                                            p.OC, ctx, how);
      };
      call(0, {});
      const std::vector<uint16_t> want = output_bits(out, int64_t{rows} * p.OC, s);
      for (Step& st : row_steps) {
        // Every variant sums each column's products in the same order: the same bits as the defaults, over an output
        // poisoned first, so that a column a variant leaves unwritten shows.
        ST_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xFF, static_cast<size_t>(out.bytes()), s));
        call(0, st.how);
        ST_CHECK(output_bits(out, int64_t{rows} * p.OC, s) == want, "bench_decode_gemv: ", p.name, " ",
                 describe(st.how), ", ", rows, " rows, differs from the defaults");
        int64_t next = 0;
        const double ms = bench::median_ms(s, iters, [&] {
          for (int i = 0; i < kCalls; ++i, next = (next + 1) % copies) call(next, st.how);
        });
        const double us = ms * 1e3 / kCalls, gbs = static_cast<double>(bytes) / (us * 1e3);
        st.us += us * p.per_step;
        const bool staged =
            p.swiglu || (st.how.staged && gpu::kernels_internal::gemv_stage_fits<bf16>(rows, p.C));  // as it ran
        std::printf("%-5d %-11s %-7s %-6d %-4d %-5s %10.2f %9.0f %7.2f\n", rows, p.name, staged ? "yes" : "no",
                    st.how.depth, st.how.blocks_per_sm, st.how.ring ? "yes" : "no", us, gbs, gbs / copy_gbs);
      }
    }
    std::sort(row_steps.begin(), row_steps.end(), [](const Step& a, const Step& b) { return a.us < b.us; });
    steps.insert(steps.end(), row_steps.begin(), row_steps.end());
  }
  std::printf("\n# a step's products (%.2f GB of weights), fastest first\n", step_bytes / 1e9);
  std::printf("%-5s %-7s %-6s %-4s %-5s %10s %9s %7s %s\n", "rows", "staged", "depth", "cap", "ring", "us/step", "GB/s",
              "x copy", "tokens/s a sequence from the products alone");
  for (const Step& st : steps) {
    const double gbs = step_bytes / (st.us * 1e3);
    std::printf("%-5d %-7s %-6d %-4d %-5s %10.1f %9.0f %7.2f %.0f\n", st.rows, st.how.staged ? "yes" : "no",
                st.how.depth, st.how.blocks_per_sm, st.how.ring ? "yes" : "no", st.us, gbs, gbs / copy_gbs,
                1e6 / st.us);
  }
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_decode_gemv", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int hidden = 2048, qkv = 3072, ffn = 8192, vocab = 128256, layers = 16, iters = 30;
    st::bench::parse_int_flags(argc, argv, "bench_decode_gemv",
                               {{"--hidden", &hidden},
                                {"--qkv", &qkv},
                                {"--ffn", &ffn},
                                {"--vocab", &vocab},
                                {"--layers", &layers},
                                {"--iters", &iters}});
    if (hidden < 1 || qkv < 1 || ffn < 1 || vocab < 1 || layers < 1 || iters < 1)
      ST_BAD_INPUT("bench_decode_gemv: every flag must be >= 1; got --hidden ", hidden, " --qkv ", qkv, " --ffn ", ffn,
                   " --vocab ", vocab, " --layers ", layers, " --iters ", iters);
    st::run(hidden, qkv, ffn, vocab, layers, iters);
#endif
  });
}
