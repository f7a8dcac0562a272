// Causal attention as cuDNN operation graphs (cuDNN 9 backend C API, no cudnn-frontend). About 900 lines in one
// file on purpose: the RAII descriptor, the graph builder, the forward and backward graphs, the engine choice and the
// plan cache are one unit that nothing else uses, and the graphs only make sense read beside the builder.
//
// cuDNN 9.14's unified SDPA operation cannot express this (no causal mask before 9.21's score-modifier
// subgraphs, no backward before 9.17). What cuDNN runs instead: its runtime pattern-matches a graph of
// matmul, pointwise, reduction and reshape operations against its fused flash-attention engines. The graphs
// below are, operation for operation, what cudnn-frontend 1.x lowers sdpa() and sdpa_backward() to for a
// cuDNN 9.10-9.20 backend (node/scaled_dot_product_flash_attention.h, node/softmax.h,
// utils/attn_score_modifiers.h): same order, fp32 virtual intermediates, fp32 compute, the probabilities
// and the transposed dS typed as the I/O type before their products, by-value fp32 scalars of dims
// [1,1,1,1], 16-byte tensor alignment, and the frontend's own scratch tensors (the dO.O row sums, the dq
// accumulator). Matching the frontend this closely is the point: a graph that differs in an operation or a
// type is "not supported" by every engine. Tensor UIDs carry no meaning to the matcher (only uniqueness).
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"

static_assert(CUDNN_MAJOR >= 9, "cudnn_attention needs the cuDNN 9 graph API");

namespace st::gpu {
namespace {

// A failed cuDNN call, with cuDNN's status name and its last error message (which names the attribute,
// operation or engine it rejected). Funnels into st::detail::fail like ST_CUDA_CHECK.
[[noreturn]] void cudnn_fail(const char* file, int line, const std::string& expr, cudnnStatus_t status) {
  char last[2048] = "";
  cudnnGetLastErrorString(last, sizeof(last));
  detail::fail(ErrorKind::kFault, file, line, expr.c_str(),
               str_cat("cuDNN error ", static_cast<int>(status), " ", cudnnGetErrorString(status), ": ", last));
}

#define ST_CUDNN_CHECK(expr)                                                                            \
  do {                                                                                                  \
    const cudnnStatus_t st_cudnn_ = (expr);                                                             \
    if (st_cudnn_ != CUDNN_STATUS_SUCCESS) ::st::gpu::cudnn_fail(__FILE__, __LINE__, #expr, st_cudnn_); \
  } while (0)

// cudnn-frontend dropped its padding-mask workaround for the backward's NaN bug at kv lengths that are not
// multiples of 128 from this backend version on (cudnn-frontend PR #178, issue #160).
constexpr size_t kPaddingWorkaroundFixed = 91501;
constexpr size_t kMinCudnnVersion = 91000;  // -inf as the mask value; no second padding mask after the stats
constexpr size_t kScratchAlign = 256;

size_t round_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// ---------------------------------------------------------------------------------------------------------
// Backend descriptors

// A cudnnBackendDescriptor_t, destroyed with its owner. Moves, does not copy.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) { ST_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
              int64_t count, const void* value) {
  const cudnnStatus_t status = cudnnBackendSetAttribute(d, name, type, count, value);
  if (status != CUDNN_STATUS_SUCCESS) {
    cudnn_fail(__FILE__, __LINE__, str_cat("cudnnBackendSetAttribute(attribute ", static_cast<int>(name), ")"), status);
  }
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  set_attr(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
void finalize(cudnnBackendDescriptor_t d, const char* what) {
  const cudnnStatus_t status = cudnnBackendFinalize(d);
  if (status != CUDNN_STATUS_SUCCESS)
    cudnn_fail(__FILE__, __LINE__, str_cat("cudnnBackendFinalize(", what, ")"), status);
}

using Dims = std::array<int64_t, 4>;

// Optional per-batch GEMM extents (device int32 [B,1,1,1]) of a matmul: the padding-mask workaround sets them
// to the sequence lengths, as cudnn-frontend does whenever a padding mask is present.
struct GemmOverrides {
  cudnnBackendDescriptor_t m = nullptr, n = nullptr, k = nullptr;
};

// Builds one operation graph. Every tensor and operation descriptor is kept (descriptors()) for as long as
// the execution plan lives, since the graph and plan refer to them.
class GraphBuilder {
 public:
  // A tensor bound to device memory through `uid` in the variant pack.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return make_tensor(uid, type, dims, strides, /*is_virtual=*/false, /*by_value=*/false);
  }
  // An intermediate that lives only inside the fused kernel; its strides just describe a logical layout.
  cudnnBackendDescriptor_t virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return make_tensor(next_virtual_uid_++, type, dims, strides, /*is_virtual=*/true, /*by_value=*/false);
  }
  // An fp32 scalar passed by host pointer in the variant pack and broadcast: cudnn-frontend's "fused scalar",
  // whose dims it expands to the rank of the other operand.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, /*is_virtual=*/false, /*by_value=*/true);
  }

