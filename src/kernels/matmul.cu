#include "shardtrain/kernels/gpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "blas_plan.cuh"
#include "gemv.cuh"
#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gemm_algorithms.h"
#include "shardtrain/kernels/gpu/column_sums.h"
#include "shardtrain/kernels/gpu/fill.h"
#include "shardtrain/kernels/gpu/gelu.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/gpu/swiglu.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

// ---------------------------------------------------------------------------------------------------------
// Blas
//
// cuBLASLt is column-major. A row-major [r, c] matrix with pitch ld is, in the same memory, a column-major
// [c, r] matrix with the same ld, i.e. its transpose. So the row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B (transposed iff trans_b), its
// second our A (transposed iff trans_a), and D is [n, m] column-major. The bias epilogue adds a vector
// along D's rows, i.e. our columns: exactly a per-output-feature bias.

namespace {

// A, B, C/D and the bias share T's type; compute and scale types are always fp32.
template <typename T>
constexpr cudaDataType_t kDataType = std::is_same_v<T, float> ? CUDA_R_32F
                                                              : (std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_16F);

template <typename T>
constexpr const char* kTypeName = std::is_same_v<T, float> ? "fp32" : (std::is_same_v<T, bf16> ? "bf16" : "fp16");

void set_layout_batch(cublasLtMatrixLayout_t layout, int batch, int64_t stride) {
  if (batch == 1) return;
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  ST_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

void set_pref_alignment(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, int64_t bytes) {
  const uint32_t v = static_cast<uint32_t>(bytes);
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
}

// Sets the per-call pointers of the epilogue (the plan was made with pointers of the same alignment).
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const GemmEpilogue& ep) {
  if (ep.bias) {
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof(ep.bias)));
  }
  const void* aux = ep.gelu_aux ? ep.gelu_aux : ep.dgelu_aux;
  if (aux) {
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
}

}  // namespace

Blas::Blas(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  ST_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) ST_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Blas::~Blas() {
  plans_.clear();  // descriptors before the handle
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Blas::Blas(Blas&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)),
      workspace_(std::exchange(o.workspace_, nullptr)),
      workspace_bytes_(std::exchange(o.workspace_bytes_, 0)),
      tune_candidates_(std::exchange(o.tune_candidates_, 0)),
      time_here_(o.time_here_),
      agree_(std::move(o.agree_)),
      presets_(std::move(o.presets_)),
      tuning_stats_(o.tuning_stats_),
      plans_(std::move(o.plans_)) {}

Blas& Blas::operator=(Blas&& o) noexcept {
  std::swap(handle_, o.handle_);
  std::swap(workspace_, o.workspace_);
  std::swap(workspace_bytes_, o.workspace_bytes_);
  std::swap(tune_candidates_, o.tune_candidates_);
  std::swap(time_here_, o.time_here_);
  std::swap(agree_, o.agree_);
  std::swap(presets_, o.presets_);
  std::swap(tuning_stats_, o.tuning_stats_);
  std::swap(plans_, o.plans_);
  return *this;
}

void Blas::set_tuning(int candidates, bool time_here, std::function<int(int)> agree) {
  ST_CHECK(candidates >= 0, "Blas: tuning candidates must be >= 0, got ", candidates);
  tune_candidates_ = candidates;
  time_here_ = time_here;
  agree_ = std::move(agree);
}

std::string Blas::algorithms() const {
  std::vector<GemmAlgorithmEntry> entries;
  for (const auto& [key, plan] : plans_) {
    if (!plan->found) continue;
    GemmAlgorithmEntry e;
    e.key = key;
    static_assert(sizeof(e.algo) == sizeof(plan->algo), "cublasLtMatmulAlgo_t is eight 64-bit words");
    std::memcpy(e.algo.data(), &plan->algo, sizeof(e.algo));
    entries.push_back(e);
  }
  return format_gemm_algorithms(entries);
}

