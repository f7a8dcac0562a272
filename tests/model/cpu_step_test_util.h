// The CPU side of the CUDA models' comparisons (cuda_llama_model_gpu_test.cc, cuda_lora_model_gpu_test.cc): a random
// micro-batch, and one step of the family's CPU fp32 model over it, through every unit, with what those tests compare.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/unit_model.h"

namespace st::testing {

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// B sequences of c.seq_len tokens and as many targets, uniform over the vocabulary, from Rng(seed, 0).
inline Batch random_batch(const ModelConfig& c, int64_t B, uint64_t seed) {
  Rng rng(seed, 0);
  Batch b;
  for (int64_t i = 0; i < B * c.seq_len; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.next_below(c.vocab_size)));
    b.targets.push_back(static_cast<int32_t>(rng.next_below(c.vocab_size)));
  }
  return b;
}

// What one step leaves: the mean loss, each unit's gradient (its trainable segment) and the logits at the last
// position of sequence 0.
struct StepResult {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  std::vector<float> logits;
};

// Each token's loss gradient: the mean over the batch's B x seq_len targets.
inline float dloss_of(const ModelConfig& c, int64_t B) { return 1.0f / static_cast<float>(B * c.seq_len); }

// One micro-batch of B sequences through c.arch's CPU model on every unit's full parameters p (units.h), gradients
// from zero.
inline StepResult cpu_step(const ModelConfig& c, int64_t B, const std::vector<std::vector<float>>& p, const Batch& b) {
  const std::unique_ptr<UnitModel> m = model_family(c.arch).make_cpu_model(c, B, /*recompute=*/false);
  const int L = c.n_layer;
  StepResult r;
  for (const UnitLayout& u : m->units()) r.grads.emplace_back(static_cast<size_t>(u.numel), 0.0f);
  m->embedding_forward(p[0].data(), b.tokens.data(), B, c.seq_len);
  for (int l = 0; l < L; ++l) m->block_forward(l, p[1 + l].data());
  r.loss = m->head_forward_backward(p[L + 1].data(), p[0].data(), b.targets.data(), dloss_of(c, B),
                                    r.grads[L + 1].data(), r.grads[0].data()) /
           static_cast<double>(B * c.seq_len);
  for (int l = L - 1; l >= 0; --l) m->block_backward(l, p[1 + l].data(), r.grads[1 + l].data());
  m->embedding_backward(r.grads[0].data());
  m->head_logits(p[L + 1].data(), p[0].data(), c.seq_len - 1, &r.logits);
  return r;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

}  // namespace st::testing