  // c = a @ b over the last two dims, batched over the first two; fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              const GemmOverrides& o = {}) {
    Desc& desc = keep(Desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const double padding = 0.0;  // cudnn-frontend always sets it
    set_attr(desc.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    set_attr(desc.get(), CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding);
    finalize(desc.get(), "matmul descriptor");
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, desc.get());
    if (o.m) set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, o.m);
    if (o.n) set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, o.n);
    if (o.k) set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, o.k);
    add_op(op, "matmul");
  }

  // y = mode(x) in fp32.
  void unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  // y = mode(x, b), computed in `math` (fp32 arithmetic, boolean comparisons and logic).
  void binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y, cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    pointwise(mode, math, x, b, nullptr, y);
  }
  // y = the index of each element of x along `axis` (y is int32; `math` as cudnn-frontend sets it).
  void gen_index(int64_t axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, cudnnDataType_t math) {
    pointwise(CUDNN_POINTWISE_GEN_INDEX, math, x, nullptr, nullptr, y, axis);
  }
  // y = keep ? x : b.
  void select(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t keep,
              cudnnBackendDescriptor_t y) {
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, b, keep, y);
  }

  // y = op over the dims where y is smaller than x, in fp32: a dim of extent 1 in y reduces whole, NKV heads in y
  // of NH in x reduce each group of NH/NKV consecutive heads.
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& desc = keep(Desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    set_attr(desc.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    set_attr(desc.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    finalize(desc.get(), "reduction descriptor");
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc.get());
    add_op(op, "reduction");
  }

  // y = x seen through y's dims and strides (a transpose when they are swapped).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR));
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_op(op, "reshape");
  }

  // The finalized operation graph of everything added so far, in the order added.
  cudnnBackendDescriptor_t finalize_graph(cudnnHandle_t handle) {
    Desc& graph = keep(Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    set_attr(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set_attr(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(ops_.size()), ops_.data());
    finalize(graph.get(), "operation graph");
    return graph.get();
  }

  std::deque<Desc>& descriptors() { return descs_; }

 private:
  Desc& keep(Desc d) {
    descs_.push_back(std::move(d));
    return descs_.back();
  }
  void add_op(const Desc& op, const char* what) {
    finalize(op.get(), what);
    ops_.push_back(op.get());
  }

  cudnnBackendDescriptor_t make_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                       bool is_virtual, bool by_value) {
    Desc& t = keep(Desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const int64_t alignment = 16;  // cudnn-frontend's default; the tensor-core engines need it
    set_attr(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set_attr(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set_attr(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set_attr(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set_attr(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set_attr(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    set_attr(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(t.get(), "tensor");
    return t.get();
  }

  // A pointwise operation; unused inputs are null. Alpha1/alpha2 = 1 as cudnn-frontend's builder sets them.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    Desc& desc = keep(Desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    set_attr(desc.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set_attr(desc.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set_attr(desc.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(desc.get(), "pointwise descriptor");
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    const float one = 1.0f;
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc.get());
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    set_attr(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set_attr(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add_op(op, "pointwise");
  }

  std::deque<Desc> descs_;  // a deque: keep() hands out references that later keep()s must not move
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = 1000;  // above every Uid
};

// ---------------------------------------------------------------------------------------------------------
// The attention graphs

// UIDs of the tensors bound in the variant packs.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kScale,
  kNegInf,
  kOne,
  kSoftmaxSum,
  kDqAccum,
  kSeqLenQ,
  kSeqLenKV,
};

enum class Pass { kForward, kBackwardDeterministic, kBackwardNondeterministic };

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::kForward:
      return "forward";
    case Pass::kBackwardDeterministic:
      return "backward (deterministic)";
    case Pass::kBackwardNondeterministic:
      return "backward (nondeterministic)";
  }
  return "?";
}

// NH query heads and NKV key/value heads of hs values; C = NH hs is the width of q and of out.
struct Shape {
  int64_t B, T, NH, NKV, hs;
  int64_t C() const { return NH * hs; }
  int64_t ld() const { return (NH + 2 * NKV) * hs; }  // qkv's row stride
  int64_t k_offset() const { return C(); }            // of the first K head in a qkv row
  int64_t v_offset() const { return C() + NKV * hs; }
};

std::string describe(const Shape& s, cudnnDataType_t io, Pass pass) {
  return str_cat("cuDNN attention ", pass_name(pass), " ", io == CUDNN_DATA_BFLOAT16 ? "bf16" : "fp16", " B=", s.B,
                 " T=", s.T, " C=", s.C(), " NH=", s.NH, " NKV=", s.NKV, " hs=", s.hs);
}

// The dims and strides of every tensor, [b, h, row, col] order. q, k, v are the column blocks of the rows of
// qkv, so a head's [T, hs] slice has row stride (NH + 2 NKV) hs; kT is k with its last two dims (and strides)
// swapped, which is how cuDNN's matmul takes a transposed operand. K and V (and dK, dV) have NKV heads; the
// matmuls with Q's NH heads broadcast them over each group of NH/NKV query heads.
struct Layout {
  explicit Layout(const Shape& s)
      : bhtd{s.B, s.NH, s.T, s.hs},
        bhdt{s.B, s.NH, s.hs, s.T},
        bhtt{s.B, s.NH, s.T, s.T},
        bht1{s.B, s.NH, s.T, 1},
        kv_bhtd{s.B, s.NKV, s.T, s.hs},
        kv_bhdt{s.B, s.NKV, s.hs, s.T},
        b111{s.B, 1, 1, 1},
        qkv{s.T * s.ld(), s.hs, s.ld(), 1},
        qkv_t{s.T * s.ld(), s.hs, 1, s.ld()},
        out{s.T * s.C(), s.hs, s.C(), 1},
        scores{s.NH * s.T * s.T, s.T * s.T, s.T, 1},
        scores_t{s.NH * s.T * s.T, s.T * s.T, 1, s.T},
        bhtd_packed{s.NH * s.T * s.hs, s.T * s.hs, s.hs, 1},
        bht1_packed{s.NH * s.T, s.T, 1, 1} {}
  // dims
  Dims bhtd, bhdt, bhtt, bht1, kv_bhtd, kv_bhdt, b111;
  // strides
  Dims qkv, qkv_t, out, scores, scores_t, bhtd_packed, bht1_packed;
  Dims ones{1, 1, 1, 1};
};

// The causal mask as cudnn-frontend's sliding_window_mask with right bound 0 lowers it (its index ops leave the
// math type at the fp32 default): y = row >= col ? x : -inf.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t neg_inf) {
  auto row = g.virtual_tensor(CUDNN_DATA_INT32, l.bhtt, l.scores);
  g.gen_index(2, x, row, CUDNN_DATA_FLOAT);
  auto col = g.virtual_tensor(CUDNN_DATA_INT32, l.bhtt, l.scores);
  g.gen_index(3, x, col, CUDNN_DATA_FLOAT);
  auto keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  auto y = g.virtual_tensor(CUDNN_DATA_FLOAT, l.bhtt, l.scores);
  g.select(x, neg_inf, keep, y);
  return y;
}

// cudnn-frontend's padding mask (score_modifiers::padding_mask): y = row < seq_len_q && col < seq_len_kv ? x : -inf.
cudnnBackendDescriptor_t padding_mask(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t x,
                                      cudnnBackendDescriptor_t seq_len_q, cudnnBackendDescriptor_t seq_len_kv,
                                      cudnnBackendDescriptor_t neg_inf) {
  auto row = g.virtual_tensor(CUDNN_DATA_INT32, l.bhtt, l.scores);
  g.gen_index(2, x, row, CUDNN_DATA_INT32);
  auto col = g.virtual_tensor(CUDNN_DATA_INT32, l.bhtt, l.scores);
  g.gen_index(3, x, col, CUDNN_DATA_INT32);
  auto row_in = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_CMP_LT, row, seq_len_q, row_in, CUDNN_DATA_BOOLEAN);
  auto col_in = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_CMP_LT, col, seq_len_kv, col_in, CUDNN_DATA_BOOLEAN);
  auto keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_LOGICAL_AND, row_in, col_in, keep, CUDNN_DATA_BOOLEAN);
  auto y = g.virtual_tensor(CUDNN_DATA_FLOAT, l.bhtt, l.scores);
  g.select(x, neg_inf, keep, y);
  return y;
}

// Forward (sdpa with generate_stats, causal, attn_scale by value):
//   S = Q @ K^T; S *= scale; S = causal(S); M = max_row(S); E = exp(S - M); Z = sum_row(E);
//   Stats = M + log(Z); P = E / Z (typed as T); O = P @ V.
void build_forward(GraphBuilder& g, cudnnDataType_t io, const Shape& s) {
  const Layout l(s);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  auto q = g.tensor(kQ, io, l.bhtd, l.qkv);
  auto kt = g.tensor(kK, io, l.kv_bhdt, l.qkv_t);
  auto v = g.tensor(kV, io, l.kv_bhtd, l.qkv);
  auto o = g.tensor(kO, io, l.bhtd, l.out);
  auto stats = g.tensor(kStats, f32, l.bht1, l.bht1_packed);
  auto scale = g.scalar(kScale);
  auto neg_inf = g.scalar(kNegInf);

  auto scores = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.matmul(q, kt, scores);
  auto scaled = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_MUL, scores, scale, scaled);
  auto masked = causal_mask(g, l, scaled, neg_inf);

  auto max = g.virtual_tensor(f32, l.bht1, l.bht1_packed);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  auto shifted = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_SUB, masked, max, shifted);
  auto e = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.unary(CUDNN_POINTWISE_EXP, shifted, e);
  auto z = g.virtual_tensor(f32, l.bht1, l.bht1_packed);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g.virtual_tensor(f32, l.bht1, l.bht1_packed);
  g.unary(CUDNN_POINTWISE_LOG, z, log_z);
  g.binary(CUDNN_POINTWISE_ADD, max, log_z, stats);
  auto p = g.virtual_tensor(io, l.bhtt, l.scores);  // bmm2's A operand must have the I/O type
  g.binary(CUDNN_POINTWISE_DIV, e, z, p);
  g.matmul(p, v, o);
}

