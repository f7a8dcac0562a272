// The GPU decoders (CudaGptDecoder, CudaLlamaDecoder) against the CPU decoders (GptDecoder, LlamaDecoder), for the
// tiny gpt2 and llama of decoder_test_util.h (grouped-query attention, q/k/v biases, llama3 RoPE scaling, an untied
// head): in fp32 the logits after the prompt's prefill and after every step agree to 1e-4 of their largest, and
// greedy generation gives the same tokens; in bf16 and fp16 (the CPU run on the weights rounded to T) the logits
// agree to 2e-2 and 1e-2 of their largest, which covers every activation's rounding to T. make_decoder picks the GPU
// decoder for train.device = cuda, in the compute type.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/gpu_kernel_test.h"
#include "decoder_test_util.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/model/cuda_decoder.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/generation.h"

namespace st {
namespace {

using testing::random_weights;

template <typename T>
constexpr DType kDType = std::is_same_v<T, float>  ? DType::kF32
                         : std::is_same_v<T, bf16> ? DType::kBF16
                                                   : DType::kF16;

// max |got - want| / max |want|.
double rel_max_error(const std::vector<float>& got, const std::vector<float>& want) {
  return got.size() == want.size() ? testing::max_rel_diff(got, testing::to_double(want)) : INFINITY;
}

// Every weight rounded through T (a no-op for float): the CPU reference's operands.
template <typename T>
std::vector<std::vector<float>> rounded(std::vector<std::vector<float>> w) {
  for (std::vector<float>& u : w) u = test::round_through<T>(std::move(u));
  return w;
}

template <typename T>
constexpr double kLogitTol = std::is_same_v<T, float>  ? 1e-4
                             : std::is_same_v<T, bf16> ? 2e-2
                                                       : 1e-2;

const std::vector<int32_t> kPrompt = {17, 250, 3, 3, 99, 12, 0};

template <typename T>
void expect_logits_match(const ModelConfig& c) {
  const std::vector<std::vector<float>> w = rounded<T>(random_weights(c, 21));
  const std::unique_ptr<Decoder> cpu = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  const std::unique_ptr<Decoder> gpu = load_decoder(make_cuda_decoder(c, kDType<T>, 0), w);
  EXPECT_LE(rel_max_error(gpu->prefill(kPrompt), cpu->prefill(kPrompt)), kLogitTol<T>) << "prefill";
  for (int32_t t : {4, 299, 42, 42, 7, 123, 250, 1, 64, 200, 5, 9, 180}) {  // to the last position
    const std::vector<float> want = cpu->step(t);
    EXPECT_LE(rel_max_error(gpu->step(t), want), kLogitTol<T>) << "position " << cpu->position() - 1;
  }
  EXPECT_TRUE(gpu->full());
  EXPECT_THROW(gpu->step(1), Error);
}

template <typename T>
class CudaDecoderGpu : public ::testing::Test {};
TYPED_TEST_SUITE(CudaDecoderGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(CudaDecoderGpu, Gpt2LogitsMatchTheCpuDecoder) {
  ST_SKIP_WITHOUT_GPU();
  expect_logits_match<TypeParam>(testing::tiny_gpt2());
}

TYPED_TEST(CudaDecoderGpu, LlamaLogitsMatchTheCpuDecoder) {
  ST_SKIP_WITHOUT_GPU();
  expect_logits_match<TypeParam>(testing::tiny_llama());
}

// fp32: greedy generation on the GPU gives the CPU's tokens, within the window and across a slide of the context.
TEST(CudaDecoderGpuGreedy, TokensEqualTheCpuDecoders) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    SCOPED_TRACE(to_string(c.arch));
    const std::vector<std::vector<float>> w = random_weights(c, 22);
    SamplingOptions greedy;
    greedy.temperature = 0;
    const std::vector<int32_t> want =
        generate_tokens(*load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w), kPrompt, 24, greedy);
    GenerationStats stats;
    EXPECT_EQ(generate_tokens(*load_decoder(make_cuda_decoder(c, DType::kF32, 0), w), kPrompt, 24, greedy, &stats),
              want);
    EXPECT_EQ(stats.slides, 1);
  }
}

