// The CUDA models' device memory as host arithmetic (cuda_footprint.h): every term for a small shape of each family,
// worked out by hand from the buffers the constructors allocate, in bf16 and fp32.
#include "shardtrain/model/cuda_footprint.h"

#include <gtest/gtest.h>

#include <vector>

#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {
namespace {

// B = 4 sequences of T = 64 at C = 64 over a 256-token vocabulary: BT = 256 rows, BTC = 16,384 elements.
constexpr int64_t kB = 4, kBT = 256, kBTC = 16384;

// CudaLmIo: the logits chunk holds every row (256 x 256), then 4-byte losses, tokens and targets and an 8-byte sum.
int64_t lm_io(int64_t t) { return kBT * 256 * t + kBT * 4 + 2 * kBT * 4 + 8; }

// embedding_backward: three 256-byte-aligned int32 arrays of BT (3 x 1,024), then CUB's bound for 256 items:
// alternate keys and values (2 x 1,024), its counters (1,024 + 1,024 = 2,048) and 1 MiB.
constexpr int64_t kEmbeddingScratch = 3 * 1024 + 2 * 1024 + 2048 + (int64_t{1} << 20);

ModelConfig gpt_shape() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 64;
  m.vocab_size = 256;
  m.seq_len = 64;
  return m;
}

ModelConfig llama_shape() {
  ModelConfig m = gpt_shape();
  m.arch = ModelArch::kLlama;
  m.n_kv_head = 2;  // head size 16: q/k/v width (4 + 2 x 2) x 16 = 128
  m.ffn_dim = 176;
  return m;
}

TEST(CudaFootprint, Gpt2SmallShapeByHand) {
  const ModelConfig m = gpt_shape();
  // Compute-type elements: 2 blocks x 15 BTC (ln1, atty, res2, ln2: 4; qkv: 3; fch, fch_gelu: 8), 2 block outputs,
  // the embedding output, and lnf, dresid, dlnf, dbuf_c (4), dqkv (3), dfch (4): 44 BTC.
  constexpr int64_t elems = 44 * kBTC;
  // fp32: per block the two LayerNorms' mean and rstd (4 BT) and att_lse (B x NH x T = 1,024); lnf's mean and rstd.
  constexpr int64_t floats = 2 * (4 * kBT + 1024) + 2 * kBT;
  // Column sums of a block backward: LayerNorm chunks of 8 rows (32 chunks) x 64 columns x 2 arrays x 4 bytes =
  // 16,384, twice; matmul bias chunks of 64 rows (4 chunks) x (64 + 256 + 64 + 192) columns x 4 bytes = 9,216.
  constexpr int64_t column_sums = 2 * 16384 + 9216;
  for (const DType d : {DType::kBF16, DType::kF32}) {
    const int64_t t = dtype_bytes(d);
    const CudaModelFootprint f = cuda_model_footprint(m, kB, /*recompute=*/false, d, 0);
    EXPECT_EQ(f.activation_bytes, elems * t + floats * 4 + lm_io(t) + column_sums) << to_string(d);
    // The largest kernel scratch is the embedding backward's sort.
    EXPECT_EQ(f.scratch_bytes, kEmbeddingScratch) << to_string(d);
    EXPECT_EQ(f.activation_bytes, cuda_gpt_footprint(m, kB, false, t, 0).activation_bytes);
  }
  // Recompute keeps one block's activations: 15 BTC and 4 BT + 1,024 floats fewer.
  EXPECT_EQ(cuda_model_footprint(m, kB, false, DType::kBF16, 0).activation_bytes -
                cuda_model_footprint(m, kB, true, DType::kBF16, 0).activation_bytes,
            15 * kBTC * 2 + (4 * kBT + 1024) * 4);
  // An attention scratch larger than the kernels' is what the scratch holds.
  EXPECT_EQ(cuda_model_footprint(m, kB, false, DType::kBF16, int64_t{3} << 20).scratch_bytes, int64_t{3} << 20);
}

