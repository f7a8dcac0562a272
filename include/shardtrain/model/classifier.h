// The LM head's classifier and loss on the CPU, processed in row chunks: each chunk computes its logits, the
// cross-entropy and dlogits in place, and feeds them straight back, so fp32 logits for the whole batch never exist
// (at a 152k vocabulary they would be 600 KiB per token). Shared by every family's CPU model.
//
//   std::vector<float> chunk(classifier_chunk_rows(N, Vp) * Vp);
//   double loss_sum = chunked_classifier(x, w, targets, N, C, V, Vp, dloss, chunk.data(), losses, dx, dw);
#pragma once

#include <cstdint>

namespace st {

// Rows per chunk: the logits scratch stays near 32 MiB whatever the vocabulary (at least one row).
int64_t classifier_chunk_rows(int64_t N, int64_t Vp);

// x [N, C] (the final norm's output), w [Vp, C] (rows >= V are padding and never enter the loss), targets [N], of
// which those < 0 are not targets (loss 0, no gradient). Writes losses[N] (each token's cross-entropy) and returns
// their sum. With dx non-null (backward), accumulates dx [N, C] += and dw [Vp, C] += the gradients of sum(losses) x
// dloss. chunk holds classifier_chunk_rows(N, Vp) x Vp floats.
double chunked_classifier(const float* x, const float* w, const int32_t* targets, int64_t N, int C, int V, int Vp,
                          float dloss, float* chunk, float* losses, float* dx, float* dw);

}  // namespace st