// Backward (sdpa_backward, causal, attn_scale by value; dropout off, so the dropout scale is the constant 1):
//   Dsum = sum_row(dO * O) * 1 (fp32, in scratch);
//   S = Q @ K^T * scale; [padding mask]; S -= Stats; causal; P = exp(S);
//   dV = P^T @ dO; dS = (dO @ V^T - Dsum) * P * scale; dK = dS^T @ Q;
//   with grouping (NKV < NH), dV and dK are computed per query head (NH heads, typed as T, virtual) and summed
//   over each group of NH/NKV heads by a reduction into the NKV-head dV and dK, as cudnn-frontend lowers GQA;
//   dQ = dS @ K, straight into dQ (deterministic: the engine keeps dP in its workspace and runs dQ as its own
//   GEMM) or through the fp32 accumulator in scratch (atomics) and an identity copy.
// padding_workaround: the sequence-length padding mask, with the matching GEMM extents, that cudnn-frontend
// adds for cuDNN < 9.15.1 when T % 128 != 0. Mask positions as in cudnn-frontend 1.14-1.15 (the releases of
// the cuDNN 9.13-9.14 era): padding before the stats are subtracted, causal after.
void build_backward(GraphBuilder& g, cudnnDataType_t io, const Shape& s, bool deterministic, bool padding_workaround) {
  const Layout l(s);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  auto q = g.tensor(kQ, io, l.bhtd, l.qkv);
  auto kt = g.tensor(kK, io, l.kv_bhdt, l.qkv_t);
  auto vt = g.tensor(kV, io, l.kv_bhdt, l.qkv_t);
  auto o = g.tensor(kO, io, l.bhtd, l.out);
  auto d_o = g.tensor(kDO, io, l.bhtd, l.out);
  auto stats = g.tensor(kStats, f32, l.bht1, l.bht1_packed);
  auto dq = g.tensor(kDQ, io, l.bhtd, l.qkv);
  auto dk = g.tensor(kDK, io, l.kv_bhtd, l.qkv);
  auto dv = g.tensor(kDV, io, l.kv_bhtd, l.qkv);
  const bool grouped = s.NKV != s.NH;
  // The matmul's output for a K/V gradient: the gradient itself, or its per-query-head form and the reduction.
  auto per_query_head = [&](cudnnBackendDescriptor_t grad) {
    return grouped ? g.virtual_tensor(io, l.bhtd, l.bhtd_packed) : grad;
  };
  auto sum_groups = [&](cudnnBackendDescriptor_t full, cudnnBackendDescriptor_t grad) {
    if (grouped) g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, grad);
  };
  auto scale = g.scalar(kScale);
  auto neg_inf = g.scalar(kNegInf);
  auto one = g.scalar(kOne);
  cudnnBackendDescriptor_t seq_q = nullptr, seq_kv = nullptr;
  if (padding_workaround) {
    seq_q = g.tensor(kSeqLenQ, CUDNN_DATA_INT32, l.b111, l.ones);
    seq_kv = g.tensor(kSeqLenKV, CUDNN_DATA_INT32, l.b111, l.ones);
  }

  // The softmax backward's row term, sum_d dO * O.
  auto do_o = g.virtual_tensor(f32, l.bhtd, {s.NH * s.T * s.hs, s.T * s.hs, s.C(), 1});
  g.binary(CUDNN_POINTWISE_MUL, d_o, o, do_o);
  auto do_o_sum = g.virtual_tensor(f32, l.bht1, l.bht1_packed);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
  auto softmax_sum = g.tensor(kSoftmaxSum, f32, l.bht1, l.bht1_packed);
  g.binary(CUDNN_POINTWISE_MUL, do_o_sum, one, softmax_sum);

  // P recomputed from the saved logsumexp.
  auto scores = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.matmul(q, kt, scores, {seq_q, seq_kv, nullptr});
  auto scaled = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_MUL, scores, scale, scaled);
  if (padding_workaround) scaled = padding_mask(g, l, scaled, seq_q, seq_kv, neg_inf);
  auto shifted = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  auto masked = causal_mask(g, l, shifted, neg_inf);
  auto p = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.unary(CUDNN_POINTWISE_EXP, masked, p);

  // dV = P^T dO.
  auto p_t = g.virtual_tensor(io, l.bhtt, l.scores_t);
  g.reshape(p, p_t);
  auto dv_full = per_query_head(dv);
  g.matmul(p_t, d_o, dv_full, {seq_kv, nullptr, seq_q});
  sum_groups(dv_full, dv);

  // dS = P * (dP - Dsum) * scale, dP = dO V^T.
  auto dp = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.matmul(d_o, vt, dp, {seq_q, seq_kv, nullptr});
  auto dp_centered = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);
  auto ds_unscaled = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled);
  auto ds = g.virtual_tensor(f32, l.bhtt, l.scores);
  g.binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);

  // dK = dS^T Q.
  auto ds_t = g.virtual_tensor(io, l.bhtt, l.scores_t);
  g.reshape(ds, ds_t);
  auto dk_full = per_query_head(dk);
  g.matmul(ds_t, q, dk_full, {seq_kv, nullptr, seq_q});
  sum_groups(dk_full, dk);

  // dQ = dS K (K as the un-transposed view of K^T; fp32 like every untyped frontend intermediate).
  auto k = g.virtual_tensor(f32, l.kv_bhtd, l.qkv);
  g.reshape(kt, k);
  if (deterministic) {
    g.matmul(ds, k, dq, {seq_q, nullptr, seq_kv});
  } else {
    auto dq_accum = g.tensor(kDqAccum, f32, l.bhtd, l.bhtd_packed);
    g.matmul(ds, k, dq_accum, {seq_q, nullptr, seq_kv});
    g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Plans

struct Plan {
  bool ok = false;
  std::string failure;  // why cuDNN cannot run this graph (ok == false)

  std::deque<Desc> descriptors;  // tensors, operations, graph and engine config the plan refers to
  Desc exec;                     // the execution plan
  // ctx.scratch layout: cuDNN's workspace, then (backward) the dO.O row sums and the dq accumulator.
  size_t workspace_bytes = 0, softmax_sum_offset = 0, dq_accum_offset = 0, scratch_bytes = 0;
  DeviceBuffer<int32_t> seq_len_q, seq_len_kv;  // [B] = T each, for the padding-mask workaround

  // By-value scalars: the variant pack passes their host addresses.
  float scale = 0, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
};

bool has_nondeterministic_note(cudnnBackendDescriptor_t config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  ST_CUDNN_CHECK(
      cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw));
  std::array<cudnnBackendNumericalNote_t, 32> notes{};
  ST_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                          static_cast<int64_t>(notes.size()), &n, notes.data()));
  return std::find(notes.begin(), notes.begin() + n, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != notes.begin() + n;
}

