#include "shardtrain/model/cuda_linear.h"

#include <algorithm>
#include <optional>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/fp8.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {
namespace {

// The policy groups an operand by the rows of the GEMM's operand as cast (x or W per row; a matrix cast transposed
// per column): per-row scales, cuBLASLt's outer-vector mode, wherever the recipe groups at all.
bool per_row(const Fp8Operand& op) { return op.scaling != Fp8Scaling::kTensor; }

// A site's kept maxima (Fp8Workspace::kMaximaPerSite): x's, W's and dy's, in that order.
constexpr int64_t kKeptPerSite = Fp8Workspace::kMaximaPerSite;
int64_t input_offset(LinearInput input) { return input == LinearInput::kX ? 0 : 2; }
// A site's handed-out slots: x's and dy's.
constexpr int64_t kHandedPerSite = 2;
int64_t handed_offset(LinearInput input) { return input == LinearInput::kX ? 0 : 1; }

}  // namespace

template <typename T>
CudaLinear<T>::CudaLinear(const Fp8Policy& policy, const ModelConfig& cfg, int64_t max_rows)
    : policy_(policy), workspace_(fp8_workspace(cfg, max_rows, policy)) {
  if (workspace_.a == 0) return;
  ST_CHECK((std::is_same_v<T, float> || std::is_same_v<T, bf16>),
           "train.fp8 computes in bf16 or fp32 (its GEMMs write those types)");  // the config refuses fp16 first
  codes_bytes_ = workspace_.region_bytes();
  a_scales_ = DeviceBuffer<float>(workspace_.groups);
  b_scales_ = DeviceBuffer<float>(workspace_.groups);
  t_scales_ = DeviceBuffer<float>(workspace_.groups);
  maxima_ = DeviceBuffer<unsigned char>(static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * workspace_.groups)));
  weights_ = block_linear_shapes(cfg);
  n_layer_ = cfg.n_layer;
  // x is cast row-major forward (forward.a) and transposed for the weight gradient (weight_grad.b); W row-major
  // forward (forward.b) and transposed for the input gradient (input_grad.b); dy row-major for the input gradient
  // (input_grad.a) and transposed for the weight gradient (weight_grad.a). Groups are x's (W's, dy's) in both layouts.
  keep_ = fp8_kept_maxima(policy);
  if (workspace_.kept_maxima > 0) {
    kept_ = DeviceBuffer<unsigned>(workspace_.kept_maxima);
    handed_.assign(static_cast<size_t>(workspace_.kept_maxima / kKeptPerSite * kHandedPerSite), 0);
  }
  if (workspace_.input_scales > 0) input_scales_ = DeviceBuffer<float>(workspace_.input_scales);
  if (policy.delayed())
    history_ = std::make_unique<CudaFp8History>(int64_t{n_layer_} * static_cast<int64_t>(weights_.size()),
                                                policy.amax_history);
}

template <typename T>
int64_t CudaLinear<T>::site_index(LinearSite site) const {
  return fp8_site_index(weights_, n_layer_, site);
}

template <typename T>
typename CudaLinear<T>::Maxima CudaLinear<T>::kept(LinearSite site, bool weight, bool taken) {
  if (site.layer < 0 || !(weight ? keep_.w : keep_.x)) return {};
  const int64_t index = site_index(site);
  return {kept_.data() + index * kKeptPerSite + (weight ? 1 : 0), taken,
          history_ ? fp8_history_index(index, weight ? kFp8W : kFp8X) : -1};
}

template <typename T>
typename CudaLinear<T>::Maxima CudaLinear<T>::dy_maxima(LinearSite site, bool produced) {
  if (history_ && site.layer >= 0) return {dy_slot(site), produced, fp8_history_index(site_index(site), kFp8Dy)};
  return produced ? Maxima{dy_slot(site), true} : Maxima{};
}

template <typename T>
const unsigned* CudaLinear<T>::applied(const Maxima& m, const gpu::GpuContext& ctx) {
  return m.history >= 0 && history_->recording() ? history_->pick(m.history, m.at, ctx) : m.at;
}

