// What every family's GPU decoder (CudaGptDecoder, CudaLlamaDecoder) keeps besides its own activations: the device
// and its stream, cuBLASLt and kernel context, the weights in the compute type T (float, bf16 or fp16; uploaded once,
// rounded from fp32), the key/value cache in T ([layers, seq_len, NKV hs] for keys, the same for values), the hidden
// rows, the token upload and the classifier's rows; and the forward, which runs the family's three parts (embed,
// block, head). A stage of a layer split (decoder_stage.h) holds its units' weights and its layers' caches alone, and
// passes the hidden rows between the ranks through pinned host memory. The CUDA twin of CpuDecoderBase
// (cpu_decoder_base.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaDecoderBase : public Decoder {
 public:
  // "cuda/bf16 on NVIDIA H200".
  std::string describe() const override;
  ~CudaDecoderBase() override;

 protected:
  // Makes `device` current (kBadInput when it is not visible), allocates the weights of the units its stage holds
  // (load_unit uploads them) and a cache of the stage's layers for each of max_batch sequences.
  CudaDecoderBase(const ModelConfig& cfg, int device, int max_batch, const DecoderStage& stage);
  void store_unit(int u, std::vector<float>& values) override;
  HalfKind half_kind() const override {
    return std::is_same_v<T, bf16> ? HalfKind::kBF16 : std::is_same_v<T, fp16> ? HalfKind::kF16 : HalfKind::kNone;
  }
  // Values in T already: copied into the pinned chunks and uploaded as store_unit uploads its rounded ones.
  void store_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind) override;
  void use_sequence(int seq) override { seq_ = seq; }
  // The rows a forward may run: a prompt's (seq_len) or a batched step's (max_batch).
  int64_t max_rows() const { return std::max<int64_t>(config().seq_len, max_batch()); }

  // Unit u's weights on the device, in T.
  const T* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }
  // The step as a CUDA graph per batch size and sampling options: tokens, positions (and a sampled step's draw
  // indices) go up, the graph runs run() and argmax_rows or sample_rows, and the ids come back. A graph's first call
  // runs eagerly (cuBLASLt picks its algorithms), the second captures it; each new set of options adds its graphs. A
  // stage of a split runs its part eagerly, its transfers being host calls, and only the last chooses the tokens.
  void forward_batch_next(const int32_t* tokens, const int32_t* positions, int n, const SamplingOptions& o,
                          const uint64_t* draws, int32_t* next) override;
  // The tokens and positions up, run, the logits rows down.
  void forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) override;
  void forward_batch(const int32_t* tokens, const int32_t* positions, int n, std::vector<float>* logits) override;
  // The forward: n tokens (device memory) at the positions in device memory, through the final norm and the
  // classifier into the logits rows on the device. `batch`: row r is sequence r's step (positions negative for an
  // idle row), every row classified; otherwise the rows are the current sequence's (a prompt's pos .. pos + n - 1, or
  // a step's one) and the last is classified. Its launches do not depend on the positions and, unless split, it never
  // synchronises, so that a step can be captured. A stage of a split takes the hidden rows from the previous rank
  // instead of embedding, runs its layers, and sends them to the next rank instead of classifying (synchronising).
  void run(const int32_t* tokens, const int32_t* positions, int64_t n, bool batch);
  // The family's forward in three parts over the hidden rows x_ [n, n_embd], launched on the stream:
  // the embedding of n tokens at the positions into x_;
  virtual void embed(const int32_t* tokens, const int32_t* positions, int64_t n) = 0;
  // block `layer` on x_ in place (attend() appends to the caches);
  virtual void block(int layer, const int32_t* positions, int64_t n, bool batch) = 0;
  // the final norm of x_'s rows [first, first + rows) and the classifier (classify_on_device or
  // rmsnorm_classify_on_device).
  virtual void head(int64_t first, int64_t rows) = 0;
  // Attention of n fused qkv rows at positions[0 .. n) (device memory): turns their query and key heads by RoPE when
  // given its tables, appends their keys and values to the cache of the current sequence (batch: of sequence r for
  // row r), then each row attends to positions 0 .. its own; out [n, NH hs]. With RoPE, rope_append_attend_at (one
  // kernel where each row's only new key is its own, qkv then left unturned); without, kv_append_at and
  // decode_attention_at.
  void attend(int layer, T* out, T* qkv, const int32_t* positions, int64_t n, bool batch,
              const float* rope_cos = nullptr, const float* rope_sin = nullptr);
  // ctx_ with the step kernels' scratch (scratch_).
  gpu::GpuContext step_context() const;
  // The classifier over `rows` normalised rows xn [rows, C] with w [Vp, C] into the logits rows on the device; no
  // synchronisation.
  void classify_on_device(const T* xn, const T* w, int64_t rows = 1);
  // The same after the final RMSNorm of `rows` rows x [rows, C] (norm_weight, eps), through rmsnorm_matmul_forward:
  // one kernel for a step's rows; norm [rows, C] and rstd [rows] its scratch for more.
  void rmsnorm_classify_on_device(const T* x, const T* norm_weight, float eps, const T* w, int64_t rows, T* norm,
                                  float* rstd);

  // Copies n host tokens to the device; the host array may go when the call returns.
  const int32_t* upload_tokens(const int32_t* tokens, int64_t n);
  // pos .. pos + n - 1 in device memory, for n rows of a prompt.
  const int32_t* upload_positions(int64_t pos, int64_t n);
  // The first `rows` logits rows over the real vocabulary, in fp32 on the host; synchronises the stream.
  void copy_logits(std::vector<float>* logits, int64_t rows = 1);

  int device_;  // first: made current before the stream, cuBLASLt and the buffers are created
  std::vector<UnitLayout> units_;
  CudaStream stream_;
  gpu::Blas blas_;
  gpu::GpuContext ctx_;
  DeviceBuffer<T> x_;  // the hidden rows [max_rows, n_embd]

 private:
  std::string device_name_;
  std::vector<DeviceBuffer<T>> w_;
  // While loading: two pinned chunks of a unit's weights in T, each uploaded while the next is filled.
  static constexpr int64_t kUploadChunk = kDecoderUploadChunk;
  // Uploads unit u's weights through the two chunks, fill(at, n, chunk) writing elements [at, at + n) of them in T's
  // bits into a chunk; returns once they are on the device.
  void upload_in_chunks(int u, const std::function<void(int64_t at, int64_t n, uint16_t* chunk)>& fill);
  PinnedBuffer<T> upload_;
  CudaEvent chunk_uploaded_[2];
  // A captured step: its rows and the options its token choice was captured with (greedy: all zero).
  struct StepKey {
    int rows;
    double temperature;
    int64_t top_k;
    uint64_t seed;
    bool operator<(const StepKey& o) const {
      return std::tie(rows, temperature, top_k, seed) < std::tie(o.rows, o.temperature, o.top_k, o.seed);
    }
  };
  // Runs `step` as the graph of `key`: eagerly on its first call, captured on the second, replayed after.
  void run_step_graph(const StepKey& key, const std::function<void()>& step);

  // The steps: tokens [0, B), positions [B, 2 B) up from pinned memory, ids [2 B, 3 B) back (B = max_batch), and a
  // sampled step's draw indices up; each key's graph once captured, and whether it ran eagerly.
  PinnedBuffer<int32_t> step_host_;
  DeviceBuffer<int32_t> step_dev_;
  PinnedBuffer<uint64_t> draws_host_;
  DeviceBuffer<uint64_t> draws_dev_;
  std::map<StepKey, cudaGraphExec_t> graphs_;
  std::set<StepKey> warm_;
  int seq_ = 0;
  int64_t kv_width_, qkv_width_, seq_elems_, layer_elems_;
  DeviceBuffer<T> k_, v_, logits_;  // logits_: the last stage's
  PinnedBuffer<T> rows_host_;       // a split's hidden rows on their way between the ranks
  DeviceBuffer<int32_t> tokens_, positions_;
  // The step kernels' scratch, in stream order: the split-K attention's partials, then sample_rows's candidates or
  // argmax_rows's chunks.
  DeviceBuffer<unsigned char> scratch_;
  DeviceBuffer<unsigned> arrivals_;  // the split-K attention's counters of finished splits, zero between calls
};

}  // namespace st
