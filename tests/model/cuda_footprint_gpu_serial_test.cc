// The CUDA models allocate what the host footprint (cuda_footprint.h) counts: the device memory a CudaGpt and a
// CudaLlama take when constructed (cudaMemGetInfo before and after) is their activation_bytes, to within the driver's
// 2 MiB allocation granularity for each of their buffers, at shapes of about 1 GiB of activations, with and without
// LoRA and train.fp8 (whose models keep x^T codes in place of three inputs a block); and the adapters' buffers to
// the element.
// cudaMemGetInfo counts the whole device: the binary of *_gpu_serial_test.cc files runs each test alone (RUN_SERIAL).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "../common/gpu_test.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_lora.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/gpt2/cuda_gpt_model.h"
#include "shardtrain/model/llama/cuda_llama_model.h"

namespace st {
namespace {

constexpr int64_t kB = 8;
constexpr int64_t kPage = int64_t{2} << 20;

int64_t device_used() {
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b - free_b);
}

ModelConfig shape(ModelArch arch, bool lora = false) {
  ModelConfig m;
  if (lora) {
    m.lora.rank = 16;
    m.lora.targets = "all";
  }
  m.arch = arch;
  m.n_layer = 2;
  m.n_head = 16;
  m.n_embd = 1024;
  m.vocab_size = 256;
  m.seq_len = 1024;
  if (arch == ModelArch::kLlama) {
    m.n_kv_head = 4;
    m.ffn_dim = 2816;
  }
  return m;
}

// Device bytes the model took, against the footprint (and, with FP8, the casts' scales and maxima: 6 buffers more);
// `buffers` bounds the rounding.
template <typename Model>
void expect_allocates_its_footprint(const ModelConfig& m, bool recompute, int64_t buffers,
                                    Fp8Recipe fp8 = Fp8Recipe::kOff) {
  SCOPED_TRACE(::testing::Message() << "recompute " << recompute << " lora " << m.lora.enabled() << " fp8 "
                                    << to_string(fp8));
  const CudaModelFootprint f = cuda_model_footprint(m, kB, recompute, DType::kBF16, 0, fp8);
  CudaStream stream;
  gpu::Blas blas;
  DeviceBuffer<unsigned char> scratch(f.scratch_bytes);
  gpu::GpuContext ctx{stream.get(), &blas, scratch.data(), scratch.bytes()};
  const int64_t before = device_used();
  auto model = std::make_unique<Model>(m, kB, recompute, /*cudnn_attention=*/false, ctx,
                                       gpu::CudnnBackwardMode::kDeterministic, fp8_policy(fp8));
  const int64_t taken = device_used() - before;
  EXPECT_EQ(model->fp8_workspace_bytes(), cuda_linear_workspace_bytes(m, kB * m.seq_len, fp8));
  // CudaLinear's 6, and under delayed its history's 4 (cuda_fp8_history.h).
  const int64_t fp8_buffers = fp8 == Fp8Recipe::kOff ? 0 : fp8 == Fp8Recipe::kDelayed ? 10 : 6;
  EXPECT_GE(taken, f.activation_bytes - kPage);
  EXPECT_LE(taken, f.activation_bytes + (buffers + fp8_buffers) * kPage);
  EXPECT_GT(f.activation_bytes, int64_t{256} << 20);  // the shape is large beside the rounding
}

TEST(CudaFootprintGpu, CudaGptAllocatesItsFootprint) {
  ST_SKIP_WITHOUT_GPU();
  // Per block 12 buffers; 8 of the head and backward, the column sums, 2 layer outputs, the embedding output and
  // CudaLmIo's 5; with LoRA the adapters' h and dh.
  for (const Fp8Recipe fp8 : {Fp8Recipe::kOff, Fp8Recipe::kTensorwise})
    for (const bool lora : {false, true})
      for (const bool recompute : {false, true})
        expect_allocates_its_footprint<CudaGpt<bf16>>(shape(ModelArch::kGpt2, lora), recompute,
                                                      2 * 12 + 9 + 3 + 5 + (lora ? 2 : 0), fp8);
}

TEST(CudaFootprintGpu, CudaLlamaAllocatesItsFootprint) {
  ST_SKIP_WITHOUT_GPU();
  // Per block 10 buffers; 8 of the head and backward, the RoPE tables, 2 layer outputs, the embedding output and
  // CudaLmIo's 5; with LoRA the adapters' h and dh.
  for (const Fp8Recipe fp8 : {Fp8Recipe::kOff, Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed})
    for (const bool lora : {false, true})
      for (const bool recompute : {false, true})
        expect_allocates_its_footprint<CudaLlama<bf16>>(shape(ModelArch::kLlama, lora), recompute,
                                                        2 * 10 + 10 + 3 + 5 + (lora ? 2 : 0), fp8);
  // Tensorwise without LoRA keeps codes: 1 byte in place of 2 for 2 x 1,024 + 2,816 of a block's 8,192-token inputs.
  const ModelConfig m = shape(ModelArch::kLlama);
  EXPECT_EQ(cuda_model_footprint(m, kB, false, DType::kBF16, 0).activation_bytes -
                cuda_model_footprint(m, kB, false, DType::kBF16, 0, Fp8Recipe::kTensorwise).activation_bytes,
            2 * 8192 * (2 * 1024 + 2816));
}

// The adapters' buffers, below the allocation granularity above, to the element: CudaLora allocates what the
// footprint's lora term counts.
TEST(CudaFootprintGpu, CudaLoraAllocatesTheFootprintsLoraTerm) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    const ModelConfig m = shape(arch, /*lora=*/true);
    for (const Recompute recompute : {Recompute(false), Recompute(true), Recompute::first(1)}) {
      const int64_t want = arch == ModelArch::kLlama ? LlamaActivationSizes(m, kB, recompute).lora
                                                     : GptActivationSizes(m, kB, recompute).lora;
      const CudaLora<bf16> lora(m, build_units(m), kB * m.seq_len, recompute);
      EXPECT_EQ(lora.allocated_elems(), want) << "recomputed blocks " << recompute.count(m.n_layer);
      EXPECT_GT(want, 0);
    }
  }
}

}  // namespace
}  // namespace st