template <typename T>
bool CudaLinear<T>::ahead(const Maxima& m, const Fp8Operand& op) const {
  return m.at != nullptr && !m.taken && m.history >= 0 && history_->recording() && history_->filled() > 0 &&
         policy_.fuse_casts && !policy_.power_of_2 && op.scaling == Fp8Scaling::kTensor;
}

template <typename T>
void CudaLinear<T>::cast_ahead(const T* x, int64_t rows, int64_t cols, Fp8Format format, const Maxima& m, uint8_t* q,
                               uint8_t* q_t, float* inverse_scale, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CUDA_CHECK(cudaMemsetAsync(m.at, 0, sizeof(unsigned), ctx.stream));  // the cast folds x's maximum in from 0
    gpu::fp8_quantize_ahead_async<T>(x, rows, cols, format, history_->history_max() + m.history, q, q_t, inverse_scale,
                                     m.at, with_maxima(ctx));
    history_->pick(m.history, m.at, ctx);  // records it
  }
}

template <typename T>
unsigned* CudaLinear<T>::dy_slot(LinearSite site) {
  return kept_.data() + site_index(site) * kKeptPerSite + input_offset(LinearInput::kDy);
}

template <typename T>
typename CudaLinear<T>::Slot CudaLinear<T>::input_codes(LinearSite site, uint8_t* codes, int64_t N, int C) {
  ST_CHECK(site.layer >= 0 && input_scales_.size() > 0, "CudaLinear: x^T's codes kept at a site that keeps none ",
           "(unnamed, or a policy without keep_input_codes)");
  return {codes, N * C, input_scales_.data() + site_index(site) * Fp8Workspace::kInputScaleStride, 1};
}

template <typename T>
bool CudaLinear<T>::takes_input_maxima(LinearSite site, LinearInput input) const {
  if (!policy_.producer_maxima || site.layer < 0 || codes_bytes_ == 0) return false;
  if (!(input == LinearInput::kX ? keep_.x : keep_.dy)) return false;
  const LinearShape& l = weights_[static_cast<size_t>(site_index(site) % static_cast<int64_t>(weights_.size()))];
  return policy_.applies(l.in, l.out);
}

template <typename T>
unsigned* CudaLinear<T>::input_maxima(LinearSite site, LinearInput input, const gpu::GpuContext& ctx) {
  if (!takes_input_maxima(site, input)) return nullptr;
  const int64_t index = site_index(site);
  unsigned* const at = kept_.data() + index * kKeptPerSite + input_offset(input);
  // The producer folds its blocks' maxima in with atomicMax: from 0, as fp8_maxima_async starts its own.
  ST_CUDA_CHECK(cudaMemsetAsync(at, 0, sizeof(unsigned), ctx.stream));
  handed_[static_cast<size_t>(index * kHandedPerSite + handed_offset(input))] = 1;
  return at;
}

template <typename T>
bool CudaLinear<T>::produced(LinearSite site, LinearInput input) {
  if (site.layer < 0 || handed_.empty()) return false;
  char& handed = handed_[static_cast<size_t>(site_index(site) * kHandedPerSite + handed_offset(input))];
  const bool was = handed != 0;
  handed = 0;
  return was;
}

template <typename T>
typename CudaLinear<T>::Slots CudaLinear<T>::slots(const gpu::GpuContext& ctx) {
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= static_cast<size_t>(codes_bytes_), "train.fp8's codes need ",
           codes_bytes_, " bytes of the model's kernel scratch, the context has ", ctx.scratch_bytes);
  auto* base = static_cast<uint8_t*>(ctx.scratch);
  const Fp8Workspace& w = workspace_;
  return {{base, w.a, a_scales_.data(), w.groups},
          {base + w.b_offset(), w.b, b_scales_.data(), w.groups},
          {base + w.t_offset(), w.t, t_scales_.data(), w.groups}};
}