// Whether a failed finalize says the engine config cannot run the graph (cuDNN's bad-parameter and not-supported
// categories), rather than that building it failed.
bool rejects_graph(cudnnStatus_t status) {
  const int category = static_cast<int>(status) / 1000 * 1000;
  return category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED;
}
constexpr int kFinalizeAttempts = 3;
// A build that failed for a reason other than the graph (see choose_engine): a fault, never "cuDNN cannot run this
// shape", which would let train.attention=auto take flash attention instead.
struct BuildFailure : Error {
  explicit BuildFailure(const std::string& what) : Error(ErrorKind::kFault, what) {}
};

// Heuristics mode A ranks the engine configs for the graph; the first that finalizes into an execution plan
// is kept (cudnn-frontend's default policy). Configs whose engine declares itself nondeterministic are
// skipped: every pass we build is meant to be reproducible except the nondeterministic backward.
void choose_engine(cudnnHandle_t handle, cudnnBackendDescriptor_t graph, bool require_deterministic, Plan& plan) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heur.get(), "engine heuristics");
  int64_t count = 0;
  ST_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, nullptr));
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  if (count > 0) {
    ST_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            count, &returned, raw.data()));
  }

  std::string rejected;  // one line per config tried
  for (int64_t i = 0; i < returned; ++i) {
    if (require_deterministic && has_nondeterministic_note(raw[i])) {
      rejected += str_cat("; config ", i, ": nondeterministic");
      continue;
    }
    // A config that cannot run this graph (bad parameter, not supported) is a property of the graph and the device:
    // the next one is taken. Any other failure (a runtime compilation or an allocation that failed, typically while
    // other processes load the same GPU) is not: taking the next engine would give this run other numerics than the
    // same run alone. The same config is built again, and a failure that persists is a fault (retry the run).
    Desc candidate;
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    for (int attempt = 0; attempt < kFinalizeAttempts; ++attempt) {
      candidate = Desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set_attr(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      set_desc(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
      status = cudnnBackendFinalize(candidate.get());
      if (status == CUDNN_STATUS_SUCCESS || rejects_graph(status)) break;
    }
    if (status != CUDNN_STATUS_SUCCESS) {
      char last[512] = "";
      cudnnGetLastErrorString(last, sizeof(last));
      if (!rejects_graph(status))
        throw BuildFailure(str_cat("cuDNN could not build engine config ", i, " of ", returned, " (",
                                   kFinalizeAttempts, " attempts): ", cudnnGetErrorString(status), " ", last));
      rejected += str_cat("; config ", i, ": ", cudnnGetErrorString(status), " ", last);
      continue;
    }
    int64_t workspace = 0, n = 0;
    ST_CUDNN_CHECK(cudnnBackendGetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                            1, &n, &workspace));
    plan.exec = std::move(candidate);
    plan.workspace_bytes = static_cast<size_t>(workspace);
    plan.descriptors.push_back(std::move(configs[static_cast<size_t>(i)]));
    return;
  }
  ST_FAULT("no cuDNN engine runs this graph: heuristics mode A offered ", returned, " configs", rejected);
}

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, cudnnDataType_t io, const Shape& s, Pass pass) {
  auto plan = std::make_unique<Plan>();
  plan->scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  const size_t version = cudnnGetVersion();
  if (version < kMinCudnnVersion) {
    plan->failure = str_cat(describe(s, io, pass), ": needs cuDNN >= ", kMinCudnnVersion, ", have ", version);
    return plan;
  }
  // Every tensor is declared 16-byte aligned: heads start multiples of hs elements apart, and so do rows.
  if (s.hs % 8 != 0) {
    plan->failure = str_cat(describe(s, io, pass), ": head size must be a multiple of 8 (16-byte aligned rows)");
    return plan;
  }
  try {
    GraphBuilder g;
    const bool padding_workaround = pass != Pass::kForward && version < kPaddingWorkaroundFixed && s.T % 128 != 0;
    if (pass == Pass::kForward) {
      build_forward(g, io, s);
    } else {
      build_backward(g, io, s, pass == Pass::kBackwardDeterministic, padding_workaround);
    }
    cudnnBackendDescriptor_t graph = g.finalize_graph(handle);
    plan->descriptors = std::move(g.descriptors());
    choose_engine(handle, graph, pass != Pass::kBackwardNondeterministic, *plan);

    plan->softmax_sum_offset = round_up(plan->workspace_bytes);
    plan->scratch_bytes = plan->softmax_sum_offset;
    if (pass != Pass::kForward) {
      plan->scratch_bytes += round_up(static_cast<size_t>(s.B * s.NH * s.T) * sizeof(float));
      plan->dq_accum_offset = plan->scratch_bytes;
      if (pass == Pass::kBackwardNondeterministic) {
        plan->scratch_bytes += round_up(static_cast<size_t>(s.B * s.NH * s.T * s.hs) * sizeof(float));
      }
    }
    if (padding_workaround) {
      const std::vector<int32_t> lens(static_cast<size_t>(s.B), static_cast<int32_t>(s.T));
      for (DeviceBuffer<int32_t>* buf : {&plan->seq_len_q, &plan->seq_len_kv}) {
        *buf = DeviceBuffer<int32_t>(s.B);
        ST_CUDA_CHECK(cudaMemcpy(buf->data(), lens.data(), buf->bytes(), cudaMemcpyHostToDevice));
      }
      ST_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before the DMA lands
    }
    plan->ok = true;
  } catch (const BuildFailure&) {
    throw;
  } catch (const Error& e) {
    plan->failure = str_cat(describe(s, io, pass), ": ", e.what());
  }
  return plan;
}

