// What every family's GPU decoder (CudaGptDecoder, CudaLlamaDecoder) keeps besides its own activations: the device
// and its stream, cuBLASLt and kernel context, the weights in the compute type T (float, bf16 or fp16; uploaded once,
// rounded from fp32), the key/value cache in T ([n_layer, seq_len, NKV hs] for keys, the same for values), the token
// upload and the classifier's last row. The CUDA twin of what GptDecoder and LlamaDecoder share (kv_cache.h).
#pragma once

#include <cstdint>
#include <string>
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
  // Makes `device` current (kBadInput when it is not visible), allocates the weights (load_unit uploads them) and the
  // cache.
  CudaDecoderBase(const ModelConfig& cfg, int device);
  void store_unit(int u, std::vector<float>& values) override;

  // Unit u's weights on the device, in T.
  const T* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }
  // The greedy step as one CUDA graph: the token and position go up, the graph runs run() on one token and the argmax,
  // and the id comes back. The first call runs eagerly (cuBLASLt picks its algorithms), the second captures the graph.
  int32_t forward_greedy(int32_t token, int64_t pos) override;
  // The prompt's tokens and positions up, run, the logits row down.
  void forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) override;
  // The family's forward: n tokens (device memory) at the positions in device memory (a prompt's pos .. pos + n - 1,
  // or a step's one), through the classifier of the last into the logits row on the device. Its launches do not
  // depend on the positions and it never synchronises, so that a step can be captured.
  virtual void run(const int32_t* tokens, const int32_t* positions, int64_t n) = 0;
  // Attention of n fused qkv rows at positions[0 .. n) (device memory) with `layer`'s cache: appends their keys
  // and values there, then each row attends to positions 0 .. its own (decode_attention_at); out [n, NH hs].
  void attend(int layer, T* out, const T* qkv, const int32_t* positions, int64_t n);
  // The classifier over one normalised row xn [C] with w [Vp, C] into the logits row on the device; no synchronisation.
  void classify_on_device(const T* xn, const T* w);

  // Copies n host tokens to the device; the host array may go when the call returns.
  const int32_t* upload_tokens(const int32_t* tokens, int64_t n);
  // pos .. pos + n - 1 in device memory, for n rows of a prompt.
  const int32_t* upload_positions(int64_t pos, int64_t n);
  // The logits over the real vocabulary of one normalised row xn [C] with the classifier w [Vp, C], in fp32 on the
  // host; synchronises the stream.
  void classify_row(const T* xn, const T* w, std::vector<float>* logits);
  // The logits row over the real vocabulary, in fp32 on the host; synchronises the stream.
  void copy_logits(std::vector<float>* logits);

  int device_;  // first: made current before the stream, cuBLASLt and the buffers are created
  std::vector<UnitLayout> units_;
  CudaStream stream_;
  gpu::Blas blas_;
  gpu::GpuContext ctx_;

 private:
  std::string device_name_;
  std::vector<DeviceBuffer<T>> w_;
  DeviceBuffer<float> staging_;  // while loading
  // The greedy step: {token, position} up from pinned memory, the next id back; its graph once captured.
  PinnedBuffer<int32_t> step_host_;
  DeviceBuffer<int32_t> step_dev_;
  bool step_warm_ = false;
  cudaGraphExec_t step_graph_ = nullptr;
  int stored_ = 0;  // units loaded
  int64_t kv_width_, qkv_width_, layer_elems_;
  DeviceBuffer<T> k_, v_, logits_;
  DeviceBuffer<int32_t> tokens_, positions_;
  DeviceBuffer<unsigned char> attention_scratch_;  // decode_attention_at's split-K partials
};

}  // namespace st