template <typename T>
gpu::GpuContext CudaLinear<T>::with_maxima(const gpu::GpuContext& ctx) {
  gpu::GpuContext c = ctx;
  c.scratch = maxima_.data();
  c.scratch_bytes = maxima_.bytes();
  return c;
}

template <typename T>
gpu::GpuContext CudaLinear<T>::without_scratch(const gpu::GpuContext& ctx) {
  gpu::GpuContext c = ctx;
  c.scratch = nullptr;
  c.scratch_bytes = 0;
  return c;
}

template <typename T>
void CudaLinear<T>::cast(const Fp8Source& src, const Fp8Operand& op, const Slot& slot, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const int64_t rows = src.rows, cols = src.cols;
    ST_CHECK(rows * cols <= slot.capacity && fp8_groups(op.scaling, rows, cols) <= slot.groups, "FP8 cast of ", rows,
             " x ", cols, " past the workspace sized for ", slot.capacity, " codes");
    const gpu::GpuContext c = with_maxima(ctx);
    if (src.maxima.at == nullptr) {
      gpu::fp8_quantize_matrix_async<T>(src.x, rows, cols, op.format, op.scaling, policy_.power_of_2, src.layout,
                                        slot.codes, slot.inverse_scales, c);
      return;
    }
    if (ahead(src.maxima, op)) {
      const bool transposed = src.layout == Fp8Layout::kTransposed;
      cast_ahead(src.x, rows, cols, op.format, src.maxima, transposed ? nullptr : slot.codes,
                 transposed ? slot.codes : nullptr, slot.inverse_scales, ctx);
      return;
    }
    if (!src.maxima.taken) gpu::fp8_maxima_async<T>(src.x, rows, cols, op.scaling, src.maxima.at, c);
    gpu::fp8_quantize_with_maxima_async<T>(src.x, rows, cols, op.format, op.scaling, policy_.power_of_2, src.layout,
                                           applied(src.maxima, ctx), slot.codes, slot.inverse_scales, c);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::pair_cast(const T* x, int64_t rows, int64_t cols, const Fp8Operand& row_major,
                              const Fp8Operand& transposed, const Slot& row, const Slot& tr, Maxima maxima,
                              const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CHECK(rows * cols <= std::min(row.capacity, tr.capacity), "FP8 cast of ", rows, " x ", cols,
             " past the workspace sized for ", std::min(row.capacity, tr.capacity), " codes");
    const Fp8Cast a{row_major.format, row_major.scaling, row.codes, row.inverse_scales};
    const Fp8Cast b{transposed.format, transposed.scaling, tr.codes, tr.inverse_scales};
    const gpu::GpuContext c = with_maxima(ctx);
    if (maxima.at == nullptr) {
      gpu::fp8_quantize_pair_async<T>(x, rows, cols, policy_.power_of_2, a, b, c);
      return;
    }
    if (ahead(maxima, row_major) && ahead(maxima, transposed) && row_major.format == transposed.format) {
      cast_ahead(x, rows, cols, row_major.format, maxima, row.codes, tr.codes, row.inverse_scales, ctx);
      if (tr.inverse_scales != row.inverse_scales)
        ST_CUDA_CHECK(cudaMemcpyAsync(tr.inverse_scales, row.inverse_scales, sizeof(float), cudaMemcpyDeviceToDevice,
                                      ctx.stream));
      return;
    }
    if (!maxima.taken) gpu::fp8_maxima_async<T>(x, rows, cols, row_major.scaling, maxima.at, c);
    gpu::fp8_quantize_pair_with_maxima_async<T>(x, rows, cols, policy_.power_of_2, a, b, applied(maxima, ctx), c);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::fp8_product(const Fp8Gemm& g, const Fp8Source& a, const Fp8Source& b, const Slot& sa,
                                const Slot& sb, T* out, int64_t ldo, GradWrite write, const gpu::GpuContext& ctx,
                                OpTimer::Laps* lap, bool backward, const T* bias, const T* residual, bool a_cast,
                                bool b_cast) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lap) (*lap)(backward ? "bwd.fp8_cast" : "fwd.fp8_cast");
    if (!a_cast) cast(a, g.a, sa, ctx);
    if (!b_cast) cast(b, g.b, sb, ctx);
    if (lap) (*lap)(backward ? "bwd.fp8_gemm" : "fwd.fp8_gemm");
    // The GEMM's depth k: the operand's columns as cast, the source's rows when transposed.
    const int64_t m = a.gemm_rows(), n = b.gemm_rows(), k = a.gemm_depth();
    gpu::fp8_gemm<T>(out, ldo, write, {sa.codes, k, g.a.format, sa.inverse_scales, per_row(g.a)},
                     {sb.codes, k, g.b.format, sb.inverse_scales, per_row(g.b)}, m, n, k, without_scratch(ctx), bias,
                     residual, g.fast_accum);
  }
}