void Blas::use_algorithms(const std::string& text) {
  for (const GemmAlgorithmEntry& e : parse_gemm_algorithms(text)) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, e.algo.data(), sizeof(algo));
    presets_[e.key] = algo;
  }
  plans_.clear();
}

namespace {

// Operands for timing GEMM algorithms: uniform in [-1, 1) (gpu::fill_uniform), whatever the type. Random bits matter:
// on constant operands (a memset) the tensor cores draw less power, the clocks stay higher than in training, and
// the timings flatter the kernels that draw the most (docs/performance.md).
void fill_operands(void* p, int64_t bytes, cudaDataType_t type, cudaStream_t stream) {
  constexpr uint64_t kSeed = 0x5eed;
  const GpuContext ctx{stream};
  if (type == CUDA_R_32F)
    fill_uniform(static_cast<float*>(p), bytes / 4, kSeed, ctx);
  else if (type == CUDA_R_16BF)
    fill_uniform(static_cast<bf16*>(p), bytes / 2, kSeed, ctx);
  else
    fill_uniform(static_cast<fp16*>(p), bytes / 2, kSeed, ctx);
}

}  // namespace

std::vector<double> Blas::time_algorithms(const Plan& plan, const cublasLtMatmulHeuristicResult_t* results, int count,
                                          float beta, cudaDataType_t type, int64_t a_elems, int64_t b_elems,
                                          int64_t c_elems, int64_t bias_elems, bool aux, cudaStream_t stream) {
  constexpr int64_t kMaxScratchBytes = int64_t{2} << 30;
  const int64_t elem_bytes = type == CUDA_R_32F ? 4 : 2;
  auto padded = [&](int64_t elems) { return (elems * elem_bytes + 255) / 256 * 256; };
  const int64_t a_bytes = padded(a_elems), b_bytes = padded(b_elems), c_bytes = padded(c_elems);
  const int64_t total = a_bytes + b_bytes + c_bytes * (aux ? 2 : 1) + padded(bias_elems);
  size_t free_bytes = 0, total_bytes = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  void* scratch = nullptr;
  if (total > std::min<int64_t>(kMaxScratchBytes, static_cast<int64_t>(free_bytes / 4)) ||
      cudaMalloc(&scratch, static_cast<size_t>(total)) != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
    return {};
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  struct Release {
    void* p;
    cudaEvent_t* events[2];
    ~Release() {
      for (cudaEvent_t* e : events)
        if (*e) cudaEventDestroy(*e);
      cudaFree(p);  // synchronises the device: every launch below has finished
    }
  } release{scratch, {&start, &stop}};
  ST_CUDA_CHECK(cudaEventCreate(&start));
  ST_CUDA_CHECK(cudaEventCreate(&stop));
  char* base = static_cast<char*>(scratch);
  fill_operands(base, total, type, stream);
  const void* sa = base;
  const void* sb = base + a_bytes;
  void* sc = base + a_bytes + b_bytes;
  GemmEpilogue ep;
  if (aux) ep.gelu_aux = base + a_bytes + b_bytes + c_bytes;
  if (bias_elems > 0) ep.bias = base + a_bytes + b_bytes + c_bytes * (aux ? 2 : 1);
  set_epilogue_pointers(plan.desc, ep);

  constexpr int kRounds = 3, kCalls = 5;
  const float alpha = 1.0f;
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    auto launch = [&] {
      return cublasLtMatmul(handle_, plan.desc, &alpha, sb, plan.first, sa, plan.second, &beta, sc, plan.out, sc,
                            plan.out, &results[i].algo, workspace_, workspace_bytes_, stream);
    };
    double best = std::numeric_limits<double>::infinity();
    if (results[i].state == CUBLAS_STATUS_SUCCESS && launch() == CUBLAS_STATUS_SUCCESS) {  // the first is a warm-up
      for (int r = 0; r < kRounds; ++r) {  // the best round: least disturbed by other streams
        ST_CUDA_CHECK(cudaEventRecord(start, stream));
        for (int c = 0; c < kCalls; ++c) ST_CUBLAS_CHECK(launch());
        ST_CUDA_CHECK(cudaEventRecord(stop, stream));
        ST_CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0;
        ST_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        best = std::min(best, static_cast<double>(elapsed) / kCalls);
      }
    }
    ms.push_back(best);
  }
  return ms;
}

