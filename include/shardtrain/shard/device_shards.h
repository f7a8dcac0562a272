// A CUDA rank's sharded state on the device, one entry per unit over this rank's ShardSpan (the same spans as the CPU
// backend's, so a checkpoint is the same file on either): every unit's fp32 gradient accumulator and, for the units
// whose optimizer is on the device, the fp32 master, AdamW's m and v and the compute-type copy that gathers read
// (none when T is float: gathers read the master). A unit whose optimizer is offloaded keeps its master and moments
// on the host (offload_pipeline.h); construction hands its initial state over. Each vector holds `slot` elements;
// the padding past the owned span stays zero.
//
//   DeviceShards<bf16> shards(cfg, units, rank, world, offloaded, sources, ctx, &for_offload);
//   nccl.all_gather<bf16>(shards.gather_source(u), shards.view(u).slot, full, stream);
//   shards.pull(u);   // view(u).param, m, v = the device state (checkpoint save, one unit at a time)
//   shards.release_view(u);
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/device_optimizer.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/shard_collectives.h"

namespace st {

template <typename T>
class DeviceShards {
 public:
  // The initial state of the offloaded units, for OffloadPipeline: per unit (empty for the others) the host state
  // (param from the seed, m and v zero) and, with optim.offload=optimizer, the device copy its gathers read.
  struct Offloaded {
    std::vector<UnitShard> states;
    std::vector<DeviceBuffer<T>> copies;
  };

  // Initialises every unit's shard from cfg.train.seed exactly as one process would (init_unit_range over the span).
  // The buffers gathers read are carved from `sources`, in unit order. `params_on_host`: optim.offload's
  // optimizer+params, whose offloaded units have no device copy. Synchronous.
  DeviceShards(const Config& cfg, const std::vector<UnitLayout>& units, int rank, int world,
               const std::vector<bool>& offloaded, bool params_on_host, WindowArena& sources,
               const gpu::GpuContext& ctx, Offloaded* initial);

  size_t size() const { return device_.size(); }
  // Span and slot of the unit's shard; param, m and v after pull() (checkpoint save), before push() (load).
  UnitShard& view(int unit) { return views_[static_cast<size_t>(unit)]; }
  const UnitShard& view(int unit) const { return views_[static_cast<size_t>(unit)]; }
  DeviceBuffer<float>& grad(int unit) { return device_[static_cast<size_t>(unit)].grad; }
  const float* master(int unit) const { return device_[static_cast<size_t>(unit)].master.data(); }
  // What a gather of a unit whose optimizer is on the device reads.
  const T* gather_source(int unit) const;
  // The unit's frozen tensors' shard (LoRA's base, units.h) in T, always on the device; what their gather reads.
  const T* frozen_source(int unit) const { return device_[static_cast<size_t>(unit)].frozen.data(); }
  // An NF4 unit's shard of its storage (model/nf4_base.h; view(unit).nf4_slot words), what its gather reads; and the
  // whole storage (gathered, or this shard at world 1) dequantised into `segment` (the unit's frozen_numel elements
  // of its gathered buffer), asynchronously on ctx.stream.
  const uint8_t* nf4_source(int unit) const { return device_[static_cast<size_t>(unit)].nf4.data(); }
  void dequantize_nf4(int unit, const uint8_t* storage, T* segment, const gpu::GpuContext& ctx) const;
  const Nf4UnitStorage& nf4_storage(int unit) const { return nf4_storage_[static_cast<size_t>(unit)]; }
  // What AdamW updates for a unit whose optimizer is on the device.
  typename DeviceOptimizer<T>::UnitState optimizer_state(int unit);
  // view(unit) = the device state (synchronous), and back (the compute copy rounded on ctx.stream). For units whose
  // optimizer is on the device; pull_frozen/push_frozen the same for the frozen shard of any unit, into and from the
  // `frozen` of the unit's view: view(unit), or an offloaded unit's host state (fp32 on the host, T on the device).
  // An NF4 unit's frozen view is its whole segment (model_backend.h): the pull fills it with unwritten_frozen(), and
  // the push quantises it on the device (synchronous) if it was written, and frees it.
  void pull(int unit);
  void push(int unit, const gpu::GpuContext& ctx);
  void pull_frozen(int unit, UnitShard& view);
  void push_frozen(int unit, UnitShard& view, const gpu::GpuContext& ctx);
  // Frees the unit's host view (after push: the device holds the state; a later pull() fills it again).
  void release_view(int unit);
  // How many units' views are filled now (pulled and not yet released).
  int64_t views_held() const;
  int64_t padding_elements() const;

 private:
  struct Device {
    DeviceBuffer<float> master, grad, m, v;  // master, m, v empty for an offloaded unit
    DeviceBuffer<T> compute;                 // empty when T is float, and for an offloaded unit
    DeviceBuffer<T> frozen;                  // the frozen tensors' shard (empty without them, and for NF4 units)
    DeviceBuffer<uint8_t> nf4;               // an NF4 unit's shard of its storage
  };
  // view.frozen, the unit's whole segment, quantised into its NF4 shard (synchronous); view.frozen is freed.
  void store_nf4(int unit, UnitShard& view, const gpu::GpuContext& ctx);

  const std::vector<UnitLayout>& units_;
  std::vector<Nf4UnitStorage> nf4_storage_;  // per unit (no parts for units without an NF4 base)
  std::vector<Device> device_;
  std::vector<UnitShard> views_;
};

}  // namespace st