template <typename T>
constexpr bool kOnCudnn = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;
template <typename T>
constexpr cudnnDataType_t kIoType = std::is_same_v<T, bf16> ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;

Shape make_shape(int B, int T_, int NH, int NKV, int hs) {
  ST_CHECK(B > 0 && T_ > 0 && NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "cuDNN attention: bad shape B=", B,
           " T=", T_, " NH=", NH, " NKV=", NKV, " hs=", hs, " (NH must be a multiple of NKV)");
  return Shape{B, T_, NH, NKV, hs};
}

// The GPT-2 form: NKV = NH heads of size C / NH.
Shape make_shape(int B, int T_, int C, int NH) {
  ST_CHECK(B > 0 && T_ > 0 && NH > 0 && C > 0 && C % NH == 0, "cuDNN attention: bad shape B=", B, " T=", T_, " C=", C,
           " NH=", NH, " (C must be a multiple of NH)");
  return make_shape(B, T_, NH, NH, C / NH);
}

Pass backward_pass(CudnnBackwardMode mode) {
  return mode == CudnnBackwardMode::kDeterministic ? Pass::kBackwardDeterministic : Pass::kBackwardNondeterministic;
}

// The cached plan for the shape (built on first use); ok == false when cuDNN cannot run it.
Plan& plan_for(Cudnn& cudnn, cudnnDataType_t io, const Shape& s, Pass pass);