bool Blas::take_preset(const Key& key, Plan& plan, const std::string& what) {
  auto preset = presets_.find(key);
  if (preset == presets_.end()) return false;
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(handle_, plan.desc, plan.first, plan.second, plan.out, plan.out, &preset->second, &check);
  ST_CHECK(status == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= workspace_bytes_,
           "the given cuBLASLt algorithm for ", what, " is not valid here (cublasLtMatmulAlgoCheck status ",
           static_cast<int>(status), ", workspace ", check.workspaceSize, " of ", workspace_bytes_, " bytes)");
  plan.algo = preset->second;
  plan.found = true;
  return true;
}

cublasStatus_t Blas::heuristic(const Plan& plan, int64_t align_first, int64_t align_second, int64_t align_out,
                               std::vector<cublasLtMatmulHeuristicResult_t>& results, int& returned) {
  returned = 0;
  cublasLtMatmulPreference_t pref = nullptr;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (status == CUBLAS_STATUS_SUCCESS) {
    set_pref_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first);
    set_pref_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second);
    set_pref_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_out);
    set_pref_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_out);
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.first, plan.second, plan.out, plan.out, pref,
                                            static_cast<int>(results.size()), results.data(), &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return status;
}

template <typename T>
bool Blas::try_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const T* a, int64_t lda,
                    int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, float beta, T* c, int64_t ldc,
                    int64_t stride_c, int batch, cudaStream_t stream, const GemmEpilogue& ep) {
  if (m == 0 || n == 0 || batch == 0) return true;
  ST_CHECK(m > 0 && n > 0 && k > 0 && batch > 0, "gemm: bad shape m=", m, " n=", n, " k=", k, " batch=", batch);
  ST_CHECK(!ep.dgelu_aux || (!ep.bias && !ep.gelu_aux), "gemm: the DGELU epilogue takes no bias and no GELU");
  const void* aux = ep.gelu_aux ? ep.gelu_aux : ep.dgelu_aux;
  // cuBLASLt's documented constraint on the GELU input matrix; its heuristic does not always enforce it.
  if (aux && (ldc % 8 != 0 || (batch > 1 && stride_c % 8 != 0))) return false;
  if (batch == 1) stride_a = stride_b = stride_c = 0;

  const cublasLtEpilogue_t epilogue = ep.dgelu_aux ? CUBLASLT_EPILOGUE_DGELU
                                      : ep.gelu_aux
                                          ? (ep.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                          : (ep.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  const int64_t es = sizeof(T);
  const int64_t align_a = alignment_of(a, stride_a * es), align_b = alignment_of(b, stride_b * es);
  const T* c_in = ep.c_in ? static_cast<const T*>(ep.c_in) : c;
  const int64_t align_c = std::min(alignment_of(c, stride_c * es), alignment_of(c_in, stride_c * es));
  const int64_t align_bias = alignment_of(ep.bias, 0), align_aux = alignment_of(aux, stride_c * es);
  // Everything the plan depends on; the heuristic's choice depends on the alignments too.
  const Key key = {kDataType<T>, trans_a,  trans_b, m,        n,       k,       lda,     ldb,        ldc,      stride_a,
                   stride_b,     stride_c, batch,   epilogue, align_a, align_b, align_c, align_bias, align_aux};

  std::unique_ptr<Plan>& slot = plans_[key];
  if (!slot) {
    auto plan = std::make_unique<Plan>();
    const cudaDataType_t dt = kDataType<T>;
    // fp32 accumulation for every type; CUBLAS_COMPUTE_32F (not _FAST_TF32) keeps float GEMMs in true fp32.
    ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    ST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (ep.bias) {
      const int32_t bias_type = dt;
      ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
    }
    if (aux) {
      ST_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldc, sizeof(ldc)));
      if (batch > 1) {
        ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                                       &stride_c, sizeof(stride_c)));
      }
    }
    // The heuristic reads the epilogue pointers for their alignment.
    set_epilogue_pointers(plan->desc, ep);

    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->first, dt, trans_b ? k : n, trans_b ? n : k, ldb));
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->second, dt, trans_a ? m : k, trans_a ? k : m, lda));
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->out, dt, n, m, ldc));
    set_layout_batch(plan->first, batch, stride_b);
    set_layout_batch(plan->second, batch, stride_a);
    set_layout_batch(plan->out, batch, stride_c);

    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    if (!take_preset(key, *plan, str_cat("the ", kTypeName<T>, " GEMM m=", m, " n=", n, " k=", k))) {
      std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(1, tune_candidates_)));
      int returned = 0;
      status = heuristic(*plan, align_b, align_a, align_c, results, returned);
      if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) {
        int pick = 0;
        if (tune_candidates_ > 1 && time_here_) {
          const int64_t a_elems = (batch - 1) * stride_a + (trans_a ? k : m) * lda;
          const int64_t b_elems = (batch - 1) * stride_b + (trans_b ? n : k) * ldb;
          const int64_t c_elems = (batch - 1) * stride_c + m * ldc;
          const std::vector<double> ms = time_algorithms(*plan, results.data(), returned, beta, dt, a_elems, b_elems,
                                                         c_elems, ep.bias ? n : 0, aux != nullptr, stream);
          if (!ms.empty() && std::isfinite(ms[0])) {
            pick = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
            ++tuning_stats_.plans;
            tuning_stats_.first_ms += ms[0];
            tuning_stats_.chosen_ms += ms[static_cast<size_t>(pick)];
          }
        }
        if (tune_candidates_ > 1 && agree_) {
          pick = agree_(pick);
          ST_CHECK(pick >= 0 && pick < returned && results[static_cast<size_t>(pick)].state == CUBLAS_STATUS_SUCCESS,
                   "GEMM tuning agreed on candidate ", pick, " of ", returned, " for m=", m, " n=", n, " k=", k,
                   ": the processes' cuBLASLt lists differ");
        }
        plan->algo = results[static_cast<size_t>(pick)].algo;
        plan->found = true;
      }
    }
    // NOT_SUPPORTED is the heuristic's "no algorithm"; anything else is a real failure.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) ST_CUBLAS_CHECK(status);
    slot = std::move(plan);
  }
  if (!slot->found) return false;

  set_epilogue_pointers(slot->desc, ep);
  ST_CUBLAS_CHECK(cublasLtMatmul(handle_, slot->desc, &alpha, b, slot->first, a, slot->second, &beta, c_in, slot->out,
                                 c, slot->out, &slot->algo, workspace_, workspace_bytes_, stream));
  return true;
}

