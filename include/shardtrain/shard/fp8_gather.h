// dist.fp8_gather: a unit's gather moves the blocks' FP8 weights as E4M3 codes instead of train.dtype (torchtitan's
// float8 all-gather), under train.fp8 = tensorwise or delayed, where a weight has one scale for both GEMMs that read
// it.
//
// A gathered segment (the unit's trainable tensors, or its frozen ones: a LoRA base) splits into its FP8 weights (the
// blocks' linear layers the policy applies to, model/fp8_policy.h) and the rest (norms, biases). Per gather:
//   1. each rank takes the maximum of |w| over its part of each FP8 weight (0 where it owns none), and the ranks
//      all-gather those maxima: each weight's maximum is the largest of them, the whole tensor's;
//   2. each rank casts its part of each weight to E4M3 with the scale of that maximum (the codes and the scale a cast
//      of the whole gathered tensor gives, kernels/fp8.h) into `code_stride` bytes, and the ranks all-gather them.
//      Under delayed, in a training pass, the scale is the amax history's pick for the weight instead
//      (model/fp8_history.h: its largest over the last steps, or the whole tensor's maximum while it holds none),
//      and that maximum is recorded in the step's maxima, as a cast of the gathered weight records it (on cuda, once
//      the history holds a step, the casts come first, scaled as the linear layers' casts ahead are, and take the
//      parts' maxima as they read: src/shard/fp8_gatherer.h);
//   3. the rest travels compacted: each rank's rest elements, `rest_slot` of them (zero-padded), all-gathered;
//   4. each rest element lands at its place in the gathered buffer, and each weight's codes where the weight lies: on
//      cuda at the first 256-byte boundary of its region (fp8_weight_codes, fp8_policy.h), then its inverse scale (a
//      float), which a GEMM reads from the weight's pointer (model/cuda_linear.h: the forward in place, the input
//      gradient transposed, no cast of W at all); on the CPU, which computes in fp32, the values the codes decode to,
//      which its linear layers take as cast (model/cpu_linear.h).
// The result is the bits of gathering in train.dtype and casting there; the bytes each rank receives per gather are
// received_bytes(): about half of bf16's, a quarter of fp32's.
//
// With dist.fp8_gather_keep a rank keeps its block (its codes and rest) and the weights' inverse scales from a training
// step's first gather of a unit: the step's later gathers of it (each micro-batch's forward, recompute's re-run, the
// backward) send the kept block, with no maxima to exchange and nothing to cast (kept_received_bytes()). What a rank
// sends changes only with its shard, which the optimizer writes between steps, and, under delayed, with the history,
// which a step's end pushes: the kept blocks serve one step.
//
//   const Fp8GatherSegment g = fp8_gather_segment(cfg, units[u], /*frozen=*/false, world, policy);
//   if (!g.empty()) for (const Fp8GatherPiece& p : g.pieces_of(rank)) ...
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/units.h"

namespace st {

// A run of a segment's elements, segment-relative, owned by `rank`. For a weight's piece, `weight` indexes
// Fp8GatherSegment::weights; -1 for a piece of the rest.
struct Fp8GatherPiece {
  int64_t offset = 0, count = 0;
  int rank = 0;
  int weight = -1;
  // Where the piece's codes (a weight's) or its compacted elements (the rest's) lie in the gathered staging: rank
  // `rank`'s block, at this element of it.
  int64_t staged_at = 0;
};

struct Fp8GatherWeight {
  int64_t offset = 0, numel = 0;  // segment-relative
  int64_t site = -1;              // its linear layer's site (fp8_site_index), whose W the delayed history keeps
};

struct Fp8GatherSegment {
  int64_t base = 0;   // the segment's first element in the unit's gathered buffer: 0, or the unit's numel (frozen)
  int64_t numel = 0;  // the segment's elements
  int64_t slot = 0;   // each rank's elements of it (padded_shard_size)
  int world = 1;
  Fp8Format format = Fp8Format::kE4M3;  // the weights' casts: the policy's forward.b (= input_grad.b)
  bool power_of_2 = false;
  int64_t code_stride = 0;  // bytes of codes each rank sends: slot rounded up to 4 (a float word for the CPU's gathers)
  int64_t rest_slot = 0;    // rest elements each rank sends: the most any rank owns
  std::vector<Fp8GatherWeight> weights;
  // Every rank's pieces in rank order, each rank's by offset: its parts of the weights, and its rest elements, which
  // it packs in that order into its rest_slot elements.
  std::vector<Fp8GatherPiece> pieces;

  bool empty() const { return weights.empty(); }
  std::vector<Fp8GatherPiece> pieces_of(int rank) const;
  // The bytes each rank sends in the codes' gather: its codes (code_stride), then its rest (rest_slot elements of
  // elem_bytes). Rank r's block lies at r x block_bytes in the gathered staging.
  int64_t block_bytes(int64_t elem_bytes) const { return code_stride + rest_slot * elem_bytes; }
  // Bytes one rank receives per gather: every rank's block and maxima.
  int64_t received_bytes(int64_t elem_bytes) const {
    return world * (block_bytes(elem_bytes) + static_cast<int64_t>(weights.size()) * 4);
  }
  // The same for a gather that sends a kept block (dist.fp8_gather_keep): every rank's block, no maxima.
  int64_t kept_received_bytes(int64_t elem_bytes) const { return world * block_bytes(elem_bytes); }
};

// The FP8 plan of a unit's trainable (frozen = false) or frozen segment at `world` ranks: empty where no tensor of it
// is an FP8 weight (a unit that is no block, a segment of LoRA adapters, an NF4 base, layers the policy does not apply
// to) or where one cast of a weight does not serve both
// its GEMMs (Fp8Policy::one_weight_cast).
Fp8GatherSegment fp8_gather_segment(const ModelConfig& cfg, const UnitLayout& unit, bool frozen, int world,
                                    const Fp8Policy& policy);

// dist.fp8_gather_keep: what a rank keeps of its gathers for a step's later ones, in bytes: for each unit's segment in
// FP8, its block (block_bytes(elem_bytes): its codes and its rest) and each weight's inverse scale.
int64_t fp8_gather_kept_bytes(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int world,
                              const Fp8Policy& policy, int64_t elem_bytes);

// What dist.fp8_gather adds to a rank's memory beside the gather buffers, in bytes, with elem_bytes elements for the
// rest, as the CUDA gatherer allocates it (the CPU's takes less): the send side (one rank's block and maxima) and the
// receive side (every rank's) for the largest block and the most weights of any segment, each weight's maximum and
// inverse scale, and the casts' scratch; 0 when no segment of `units` gathers in FP8. A rank's gathers run one at a
// time, so one set serves every unit.
int64_t fp8_gather_staging_bytes(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int world,
                                 const Fp8Policy& policy, int64_t elem_bytes);

}  // namespace st