// The plan, which must be runnable.
template <typename T>
Plan& runnable_plan(const GpuContext& ctx, const Shape& s, Pass pass) {
  ST_CHECK(kOnCudnn<T>, "cuDNN attention runs bf16 or fp16 only, not fp32");
  ST_CHECK(ctx.cudnn != nullptr, "GpuContext::cudnn is null; cuDNN attention needs a Cudnn");
  Plan& p = plan_for(*ctx.cudnn, kIoType<T>, s, pass);
  ST_CHECK(p.ok, p.failure);
  return p;
}

void check_aligned(const void* p, const char* name) {
  ST_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "cuDNN attention: ", name, " = ", p, " is not 16-byte aligned");
}

void check_scratch(const Plan& p, const GpuContext& ctx, const Shape& s, cudnnDataType_t io, Pass pass) {
  ST_CHECK(ctx.scratch_bytes >= p.scratch_bytes, describe(s, io, pass), " needs ", p.scratch_bytes,
           " bytes of scratch (cuDNN workspace ", p.workspace_bytes, "); GpuContext has ", ctx.scratch_bytes);
  check_aligned(ctx.scratch, "ctx.scratch");
}

// Binds (uid, pointer) pairs and runs the plan on ctx.stream.
void execute(Cudnn& cudnn, const Plan& p, const GpuContext& ctx, const std::vector<std::pair<int64_t, void*>>& binds,
             const std::string& what);

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Cudnn