template <typename T>
void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const T* a, int64_t lda,
                int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, float beta, T* c, int64_t ldc,
                int64_t stride_c, int batch, cudaStream_t stream, const GemmEpilogue& ep) {
  const bool ok = try_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                           batch, stream, ep);
  ST_CHECK(ok, "cuBLASLt has no algorithm for the ", kTypeName<T>, " GEMM m=", m, " n=", n, " k=", k,
           " trans_a=", trans_a, " trans_b=", trans_b, " lda=", lda, " ldb=", ldb, " ldc=", ldc, " batch=", batch,
           " bias=", ep.bias != nullptr, " gelu=", ep.gelu_aux != nullptr, " dgelu=", ep.dgelu_aux != nullptr);
}

// ---------------------------------------------------------------------------------------------------------
// Kernels

namespace {

constexpr int kBlock = 256;

Blas& blas_of(const GpuContext& ctx) {
  ST_CHECK(ctx.blas != nullptr, "GpuContext::blas is null; matmul needs a Blas");
  return *ctx.blas;
}

// out[r, o] = bias[o]: the starting value of the unfused bias path.
template <typename T>
__global__ void broadcast_rows_kernel(T* out, const T* bias, int64_t n, int OC) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = bias[i % OC];
}

// out[r, o] += bias[o], in fp32, rounded once.
template <typename T>
__global__ void add_rows_kernel(T* out, const T* bias, int64_t n, int OC) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % OC]));
}