TEST(CudaFootprint, LlamaSmallShapeByHand) {
  const ModelConfig m = llama_shape();
  // A block: norm1, atty, res2, norm2 (4 BTC = 65,536), qkv (BT x 128 = 32,768), gate_up and mlp (3 x BT x 176 =
  // 135,168): 233,472. Then 2 block outputs and the embedding output (3 BTC), normf, dresid, dnormf, dbuf_c (4 BTC),
  // dqkv (32,768), dmlp and dgate_up (135,168).
  constexpr int64_t block = 65536 + 32768 + 135168;
  constexpr int64_t elems = 2 * block + 7 * kBTC + 32768 + 135168;
  // fp32: per block rstd1, rstd2 (2 BT) and att_lse (1,024); rstdf (BT); RoPE cos and sin (2 x 64 x 8).
  constexpr int64_t floats = 2 * (2 * kBT + 1024) + kBT + 2 * 64 * 8;
  for (const DType d : {DType::kBF16, DType::kF32}) {
    const int64_t t = dtype_bytes(d);
    const CudaModelFootprint f = cuda_model_footprint(m, kB, false, d, 0);
    EXPECT_EQ(f.activation_bytes, elems * t + floats * 4 + lm_io(t)) << to_string(d);
    EXPECT_EQ(f.scratch_bytes, kEmbeddingScratch) << to_string(d);
  }
  const LlamaActivationSizes z(m, kB, /*recompute=*/true);
  EXPECT_EQ(z.blocks, 1);
  EXPECT_EQ(z.elems(), block + 7 * kBTC + 32768 + 135168);
}

// LoRA adds each adapter's h [BT, rank] for every block that keeps its activations, and one dh [BT, rank x the most
// adapters on one weight: llama's q, k, v], in the compute type; the kernel scratch stays the same.
TEST(CudaFootprint, LoraAddsTheAdaptersActivations) {
  for (ModelConfig m : {gpt_shape(), llama_shape()}) {
    const ModelConfig base = m;
    m.lora.rank = 3;
    m.lora.targets = m.is_llama() ? "q,k,v,gate,down" : "qkv,fc_proj";
    const int64_t adapters = m.is_llama() ? 5 : 2, widest_stack = m.is_llama() ? 3 : 1;
    for (const bool recompute : {false, true}) {
      const int64_t blocks = recompute ? 1 : 2;
      for (const DType d : {DType::kBF16, DType::kF32}) {
        const CudaModelFootprint with = cuda_model_footprint(m, kB, recompute, d, 0);
        const CudaModelFootprint without = cuda_model_footprint(base, kB, recompute, d, 0);
        EXPECT_EQ(with.activation_bytes - without.activation_bytes,
                  (blocks * adapters + widest_stack) * kBT * 3 * dtype_bytes(d))
            << m.lora.targets << " recompute " << recompute << " " << to_string(d);
        EXPECT_EQ(with.scratch_bytes, without.scratch_bytes);
      }
    }
  }
  ModelConfig m = llama_shape();
  m.lora.rank = 3;
  m.lora.targets = "all";  // 7 adapters
  EXPECT_EQ(LlamaActivationSizes(m, kB, false).lora, (2 * 7 + 3) * kBT * 3);
}