template <typename T>
bool CudaLinear<T>::start_forward(LinearSite site, int C, int OC, const uint8_t* x_t_codes) {
  ST_CHECK(x_t_codes == nullptr || (policy_.keeps_input_codes(C, OC) && codes_bytes_ > 0),
           "CudaLinear: x^T's codes asked of a ", C, " -> ", OC, " layer whose policy keeps none");
  return produced(site, LinearInput::kX);
}

template <typename T>
void CudaLinear<T>::forward(T* out, const T* inp, const T* w, const T* bias, const T* residual, int64_t N, int C,
                            int OC, const gpu::GpuContext& ctx, OpTimer::Laps* lap, LinearSite site,
                            uint8_t* x_t_codes) {
  const bool x_produced = start_forward(site, C, OC, x_t_codes);
  if (!policy_.applies(C, OC) || codes_bytes_ == 0) {
    if (residual)
      gpu::matmul_forward_residual<T>(out, inp, w, bias, residual, N, C, OC, ctx);
    else
      gpu::matmul_forward<T>(out, inp, w, bias, N, C, OC, ctx);
    return;
  }
  const Slots s = slots(ctx);
  const Fp8Source x{inp, N, C, Fp8Layout::kRowMajor, kept(site, false, x_produced)};
  const bool x_cast = x_t_codes != nullptr;
  if (x_cast) {  // x for this GEMM and x^T for the backward's weight gradient from one read, with x's maximum
    if (lap) (*lap)("fwd.fp8_cast");
    pair_cast(inp, N, C, policy_.forward.a, policy_.weight_grad.b, s.a, input_codes(site, x_t_codes, N, C), x.maxima,
              ctx);
  }
  if (policy_.weights_cast) {  // W's codes and inverse scale are the weight's buffer (dist.fp8_gather)
    fp8_product(policy_.forward, x, {w, OC, C, Fp8Layout::kRowMajor}, s.a, weight_codes(w, OC, C), out, OC,
                GradWrite::kOverwrite, ctx, lap, false, bias, residual, x_cast, true);
    return;
  }
  fp8_product(policy_.forward, x, {w, OC, C, Fp8Layout::kRowMajor, kept(site, true, false)}, s.a, s.b, out, OC,
              GradWrite::kOverwrite, ctx, lap, false, bias, residual, x_cast);
}

template <typename T>
void CudaLinear<T>::forward_without_output(const T* inp, const T* w, int64_t N, int C, int OC,
                                           const gpu::GpuContext& ctx, OpTimer::Laps* lap, LinearSite site,
                                           uint8_t* x_t_codes) {
  const bool x_produced = start_forward(site, C, OC, x_t_codes);
  if (!policy_.applies(C, OC) || codes_bytes_ == 0) return;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lap) (*lap)("fwd.fp8_cast");
    const Maxima x = kept(site, false, x_produced);
    if (x_t_codes != nullptr)  // the pair cast's x^T half: the same maximum, scale and codes
      cast({inp, N, C, Fp8Layout::kTransposed, x}, policy_.weight_grad.b, input_codes(site, x_t_codes, N, C), ctx);
    else if (x.at != nullptr && !x.taken)
      gpu::fp8_maxima_async<T>(inp, N, C, policy_.forward.a.scaling, x.at, with_maxima(ctx));
    const Maxima wm = kept(site, true, false);
    if (wm.at != nullptr && !policy_.weights_cast)
      gpu::fp8_maxima_async<T>(w, OC, C, policy_.forward.b.scaling, wm.at, with_maxima(ctx));
  }
}