// The step the GPU decoder replays as a CUDA graph (eager on the first step, captured on the second) picks the token
// sample_token picks from the logits of the same batched step on a twin decoder, at every position, for every compute
// type and family, greedy and sampled (the graph reads each step's draw index from device memory); and after a new
// prefill the graph reads the new positions.
template <typename T>
void expect_graph_steps_equal_host_steps(const ModelConfig& c) {
  const std::vector<std::vector<float>> w = random_weights(c, 31);
  const std::unique_ptr<Decoder> host = load_decoder(make_cuda_decoder(c, kDType<T>, 0), w);
  const std::unique_ptr<Decoder> graph = load_decoder(make_cuda_decoder(c, kDType<T>, 0), w);
  for (const SamplingOptions& o :
       {SamplingOptions{0.0, 0, 0}, SamplingOptions{1.0, 0, 8}, SamplingOptions{0.7, 40, 9}}) {
    for (int round = 0; round < 2; ++round) {
      const std::vector<int32_t> prompt(kPrompt.begin(), kPrompt.end() - round);
      int32_t token = sample_token(host->prefill(prompt), o, 0);
      graph->prefill(prompt);
      for (uint64_t i = 1; !host->full(); ++i) {
        const int32_t next = graph->step_batch_next({token}, o, {i})[0];
        token = sample_token(host->step_batch({token}), o, i);
        ASSERT_EQ(next, token) << "temperature " << o.temperature << " top_k " << o.top_k << " round " << round
                               << " position " << host->position();
      }
    }
  }
}

TEST(CudaDecoderGpuGraph, GraphStepsEqualHostSteps) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    SCOPED_TRACE(to_string(c.arch));
    expect_graph_steps_equal_host_steps<float>(c);
    expect_graph_steps_equal_host_steps<bf16>(c);
    expect_graph_steps_equal_host_steps<fp16>(c);
  }
}

// A batch of three sequences stepped together (two rows take the split-K attention and the GEMV; one sits a step out):
// each row's logits are what a decoder of one sequence gives for it, to fp32 rounding; the batch step replayed as a
// graph, greedy and sampled, picks sample_token's token of the same batched step on a twin decoder, row by row, and
// an idle row moves nothing.
TEST(CudaDecoderGpuBatch, RowsAreTheirSequencesOwnSteps) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    SCOPED_TRACE(to_string(c.arch));
    const std::vector<std::vector<float>> w = random_weights(c, 41);
    const std::vector<std::vector<int32_t>> prompts = {{5, 9, 200}, {77}, {1, 2, 3, 4, 5, 6, 7}};
    const std::unique_ptr<Decoder> batch = load_decoder(make_cuda_decoder(c, DType::kF32, 0, 3), w);
    const std::unique_ptr<Decoder> twin = load_decoder(make_cuda_decoder(c, DType::kF32, 0, 3), w);
    std::vector<int32_t> tokens;
    for (int s = 0; s < 3; ++s) {
      tokens.push_back(argmax_token(batch->prefill(prompts[static_cast<size_t>(s)], s)));
      twin->prefill(prompts[static_cast<size_t>(s)], s);
    }
    const std::vector<float> rows = batch->step_batch(tokens);
    const auto V = static_cast<ptrdiff_t>(c.vocab_size);
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> seq = prompts[static_cast<size_t>(s)];
      seq.push_back(tokens[static_cast<size_t>(s)]);
      const std::unique_ptr<Decoder> one = load_decoder(make_cuda_decoder(c, DType::kF32, 0), w);
      const std::vector<float> want = one->prefill(seq);
      EXPECT_LE(rel_max_error(std::vector<float>(rows.begin() + s * V, rows.begin() + (s + 1) * V), want), 1e-4)
          << "sequence " << s;
    }
    twin->step_batch(tokens);
    std::vector<int32_t> pending = tokens;  // each sequence's next token (an idle one keeps its own)
    for (int round = 0; round < 8; ++round) {
      std::vector<int32_t> step = pending;
      if (round == 2 || round == 5) step[1] = Decoder::kIdle;
      // Greedy and sampled rounds, each sampled round with new draw indices (its own per row).
      const SamplingOptions o = round % 2 == 0 ? SamplingOptions{0.0, 0, 0} : SamplingOptions{0.9, 20, 4};
      const auto first = static_cast<uint64_t>(3 * round);
      const std::vector<uint64_t> draws = {first, first + 1, first + 2};
      const int64_t before = batch->position(1);
      const std::vector<float> host = twin->step_batch(step);
      const std::vector<int32_t> got = batch->step_batch_next(step, o, draws);
      for (int s = 0; s < 3; ++s) {
        const auto j = static_cast<size_t>(s);
        if (step[j] == Decoder::kIdle) {
          EXPECT_EQ(got[j], Decoder::kIdle);
          EXPECT_EQ(batch->position(1), before);
          continue;
        }
        EXPECT_EQ(got[j],
                  sample_token(std::vector<float>(host.begin() + s * V, host.begin() + (s + 1) * V), o, draws[j]))
            << "round " << round << " sequence " << s;
        pending[j] = got[j];
      }
    }
  }
}