// train.fp8's codes (CudaLinear, in the model's kernel scratch): each GEMM's first operand as large as the widest of x
// and dy ([BT, in or out]), its second as large as the largest weight or x^T, dy^T's buffer [out, BT] for the widest
// output, each at a 256-byte boundary; its own allocation: three scale buffers of the most groups (rows of an
// activation, or of a weight), the scratch of a pair of casts and, under tensorwise, for each of the 2 x 4 sites three
// kept maxima and a 256-byte slot for its kept x^T codes' inverse scale. llama_shape's layers (out x in): qkv 128 x 64,
// o 64 x 64, gate_up 352 x 64, down 64 x 176, every dimension a multiple of 16.
TEST(CudaFootprint, Fp8WorkspaceCoversTheWidestOperand) {
  const ModelConfig m = llama_shape();
  const std::vector<LinearShape> shapes = block_linear_shapes(m);
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[0].out, 128);
  EXPECT_EQ(shapes[2].out, 352);
  EXPECT_EQ(shapes[3].in, 176);
  EXPECT_EQ(cuda_linear_workspace_bytes(m, kBT, Fp8Recipe::kOff), 0);
  EXPECT_EQ(cuda_linear_codes_bytes(m, kBT, Fp8Recipe::kOff), 0);
  auto aligned = [](int64_t b) { return (b + 255) / 256 * 256; };
  // x^T [176, BT] outgrows gate_up's weight; gate_up's weight scaled per row: 352 groups, more than BT's
  const int64_t a = kBT * 352, b = std::max<int64_t>(352 * 64, 176 * kBT), t = kBT * 352, groups = 352;
  const int64_t own = 3 * 4 * groups + static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * groups));
  const int64_t kept = 8 * (3 * 4 + 256);
  for (Fp8Recipe r : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise}) {
    EXPECT_EQ(cuda_linear_codes_bytes(m, kBT, r), aligned(a) + aligned(b) + aligned(t));
    EXPECT_EQ(cuda_linear_workspace_bytes(m, kBT, r), own + (r == Fp8Recipe::kTensorwise ? kept : 0));
  }
  // delayed: tensorwise's, and the history of 5 steps with the step's, the history's and the applied maxima
  EXPECT_EQ(cuda_linear_codes_bytes(m, kBT, Fp8Recipe::kDelayed),
            cuda_linear_codes_bytes(m, kBT, Fp8Recipe::kTensorwise));
  EXPECT_EQ(cuda_linear_workspace_bytes(m, kBT, Fp8Recipe::kDelayed, 5), own + kept + (5 + 3) * 8 * 3 * 4);
  ModelConfig lora = m;  // the maxima kept, no codes
  lora.lora.rank = 4;
  EXPECT_EQ(cuda_linear_workspace_bytes(lora, kBT, Fp8Recipe::kTensorwise), own + 8 * 3 * 4);
  ModelConfig odd = m;
  odd.n_embd = 48;  // 3 heads of 16, one K/V head: qkv (3 + 2) x 16 = 80 x 48, o 48 x 48
  odd.n_head = 3;
  odd.n_kv_head = 1;
  odd.ffn_dim = 40;  // gate_up 80 x 48; down 48 x 40, whose 40 is no multiple of 16: down stays in train.dtype
  EXPECT_EQ(cuda_linear_codes_bytes(odd, kBT, Fp8Recipe::kTensorwise),
            aligned(kBT * 80) + aligned(kBT * 48) + aligned(kBT * 80));
  EXPECT_EQ(cuda_linear_workspace_bytes(odd, kBT, Fp8Recipe::kTensorwise),
            3 * 4 * kBT + static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * kBT)) + kept);
}

// The codes share the kernel scratch: with train.fp8 on, the footprint's scratch is the larger of the kernels' and the
// codes. With a wide MLP (gate_up's gradient [BT, 8192]) and no attention scratch the codes are the larger; with 64 MiB
// of attention scratch they cost nothing. The activations change only by the inputs kept as x^T codes (below).
TEST(CudaFootprint, Fp8CodesShareTheKernelScratch) {
  ModelConfig m = llama_shape();
  m.ffn_dim = 4096;
  const int64_t codes = cuda_linear_codes_bytes(m, kBT, Fp8Recipe::kTensorwise);
  for (int64_t attention : {int64_t{0}, int64_t{64} << 20}) {
    const CudaModelFootprint off = cuda_model_footprint(m, kB, false, DType::kBF16, attention);
    const CudaModelFootprint on = cuda_model_footprint(m, kB, false, DType::kBF16, attention, Fp8Recipe::kTensorwise);
    EXPECT_EQ(on.scratch_bytes, std::max(off.scratch_bytes, codes)) << attention;
    EXPECT_EQ(on.scratch_bytes, attention == 0 ? codes : off.scratch_bytes) << attention;
    EXPECT_EQ(off.activation_bytes - on.activation_bytes, 2 * kBT * (64 + 64 + 4096)) << attention;
  }
}