struct Cudnn::State {
  State() { ST_CUDNN_CHECK(cudnnCreate(&handle)); }
  ~State() {
    plans.clear();  // descriptors before the handle
    if (handle) cudnnDestroy(handle);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  using Key = std::array<int64_t, 7>;  // io type, B, T, NH, NKV, hs, pass
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;
};

Cudnn::Cudnn() : state_(std::make_unique<State>()) {}
Cudnn::~Cudnn() = default;
Cudnn::Cudnn(Cudnn&& o) noexcept = default;
Cudnn& Cudnn::operator=(Cudnn&& o) noexcept = default;
size_t Cudnn::plan_count() const { return state_->plans.size(); }

namespace {

Plan& plan_for(Cudnn& cudnn, cudnnDataType_t io, const Shape& s, Pass pass) {
  Cudnn::State& st = cudnn.state();
  std::unique_ptr<Plan>& slot = st.plans[{io, s.B, s.T, s.NH, s.NKV, s.hs, static_cast<int64_t>(pass)}];
  if (!slot) slot = build_plan(st.handle, io, s, pass);
  return *slot;
}

void execute(Cudnn& cudnn, const Plan& p, const GpuContext& ctx, const std::vector<std::pair<int64_t, void*>>& binds,
             const std::string& what) {
  Cudnn::State& st = cudnn.state();
  ST_CUDNN_CHECK(cudnnSetStream(st.handle, ctx.stream));
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : binds) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  void* workspace = ctx.scratch;
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()),
           ptrs.data());
  set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  finalize(pack.get(), "variant pack");
  const cudnnStatus_t status = cudnnBackendExecute(st.handle, p.exec.get(), pack.get());
  if (status != CUDNN_STATUS_SUCCESS) cudnn_fail(__FILE__, __LINE__, str_cat("cudnnBackendExecute: ", what), status);
}

// cuDNN takes every pointer as void*; inputs are only read.
template <typename T>
void* ptr(const T* p) {
  return const_cast<void*>(static_cast<const void*>(p));
}

// The entry points on a checked shape: the (NH, NKV, hs) and (C, NH) forms differ only in how they build it.
template <typename T>
bool supported(const Shape& s, const GpuContext& ctx, CudnnBackwardMode mode) {
  return plan_for(*ctx.cudnn, kIoType<T>, s, Pass::kForward).ok &&
         plan_for(*ctx.cudnn, kIoType<T>, s, backward_pass(mode)).ok;
}

template <typename T>
void forward(T* out, float* lse, const T* qkv, const Shape& s, const GpuContext& ctx) {
  Plan& p = runnable_plan<T>(ctx, s, Pass::kForward);
  check_scratch(p, ctx, s, kIoType<T>, Pass::kForward);
  check_aligned(out, "out");
  check_aligned(lse, "lse");
  check_aligned(qkv, "qkv");
  execute(*ctx.cudnn, p, ctx,
          {{kQ, ptr(qkv)},
           {kK, ptr(qkv + s.k_offset())},
           {kV, ptr(qkv + s.v_offset())},
           {kO, out},
           {kStats, lse},
           {kScale, &p.scale},
           {kNegInf, &p.neg_inf}},
          describe(s, kIoType<T>, Pass::kForward));
}