// dbias in two deterministic passes. Pass 1: block (x, y) sums rows [y * chunk_rows, ...) of columns
// [32 x, 32 x + 32): each of 8 row lanes adds every 8th row in order, then lane sums are added in lane
// order. Pass 2: one thread per column adds the chunk partials in chunk order to dbias. The order depends
// only on (N, OC), never on scheduling. At most 128 chunks of at least 64 rows (matmul_bias_chunks,
// scratch_sizes.h).
constexpr int kBiasCols = 32;  // one warp across consecutive columns: coalesced rows
constexpr int kBiasLanes = 8;

int64_t bias_chunk_rows(int64_t N) { return matmul_bias_chunk_rows(N); }
int64_t bias_chunks(int64_t N) { return matmul_bias_chunks(N); }

// A thread covers kVec consecutive columns (one packed load a row); the sums, and so the bits, are the same for
// every kVec: each column's lane y still adds rows r0 + y, r0 + y + kBiasLanes, ... in order.
template <int kVec, typename T>
__global__ void bias_partial_kernel(float* partial, const T* dout, int64_t N, int OC, int64_t chunk_rows) {
  wait_for_predecessor();  // launched by launch_after_predecessor
  __shared__ float lanes[kBiasLanes][kBiasCols * kVec + 1];
  const int col = (blockIdx.x * kBiasCols + threadIdx.x) * kVec;
  const int64_t r0 = blockIdx.y * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float acc[kVec] = {};
  if (col < OC) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kBiasLanes) {
      float x[kVec];
      load<kVec>(dout + r * OC + col, x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += x[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) lanes[threadIdx.y][threadIdx.x * kVec + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float sum = 0.0f;
      for (int l = 0; l < kBiasLanes; ++l) sum += lanes[l][threadIdx.x * kVec + k];
      partial[blockIdx.y * int64_t{OC} + col + k] = sum;
    }
  }
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC,
                    const GpuContext& ctx) {
  if (N <= kGemvMaxRows) return gemv<T>(out, inp, nullptr, 0.0f, weight, bias, nullptr, N, C, OC, ctx);
  Blas& blas = blas_of(ctx);
  if (bias == nullptr) {
    blas.gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 0.0f, out, OC, 0, 1, ctx.stream);
    return;
  }
  GemmEpilogue ep;
  ep.bias = bias;
  if (blas.try_gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 0.0f, out, OC, 0, 1, ctx.stream, ep)) return;
  // No fused bias for this alignment: start out at the bias and accumulate the product (the CPU's order).
  const int64_t n = N * OC;
  broadcast_rows_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(out, bias, n, OC);
  ST_CUDA_CHECK_LAUNCH();
  blas.gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 1.0f, out, OC, 0, 1, ctx.stream);
}

template <typename T>
void matmul_forward_residual(T* out, const T* inp, const T* weight, const T* bias, const T* residual, int64_t N, int C,
                             int OC, const GpuContext& ctx) {
  if (N <= kGemvMaxRows) return gemv<T>(out, inp, nullptr, 0.0f, weight, bias, residual, N, C, OC, ctx);
  GemmEpilogue ep;
  ep.bias = bias;
  ep.c_in = residual;
  Blas& blas = blas_of(ctx);
  if (blas.try_gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 1.0f, out, OC, 0, 1, ctx.stream, ep)) return;
  // Unfused, in the CPU reference's order: out = residual + bias, then the product accumulated onto it.
  const int64_t n = N * OC;
  if (out != residual)
    ST_CUDA_CHECK(
        cudaMemcpyAsync(out, residual, sizeof(T) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, ctx.stream));
  if (bias != nullptr) {
    add_rows_kernel<<<grid_for(n, kBlock), kBlock, 0, ctx.stream>>>(out, bias, n, OC);
    ST_CUDA_CHECK_LAUNCH();
  }
  blas.gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 1.0f, out, OC, 0, 1, ctx.stream);
}