// Tensorwise FP8 keeps the x^T codes of the q/k/v, gate/up and down inputs (norm1, norm2 [C]; mlp [F]) in place of
// the inputs: a byte an element instead of the compute type's, in every kept block. Not where a layer is off FP8
// (down's 40 inputs), nor with rowwise scales, LoRA (its adapters read x), a sequence length that is no multiple of 16
// (a weight gradient in the compute type reads x) or the policy's keep_input_codes off.
TEST(CudaFootprint, LlamaKeepsInputCodesUnderTensorwiseFp8) {
  const ModelConfig m = llama_shape();  // C 64, F 176, 2 layers
  const Fp8Policy tensorwise = fp8_policy(Fp8Recipe::kTensorwise);
  const LlamaActivationSizes z(m, kB, false, tensorwise);
  EXPECT_TRUE(z.coded_qkv && z.coded_gate_up && z.coded_down);
  EXPECT_EQ(z.block_code_bytes(), kBT * (64 + 64 + 176));
  for (const bool recompute : {false, true}) {
    const int64_t blocks = recompute ? 1 : 2;
    for (const DType d : {DType::kBF16, DType::kF32}) {
      const int64_t t = dtype_bytes(d);
      EXPECT_EQ(cuda_model_footprint(m, kB, recompute, d, 0).activation_bytes -
                    cuda_model_footprint(m, kB, recompute, d, 0, Fp8Recipe::kTensorwise).activation_bytes,
                blocks * kBT * (64 + 64 + 176) * (t - 1))
          << recompute << " " << to_string(d);
    }
  }
  ModelConfig odd = m;
  odd.ffn_dim = 40;
  const LlamaActivationSizes o(odd, kB, false, tensorwise);
  EXPECT_TRUE(o.coded_qkv);
  EXPECT_TRUE(o.coded_gate_up);  // 80 x 64 in FP8
  EXPECT_FALSE(o.coded_down);    // 64 x 40 not
  EXPECT_EQ(o.block_code_bytes(), kBT * (64 + 64));
  ModelConfig lora = m;
  lora.lora.rank = 4;
  ModelConfig short_seq = m;
  short_seq.seq_len = 24;
  Fp8Policy off = tensorwise;
  off.keep_input_codes = false;
  for (const LlamaActivationSizes& none :
       {LlamaActivationSizes(m, kB, false, fp8_policy(Fp8Recipe::kRowwise)),
        LlamaActivationSizes(lora, kB, false, tensorwise), LlamaActivationSizes(short_seq, kB, false, tensorwise),
        LlamaActivationSizes(m, kB, false, off), LlamaActivationSizes(m, kB, false)})
    EXPECT_EQ(none.block_code_bytes(), 0);
}

// GPT-2 alike: ln1, ln2 [C] and the GELU's output [4C] as codes, 6 C bytes a token instead of 6 C elements.
TEST(CudaFootprint, Gpt2KeepsInputCodesUnderTensorwiseFp8) {
  const ModelConfig m = gpt_shape();  // C 64, 2 layers
  const GptActivationSizes z(m, kB, false, fp8_policy(Fp8Recipe::kTensorwise));
  EXPECT_TRUE(z.coded_qkv && z.coded_fc && z.coded_proj);
  EXPECT_EQ(z.block_code_bytes(), 6 * kBTC);
  EXPECT_EQ(z.block_elems(), 9 * kBTC);
  for (const bool recompute : {false, true})
    for (const DType d : {DType::kBF16, DType::kF32})
      EXPECT_EQ(cuda_model_footprint(m, kB, recompute, d, 0).activation_bytes -
                    cuda_model_footprint(m, kB, recompute, d, 0, Fp8Recipe::kTensorwise).activation_bytes,
                (recompute ? 1 : 2) * 6 * kBTC * (dtype_bytes(d) - 1))
          << recompute << " " << to_string(d);
  EXPECT_EQ(GptActivationSizes(m, kB, false, fp8_policy(Fp8Recipe::kRowwise)).block_code_bytes(), 0);
}

TEST(CudaFootprint, ClassifierChunksSplitRowsEvenly) {
  ModelConfig m = gpt_shape();
  m.vocab_size = 50257;                                       // padded to 50304: at most 5,336 rows of 256 Mi elements
  EXPECT_EQ(cuda_classifier_chunk_rows(m, 16 * 1024), 4096);  // 4 chunks
  EXPECT_EQ(cuda_classifier_chunk_rows(m, 5000), 5000);       // one
  EXPECT_EQ(cuda_classifier_chunk_rows(m, 5337), 2669);       // two, split evenly
  EXPECT_EQ(cuda_lm_io_device_bytes(m, 1, 2), 64 * 50304 * 2 + 64 * 12 + 8);
}

}  // namespace
}  // namespace st