template <typename T>
std::optional<typename CudaLinear<T>::FusedInput> CudaLinear<T>::fused_input(LinearSite site, int64_t N, int C, int OC,
                                                                             uint8_t* x_t_codes,
                                                                             const gpu::GpuContext& ctx) {
  if (!history_ || !history_->recording() || !policy_.fuse_casts || history_->filled() == 0 || site.layer < 0 ||
      codes_bytes_ == 0 || policy_.power_of_2 || !policy_.keeps_input_codes(C, OC) ||
      policy_.forward.a.format != policy_.weight_grad.b.format)
    return std::nullopt;
  start_forward(site, C, OC, x_t_codes);
  const Slots s = slots(ctx);
  ST_CHECK(N * C <= s.a.capacity, "FP8 codes of ", N, " x ", C, " past the workspace sized for ", s.a.capacity);
  const int64_t index = site_index(site);
  unsigned* const own = kept_.data() + index * kKeptPerSite + input_offset(LinearInput::kX);
  ST_CUDA_CHECK(cudaMemsetAsync(own, 0, sizeof(unsigned), ctx.stream));  // the producer folds its blocks' in
  float* const inverse = x_t_codes != nullptr ? input_codes(site, x_t_codes, N, C).inverse_scales : s.a.inverse_scales;
  return FusedInput{s.a.codes,
                    x_t_codes,
                    inverse,
                    own,
                    history_->history_max() + fp8_history_index(index, kFp8X),
                    policy_.forward.a.format};
}

template <typename T>
void CudaLinear<T>::record_fused_x(LinearSite site, const gpu::GpuContext& ctx) {
  const int64_t index = site_index(site);
  history_->pick(fp8_history_index(index, kFp8X), kept_.data() + index * kKeptPerSite + input_offset(LinearInput::kX),
                 ctx);
}

template <typename T>
void CudaLinear<T>::forward_fused(T* out, const T* w, const T* bias, const T* residual, int64_t N, int C, int OC,
                                  const gpu::GpuContext& ctx, OpTimer::Laps* lap, LinearSite site, uint8_t* x_t_codes) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const Slots s = slots(ctx);
    // x's codes in slot a, with the inverse scale fused_input named.
    const Slot x{s.a.codes, s.a.capacity,
                 x_t_codes != nullptr ? input_codes(site, x_t_codes, N, C).inverse_scales : s.a.inverse_scales, 1};
    record_fused_x(site, ctx);
    if (policy_.weights_cast) {  // W's codes and inverse scale are the weight's buffer (dist.fp8_gather)
      fp8_product(policy_.forward, {nullptr, N, C, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kRowMajor}, x,
                  weight_codes(w, OC, C), out, OC, GradWrite::kOverwrite, ctx, lap, false, bias, residual,
                  /*a_cast=*/true, /*b_cast=*/true);
      return;
    }
    fp8_product(policy_.forward, {nullptr, N, C, Fp8Layout::kRowMajor},
                {w, OC, C, Fp8Layout::kRowMajor, kept(site, true, false)}, x, s.b, out, OC, GradWrite::kOverwrite, ctx,
                lap, false, bias, residual, /*a_cast=*/true);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::forward_fused_without_output(const T* w, int64_t N, int C, int OC, const gpu::GpuContext& ctx,
                                                 OpTimer::Laps* lap, LinearSite site) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lap) (*lap)("fwd.fp8_cast");
    record_fused_x(site, ctx);
    const Maxima wm = kept(site, true, false);
    if (wm.at != nullptr && !policy_.weights_cast)
      gpu::fp8_maxima_async<T>(w, OC, C, policy_.forward.b.scaling, wm.at, with_maxima(ctx));
  }
}