template <typename T>
void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, const Shape& s,
              const GpuContext& ctx, CudnnBackwardMode mode) {
  const Pass pass = backward_pass(mode);
  Plan& p = runnable_plan<T>(ctx, s, pass);
  check_scratch(p, ctx, s, kIoType<T>, pass);
  check_aligned(dqkv, "dqkv");
  check_aligned(dout, "dout");
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(lse, "lse");
  char* scratch = static_cast<char*>(ctx.scratch);
  std::vector<std::pair<int64_t, void*>> binds = {{kQ, ptr(qkv)},
                                                  {kK, ptr(qkv + s.k_offset())},
                                                  {kV, ptr(qkv + s.v_offset())},
                                                  {kO, ptr(out)},
                                                  {kDO, ptr(dout)},
                                                  {kStats, ptr(lse)},
                                                  {kDQ, dqkv},
                                                  {kDK, dqkv + s.k_offset()},
                                                  {kDV, dqkv + s.v_offset()},
                                                  {kScale, &p.scale},
                                                  {kNegInf, &p.neg_inf},
                                                  {kOne, &p.one},
                                                  {kSoftmaxSum, scratch + p.softmax_sum_offset}};
  // cuDNN >= 9.6 zeroes the dq accumulator itself (cudnn-frontend stopped doing it then).
  if (pass == Pass::kBackwardNondeterministic) binds.push_back({kDqAccum, scratch + p.dq_accum_offset});
  if (p.seq_len_q.size() > 0) {
    binds.push_back({kSeqLenQ, p.seq_len_q.data()});
    binds.push_back({kSeqLenKV, p.seq_len_kv.data()});
  }
  execute(*ctx.cudnn, p, ctx, binds, describe(s, kIoType<T>, pass));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Entry points

size_t cudnn_runtime_version() { return cudnnGetVersion(); }

template <typename T>
bool cudnn_attention_supported(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx, CudnnBackwardMode mode) {
  if (!kOnCudnn<T> || ctx.cudnn == nullptr) return false;
  return supported<T>(make_shape(B, T_, NH, NKV, hs), ctx, mode);
}

template <typename T>
bool cudnn_attention_supported(int B, int T_, int C, int NH, const GpuContext& ctx, CudnnBackwardMode mode) {
  if (!kOnCudnn<T> || ctx.cudnn == nullptr) return false;
  return supported<T>(make_shape(B, T_, C, NH), ctx, mode);
}

template <typename T>
size_t cudnn_attention_forward_scratch_bytes(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx) {
  return runnable_plan<T>(ctx, make_shape(B, T_, NH, NKV, hs), Pass::kForward).scratch_bytes;
}

template <typename T>
size_t cudnn_attention_forward_scratch_bytes(int B, int T_, int C, int NH, const GpuContext& ctx) {
  return runnable_plan<T>(ctx, make_shape(B, T_, C, NH), Pass::kForward).scratch_bytes;
}

template <typename T>
size_t cudnn_attention_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx,
                                              CudnnBackwardMode mode) {
  return runnable_plan<T>(ctx, make_shape(B, T_, NH, NKV, hs), backward_pass(mode)).scratch_bytes;
}

template <typename T>
size_t cudnn_attention_backward_scratch_bytes(int B, int T_, int C, int NH, const GpuContext& ctx,
                                              CudnnBackwardMode mode) {
  return runnable_plan<T>(ctx, make_shape(B, T_, C, NH), backward_pass(mode)).scratch_bytes;
}

template <typename T>
void cudnn_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                             const GpuContext& ctx) {
  forward(out, lse, qkv, make_shape(B, T_, NH, NKV, hs), ctx);
}

template <typename T>
void cudnn_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx) {
  forward(out, lse, qkv, make_shape(B, T_, C, NH), ctx);
}

template <typename T>
void cudnn_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int NH, int NKV, int hs, const GpuContext& ctx, CudnnBackwardMode mode) {
  backward(dqkv, dout, qkv, out, lse, make_shape(B, T_, NH, NKV, hs), ctx, mode);
}

template <typename T>
void cudnn_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int C, int NH, const GpuContext& ctx, CudnnBackwardMode mode) {
  backward(dqkv, dout, qkv, out, lse, make_shape(B, T_, C, NH), ctx, mode);
}

#define ST_INSTANTIATE(T)                                                                                              \
  template bool cudnn_attention_supported<T>(int, int, int, int, int, const GpuContext&, CudnnBackwardMode);           \
  template size_t cudnn_attention_forward_scratch_bytes<T>(int, int, int, int, int, const GpuContext&);                \
  template size_t cudnn_attention_backward_scratch_bytes<T>(int, int, int, int, int, const GpuContext&,                \
                                                            CudnnBackwardMode);                                        \
  template void cudnn_attention_forward<T>(T*, float*, const T*, int, int, int, int, int, const GpuContext&);          \
  template void cudnn_attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, int, int, int,   \
                                            const GpuContext&, CudnnBackwardMode);                                     \
  template bool cudnn_attention_supported<T>(int, int, int, int, const GpuContext&, CudnnBackwardMode);                \
  template size_t cudnn_attention_forward_scratch_bytes<T>(int, int, int, int, const GpuContext&);                     \
  template size_t cudnn_attention_backward_scratch_bytes<T>(int, int, int, int, const GpuContext&, CudnnBackwardMode); \
  template void cudnn_attention_forward<T>(T*, float*, const T*, int, int, int, int, const GpuContext&);               \
  template void cudnn_attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, int, int,        \
                                            const GpuContext&, CudnnBackwardMode);
ST_INSTANTIATE(float)
ST_INSTANTIATE(bf16)
ST_INSTANTIATE(fp16)
#undef ST_INSTANTIATE

}  // namespace st::gpu
