// The order in which units are gathered, computed, reduce-scattered and released: one place, apart from
// the model math, so that a backend with a second stream can look ahead in the same list to prefetch
// unit u+1 (forward) or u-1 (backward) while u computes.
//
// Units: 0 = embedding, 1..L = blocks, L+1 = head (see model/units.h). The LM head is tied to the
// embedding's wte, so the head needs unit 0's parameters too, and unit 0's gradient gets contributions
// from the head (classifier) and from the embedding backward. Unit 0 is therefore gathered twice per
// micro-step (start of forward, and at the head) and its full-size gradient buffer lives from the head
// until the embedding backward, then is reduce-scattered once.
//
// One training micro-step:
//   gather 0, forward 0, release 0,
//   for each block u: gather u, forward u, release u,
//   gather L+1, gather 0, head forward+backward (grads of L+1 and 0), release 0,
//   reduce-scatter L+1, release L+1,
//   for each block u, last to first: gather u, backward u, reduce-scatter u, release u,
//   backward 0 (needs no parameters), reduce-scatter 0.
// Evaluation is the forward part with a head forward only (always resharding: there is no backward).
//
// keep_embedding = true keeps unit 0 gathered from its forward to the head instead ("release 0" and the
// second "gather 0" go): one gather of the large tied embedding per micro-step instead of two, for a backend
// whose unit-0 buffer is dedicated and so held anyway (the GPU's). The CPU backend allocates per gather, and
// keeps the default.
#pragma once

#include <string>
#include <vector>

namespace st {

enum class OpKind {
  kGather,               // all-gather the unit's parameter shards into its full buffer
  kForward,              // forward of an embedding or block unit
  kHeadForwardBackward,  // final LN, classifier and loss; in training also the start of backward
  kBackward,             // backward of an embedding or block unit into its full gradient buffer
  kReduceScatter,        // sum the unit's full gradient over ranks into each owner's shard (+=)
  kRelease,              // the unit's full parameter buffer is no longer needed
};

struct ScheduleOp {
  OpKind kind;
  int unit;
  bool operator==(const ScheduleOp& o) const { return kind == o.kind && unit == o.unit; }
};

// reshard_after_forward = false (ZeRO-2-like): blocks are not released after their forward and not
// gathered again in backward; they are released after their reduce-scatter.
std::vector<ScheduleOp> training_schedule(int n_layer, bool reshard_after_forward = true, bool keep_embedding = false);
std::vector<ScheduleOp> eval_schedule(int n_layer, bool keep_embedding = false);

// "gather 3", for logs and test messages.
std::string to_string(const ScheduleOp& op);

}  // namespace st