template <typename T>
std::optional<typename CudaLinear<T>::FusedInput> CudaLinear<T>::fused_output_grad(LinearSite site, int64_t N, int C,
                                                                                   int OC, const gpu::GpuContext& ctx) {
  if (!history_ || !policy_.fuse_casts || history_->filled() == 0 || site.layer < 0 || codes_bytes_ == 0 ||
      policy_.power_of_2 || !policy_.applies(C, OC) || !policy_.weight_grad_applies(N) || !keep_.dy ||
      policy_.input_grad.a.format != policy_.weight_grad.a.format)
    return std::nullopt;
  const Slots s = slots(ctx);
  ST_CHECK(N * OC <= std::min(s.a.capacity, s.t.capacity), "FP8 codes of ", N, " x ", OC,
           " past the workspace sized for ", std::min(s.a.capacity, s.t.capacity));
  unsigned* const own = dy_slot(site);
  ST_CUDA_CHECK(cudaMemsetAsync(own, 0, sizeof(unsigned), ctx.stream));  // the producer folds its blocks' in
  return FusedInput{s.a.codes,
                    s.t.codes,
                    s.a.inverse_scales,
                    own,
                    history_->history_max() + fp8_history_index(site_index(site), kFp8Dy),
                    policy_.input_grad.a.format};
}

template <typename T>
void CudaLinear<T>::backward_fused(T* dinp, T* dweight, const T* inp, const T* w, int64_t N, int C, int OC,
                                   const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write,
                                   OpTimer::Laps* lap, LinearSite site, const uint8_t* x_t_codes) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const Slots s = slots(ctx);
    history_->pick(fp8_history_index(site_index(site), kFp8Dy), dy_slot(site), ctx);  // records dy's maximum
    // dy's codes in slot a and dy^T's in slot t, with the one inverse scale the producer wrote.
    const Slot dy{s.a.codes, s.a.capacity, s.a.inverse_scales, 1}, dy_t{s.t.codes, s.t.capacity, s.a.inverse_scales, 1};
    const bool codes_kept = x_t_codes != nullptr;
    const Slot x_slot = codes_kept ? input_codes(site, const_cast<uint8_t*>(x_t_codes), N, C) : s.b;
    const Fp8Source w_t{w, OC, C, Fp8Layout::kTransposed, kept(site, true, true)};
    const Fp8Source x_t{inp, N, C, Fp8Layout::kTransposed, kept(site, false, true)};
    // With the weights cast (dist.fp8_gather), W^T is W's codes transposed, with W's inverse scale.
    const Slot w_slot = policy_.weights_cast ? transposed_weight(w, OC, C, s.b, ctx) : s.b;
    fp8_product(policy_.input_grad, {nullptr, N, OC, Fp8Layout::kRowMajor}, w_t, dy, w_slot, dinp, C, dinp_write, ctx,
                lap, true, nullptr, nullptr, /*a_cast=*/true, /*b_cast=*/policy_.weights_cast);
    fp8_product(policy_.weight_grad, {nullptr, N, OC, Fp8Layout::kTransposed}, x_t, dy_t, x_slot, dweight, C,
                param_write, ctx, lap, true, nullptr, nullptr, /*a_cast=*/true, codes_kept);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
typename CudaLinear<T>::Slot CudaLinear<T>::weight_codes(const T* w, int OC, int C) const {
  const int64_t n = int64_t{OC} * C;
  uint8_t* codes = fp8_weight_codes(w, n, sizeof(T));
  ST_CHECK(codes != nullptr, "CudaLinear: a cast ", OC, " x ", C, " weight without room for its codes");
  return {codes, n, reinterpret_cast<float*>(codes + n), 1};
}