// Units handed over in the decoder's own 16-bit type (load_unit_half: uploaded as their bits, through the pinned
// chunks) give the decoder that the same values in fp32 give (load_unit: rounded on the host, exact for these): the
// same logits, bit for bit, in bf16 and fp16; a unit in the other 16-bit type is widened and rounded the same way.
TEST(CudaDecoderGpuHalfUnits, UnitsInTheComputeTypeAreUploadedAsTheyAre) {
  ST_SKIP_WITHOUT_GPU();
  const ModelConfig c = testing::tiny_llama();
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const HalfKind kind = dtype == DType::kBF16 ? HalfKind::kBF16 : HalfKind::kF16;
    const std::vector<std::vector<float>> w =
        dtype == DType::kBF16 ? rounded<bf16>(random_weights(c, 29)) : rounded<fp16>(random_weights(c, 29));
    const std::unique_ptr<Decoder> wide = load_decoder(make_cuda_decoder(c, dtype, 0), w);
    const std::unique_ptr<Decoder> half = make_cuda_decoder(c, dtype, 0);
    EXPECT_EQ(half->half_kind(), kind);
    for (size_t u = 0; u < w.size(); ++u) {
      std::vector<uint16_t> bits(w[u].size());
      round_to_half(w[u].data(), static_cast<int64_t>(bits.size()), kind, bits.data());
      half->load_unit_half(static_cast<int>(u), bits, kind);
    }
    ASSERT_TRUE(half->loaded());
    EXPECT_EQ(half->prefill(kPrompt), wide->prefill(kPrompt)) << to_string(dtype);
    EXPECT_EQ(half->step(42), wide->step(42)) << to_string(dtype);
  }
  // bf16 units to an fp16 decoder: widened, then rounded to fp16 as load_unit rounds fp32.
  const std::vector<std::vector<float>> w = rounded<bf16>(random_weights(c, 31));
  const std::unique_ptr<Decoder> wide = load_decoder(make_cuda_decoder(c, DType::kF16, 0), w);
  const std::unique_ptr<Decoder> other = make_cuda_decoder(c, DType::kF16, 0);
  for (size_t u = 0; u < w.size(); ++u) {
    std::vector<uint16_t> bits(w[u].size());
    round_to_half(w[u].data(), static_cast<int64_t>(bits.size()), HalfKind::kBF16, bits.data());
    other->load_unit_half(static_cast<int>(u), bits, HalfKind::kBF16);
  }
  EXPECT_EQ(other->prefill(kPrompt), wide->prefill(kPrompt));
}

TEST(CudaDecoderGpuFactory, MakeDecoderPicksTheDeviceAndType) {
  ST_SKIP_WITHOUT_GPU();
  Config cfg;
  cfg.model = testing::tiny_llama();
  cfg.train.device = Device::kCuda;
  const std::unique_ptr<Decoder> d = make_decoder(cfg, random_weights(cfg.model, 23), 0);
  EXPECT_EQ(d->describe().rfind("cuda/bf16 on ", 0), 0u) << d->describe();  // train.dtype auto: bf16 on cuda
  cfg.train.dtype = DType::kF16;
  EXPECT_EQ(make_decoder(cfg, random_weights(cfg.model, 23), 0)->describe().rfind("cuda/fp16 on ", 0), 0u);
  try {
    make_decoder(cfg, random_weights(cfg.model, 23), cuda_device_count());
    FAIL() << "a device past the visible ones";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("not visible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