template <typename T>
void rmsnorm_matmul_forward(T* out, T* norm, float* rstd, const T* inp, const T* norm_weight, float eps,
                            const T* weight, const T* bias, int64_t N, int C, int OC, const GpuContext& ctx) {
  if (N <= kGemvMaxRows) return gemv<T>(out, inp, norm_weight, eps, weight, bias, nullptr, N, C, OC, ctx);
  rmsnorm_forward(norm, rstd, inp, norm_weight, eps, N, C, ctx);
  matmul_forward(out, norm, weight, bias, N, C, OC, ctx);
}

template <typename T>
void swiglu_matmul_forward_residual(T* out, T* mlp, const T* gate_up, const T* weight, const T* bias, const T* residual,
                                    int64_t N, int F, int OC, const GpuContext& ctx) {
  if (gemv_swiglu<T>(out, gate_up, weight, bias, residual, N, F, OC, ctx)) return;
  swiglu_forward(mlp, gate_up, N, F, ctx);
  matmul_forward_residual(out, mlp, weight, bias, residual, N, F, OC, ctx);
}

template <typename T>
void matmul_forward_gelu(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC,
                         const GpuContext& ctx) {
  if constexpr (!std::is_same_v<T, float>) {
    if (N <= kGemvMaxRows) {  // the product through gemv, then gelu_forward's kernel
      gemv<T>(pre_gelu, inp, nullptr, 0.0f, weight, bias, nullptr, N, C, OC, ctx);
      gelu_forward(out, pre_gelu, N * OC, ctx);
      return;
    }
    // One fused call. cuBLASLt does not document the accuracy of its GELU: invisible at bf16/fp16 output
    // precision, but float keeps gelu_forward's exact kernel (gelu.cu).
    GemmEpilogue ep;
    ep.bias = bias;
    ep.gelu_aux = pre_gelu;
    if (blas_of(ctx).try_gemm(false, true, N, OC, C, 1.0f, inp, C, 0, weight, C, 0, 0.0f, out, OC, 0, 1, ctx.stream,
                              ep)) {
      return;
    }
  }
  matmul_forward(pre_gelu, inp, weight, bias, N, C, OC, ctx);
  gelu_forward(out, pre_gelu, N * OC, ctx);
}

namespace {

// dbias[OC] (+)= column sums of dout[N, OC], in two deterministic passes through ctx's scratch, or with the second
// pass queued on ctx.column_sums.
template <typename T>
void bias_grad(T* dbias, const T* dout, int64_t N, int OC, const GpuContext& ctx, GradWrite write) {
  const int chunks = static_cast<int>(bias_chunks(N));
  ColumnSums* const deferred = ctx.column_sums;
  const size_t need = matmul_backward_scratch_bytes(N, OC);
  ST_CHECK(deferred != nullptr || (ctx.scratch != nullptr && ctx.scratch_bytes >= need), "matmul_backward needs ", need,
           " bytes of scratch for N=", N, " OC=", OC, "; GpuContext has ", ctx.scratch_bytes);
  float* partial = deferred ? deferred->reserve(int64_t{chunks} * OC) : static_cast<float*>(ctx.scratch);
  constexpr int kVec = 16 / sizeof(T);
  launch_packed<T>(OC % kVec == 0 && all_aligned(16, dout), [&](auto w) {
    constexpr int W = decltype(w)::value;
    const dim3 grid((OC + kBiasCols * W - 1) / (kBiasCols * W), chunks);
    launch_after_predecessor(bias_partial_kernel<W, T>, grid, dim3(kBiasCols, kBiasLanes), 0, ctx.stream, partial, dout,
                             N, OC, bias_chunk_rows(N));
  });
  if (deferred)
    deferred->queue(dbias, partial, chunks, OC, write);
  else
    finish_column_sums(dbias, partial, chunks, OC, ctx.stream, write);
}

}  // namespace

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int C,
                     int OC, const GpuContext& ctx, GradWrite dinp_write, GradWrite param_write) {
  if (N == 0) return;
  Blas& blas = blas_of(ctx);
  // dinp[N,C] (+)= dout[N,OC] @ weight[OC,C]
  const float dinp_beta = dinp_write == GradWrite::kAccumulate ? 1.0f : 0.0f;
  if (dinp) blas.gemm(false, false, N, C, OC, 1.0f, dout, OC, 0, weight, C, 0, dinp_beta, dinp, C, 0, 1, ctx.stream);
  // dweight[OC,C] (+)= dout^T @ inp[N,C]
  const float dweight_beta = param_write == GradWrite::kAccumulate ? 1.0f : 0.0f;
  if (dweight)
    blas.gemm(true, false, OC, C, N, 1.0f, dout, OC, 0, inp, C, 0, dweight_beta, dweight, C, 0, 1, ctx.stream);
  if (dbias) bias_grad(dbias, dout, N, OC, ctx, param_write);
}