template <typename T>
typename CudaLinear<T>::Slot CudaLinear<T>::transposed_weight(const T* w, int OC, int C, const Slot& b,
                                                              const gpu::GpuContext& ctx) {
  const Slot codes = weight_codes(w, OC, C);
  ST_CHECK(codes.capacity <= b.capacity, "FP8 transpose of ", OC, " x ", C, " past the workspace sized for ",
           b.capacity, " codes");
  gpu::fp8_transpose(codes.codes, OC, C, b.codes, ctx);
  return {b.codes, b.capacity, codes.inverse_scales, 1};
}

template <typename T>
void CudaLinear<T>::backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int C,
                             int OC, const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write,
                             OpTimer::Laps* lap, LinearSite site, const uint8_t* x_t_codes) {
  const bool dy_produced = produced(site, LinearInput::kDy);
  if (!policy_.applies(C, OC) || codes_bytes_ == 0) {
    ST_CHECK(x_t_codes == nullptr, "CudaLinear: x^T's codes given to a layer outside FP8");
    gpu::matmul_backward<T>(dinp, dweight, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
    return;
  }
  const bool fp8_dweight = dweight && policy_.weight_grad_applies(N);
  const bool codes_kept = x_t_codes != nullptr;
  ST_CHECK(!codes_kept || !dweight || fp8_dweight, "CudaLinear: a weight gradient over ", N,
           " tokens runs in the compute type and reads x, of which the forward kept only x^T's codes (they serve ",
           "token counts that are multiples of 16)");
  const Slots s = slots(ctx);
  // x^T as its GEMM reads it: the forward's codes, read in place, or cast into slot b.
  const Slot x_slot = codes_kept ? input_codes(site, const_cast<uint8_t*>(x_t_codes), N, C) : s.b;
  // W^T and x^T with the maxima the site's forward kept, where it kept them.
  const Fp8Source w_t{w, OC, C, Fp8Layout::kTransposed, kept(site, true, true)};
  const Fp8Source x_t{inp, N, C, Fp8Layout::kTransposed, kept(site, false, true)};
  // dy's maximum, where the kernel that wrote dy took it.
  const Maxima dy = dy_maxima(site, dy_produced);
  // With the weights cast (dist.fp8_gather), W^T is W's codes transposed, with W's inverse scale.
  const auto w_slot = [&] { return policy_.weights_cast ? transposed_weight(w, OC, C, s.b, ctx) : s.b; };
  if (dinp && fp8_dweight) {
    // dy once for both GEMMs (gpu::fp8_quantize_pair_async): row-major for the input gradient, transposed (kept in
    // slot t while the input gradient's GEMM runs) for the weight gradient's; W^T, then x^T, each as its GEMM comes.
    if (lap) (*lap)("bwd.fp8_cast");
    pair_cast(dout, N, OC, policy_.input_grad.a, policy_.weight_grad.a, s.a, s.t, dy, ctx);
    fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor}, w_t, s.a, w_slot(), dinp, C, dinp_write, ctx,
                lap, true, nullptr, nullptr, true, policy_.weights_cast);
    fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed}, x_t, s.t, x_slot, dweight, C, param_write,
                ctx, lap, true, nullptr, nullptr, true, codes_kept);
  } else {
    if (dinp) {
      if (lap) (*lap)("bwd.fp8_cast");  // W's transpose (weights_cast) with the casts
      fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor, dy}, w_t, s.a, w_slot(), dinp, C, dinp_write,
                  ctx, lap, true, nullptr, nullptr, false, policy_.weights_cast);
    }
    if (fp8_dweight)
      fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed, dy}, x_t, s.a, x_slot, dweight, C,
                  param_write, ctx, lap, true, nullptr, nullptr, false, codes_kept);
  }
  if (dweight && !fp8_dweight)
    gpu::matmul_backward<T>(nullptr, dweight, nullptr, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
  if (dbias) gpu::matmul_backward<T>(nullptr, nullptr, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
}

template class CudaLinear<float>;
template class CudaLinear<bf16>;
template class CudaLinear<fp16>;

}  // namespace st
