#include "shardtrain/shard/fp8_gather.h"

#include <algorithm>

#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

std::vector<Fp8GatherPiece> Fp8GatherSegment::pieces_of(int rank) const {
  std::vector<Fp8GatherPiece> out;
  for (const Fp8GatherPiece& p : pieces)
    if (p.rank == rank) out.push_back(p);
  return out;
}

Fp8GatherSegment fp8_gather_segment(const ModelConfig& cfg, const UnitLayout& unit, bool frozen, int world,
                                    const Fp8Policy& policy) {
  Fp8GatherSegment g;
  g.world = world;
  g.base = frozen ? unit.numel : 0;
  g.numel = frozen ? unit.frozen_numel : unit.numel;
  if (unit.kind != UnitKind::kBlock || g.numel == 0 || (frozen && unit.nf4_base) || !policy.one_weight_cast()) return g;
  const std::vector<LinearShape> shapes = block_linear_shapes(cfg);
  for (const LinearShape& l : shapes) {
    const TensorSpec* t = unit.find(l.weight);
    if (t == nullptr || t->frozen != frozen || !policy.applies(l.in, l.out)) continue;
    g.weights.push_back(
        {t->offset - g.base, t->numel, fp8_site_index(shapes, cfg.n_layer, {unit.layer, l.weight.c_str()})});
  }
  if (g.weights.empty()) return g;
  std::sort(g.weights.begin(), g.weights.end(),
            [](const Fp8GatherWeight& a, const Fp8GatherWeight& b) { return a.offset < b.offset; });
  g.format = policy.forward.b.format;
  g.power_of_2 = policy.power_of_2;
  g.slot = padded_shard_size(g.numel, world);
  g.code_stride = (g.slot + 3) / 4 * 4;
  // The segment as runs: each weight, and the rest between them.
  std::vector<Fp8GatherPiece> runs;
  int64_t at = 0;
  for (size_t w = 0; w < g.weights.size(); ++w) {
    if (g.weights[w].offset > at) runs.push_back({at, g.weights[w].offset - at, 0, -1, 0});
    runs.push_back({g.weights[w].offset, g.weights[w].numel, 0, static_cast<int>(w), 0});
    at = g.weights[w].offset + g.weights[w].numel;
  }
  if (at < g.numel) runs.push_back({at, g.numel - at, 0, -1, 0});
  for (int r = 0; r < world; ++r) {
    const ShardSpan span = shard_span(g.numel, r, world);
    int64_t packed = 0;  // the rank's rest elements so far
    for (const Fp8GatherPiece& run : runs) {
      const ShardSpan part = intersect(span, ShardSpan{run.offset, run.count});
      if (part.empty()) continue;
      Fp8GatherPiece p{part.offset, part.count, r, run.weight, 0};
      if (run.weight >= 0) {
        p.staged_at = part.offset - span.offset;  // the codes sit where the elements sit in the rank's slot
      } else {
        p.staged_at = packed;
        packed += part.count;
      }
      g.pieces.push_back(p);
    }
    g.rest_slot = std::max(g.rest_slot, packed);
  }
  return g;
}

int64_t fp8_gather_kept_bytes(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int world,
                              const Fp8Policy& policy, int64_t elem_bytes) {
  int64_t bytes = 0;
  for (const UnitLayout& u : units)
    for (bool frozen : {false, true}) {
      const Fp8GatherSegment g = fp8_gather_segment(cfg, u, frozen, world, policy);
      if (!g.empty()) bytes += g.block_bytes(elem_bytes) + 4 * static_cast<int64_t>(g.weights.size());
    }
  return bytes;
}

int64_t fp8_gather_staging_bytes(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int world,
                                 const Fp8Policy& policy, int64_t elem_bytes) {
  int64_t block = 0, k = 0;
  for (const UnitLayout& u : units)
    for (bool frozen : {false, true}) {
      const Fp8GatherSegment g = fp8_gather_segment(cfg, u, frozen, world, policy);
      block = std::max(block, g.block_bytes(elem_bytes));
      k = std::max(k, static_cast<int64_t>(g.weights.size()));
    }
  if (k == 0) return 0;
  // Blocks sent and received; maxima sent, received, each weight's, the delayed picks; inverse scales; the casts'.
  return (world + 1) * block + (world + 3) * 4 * k + 4 * k + 4 +
         static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(1));
}

}  // namespace st