template <typename T>
void matmul_backward_gelu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                          const T* pre_gelu, int64_t N, int C, int OC, const GpuContext& ctx, GradWrite param_write) {
  if (N == 0) return;
  bool fused = false;
  if constexpr (!std::is_same_v<T, float>) {
    // dinp[N,C] = gelu'(pre_gelu) * (dout[N,OC] @ weight[OC,C]); pre_gelu has dinp's layout.
    GemmEpilogue ep;
    ep.dgelu_aux = pre_gelu;
    fused = blas_of(ctx).try_gemm(false, false, N, C, OC, 1.0f, dout, OC, 0, weight, C, 0, 0.0f, dinp, C, 0, 1,
                                  ctx.stream, ep);
  }
  if (fused) {
    matmul_backward(static_cast<T*>(nullptr), dweight, dbias, dout, inp, weight, N, C, OC, ctx, GradWrite::kAccumulate,
                    param_write);
  } else {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ctx, GradWrite::kOverwrite, param_write);
    gelu_backward(dinp, pre_gelu, dinp, N * C, ctx, GradWrite::kOverwrite);
  }
}

#define ST_INSTANTIATE_MATMUL(T)                                                                                       \
  template void Blas::gemm<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, int64_t, const T*,      \
                              int64_t, int64_t, float, T*, int64_t, int64_t, int, cudaStream_t, const GemmEpilogue&);  \
  template bool Blas::try_gemm<T>(bool, bool, int64_t, int64_t, int64_t, float, const T*, int64_t, int64_t, const T*,  \
                                  int64_t, int64_t, float, T*, int64_t, int64_t, int, cudaStream_t,                    \
                                  const GemmEpilogue&);                                                                \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int64_t, int, int, const GpuContext&);             \
  template void rmsnorm_matmul_forward<T>(T*, T*, float*, const T*, const T*, float, const T*, const T*, int64_t, int, \
                                          int, const GpuContext&);                                                     \
  template void swiglu_matmul_forward_residual<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int, int,   \
                                                  const GpuContext&);                                                  \
  template void matmul_forward_gelu<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int, const GpuContext&);    \
  template void matmul_forward_residual<T>(T*, const T*, const T*, const T*, const T*, int64_t, int, int,              \
                                           const GpuContext&);                                                         \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int, int, const GpuContext&,     \
                                   GradWrite, GradWrite);                                                              \
  template void matmul_backward_gelu<T>(T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, int, int,         \
                                        const GpuContext&, GradWrite);

ST_INSTANTIATE_MATMUL(float)
ST_INSTANTIATE_MATMUL(bf16)
ST_INSTANTIATE_MATMUL(fp16)
#undef ST_INSTANTIATE_MATMUL

}  // namespace st::gpu
