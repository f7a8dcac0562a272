#include "shardtrain/shard/device_shards.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/nf4.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

namespace {
// dst (device, T) = the fp32 host values rounded to T, through a device staging copy on ctx.stream; synchronous.
template <typename T>
void upload_rounded(DeviceBuffer<T>& dst, const std::vector<float>& host, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    ST_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host.data(), dst.bytes(), cudaMemcpyHostToDevice, ctx.stream));
  } else {
    DeviceBuffer<float> staging(dst.size());
    ST_CUDA_CHECK(cudaMemcpyAsync(staging.data(), host.data(), staging.bytes(), cudaMemcpyHostToDevice, ctx.stream));
    gpu::convert<T>(dst.data(), staging.data(), dst.size(), ctx);
  }
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // the staging buffer and the host values are done with
}
}  // namespace

template <typename T>
DeviceShards<T>::DeviceShards(const Config& cfg, const std::vector<UnitLayout>& units, int rank, int world,
                              const std::vector<bool>& offloaded, bool params_on_host, WindowArena& sources,
                              const gpu::GpuContext& ctx, Offloaded* initial)
    : units_(units) {
  std::vector<float> init;
  for (const UnitLayout& u : units) {
    UnitShard h;
    h.span = shard_span(u.numel, rank, world);
    h.slot = padded_shard_size(u.numel, world);
    Device d;
    d.grad = DeviceBuffer<float>(h.slot);
    // Every copy and memset goes on ctx.stream, which the conversion below and the training streams are ordered
    // after: cudaMemcpy from pageable memory may return before its DMA lands, and cudaMemset runs on the legacy
    // default stream, which our non-blocking streams do not wait for.
    zero_async(d.grad, d.grad.size(), ctx.stream);
    init.assign(static_cast<size_t>(h.slot), 0.0f);
    init_unit_range(u, cfg.model, cfg.train.seed, h.span.offset, h.span.end(), init.data());
    UnitShard state{h.span, h.slot, {}, {}, {}, {}};
    DeviceBuffer<T> copy;
    if (offloaded[static_cast<size_t>(u.index)]) {
      state.param = init;
      state.m.assign(init.size(), 0.0f);
      state.v.assign(init.size(), 0.0f);
      if (!params_on_host) copy = sources.take<T>(h.slot);
    } else {
      if constexpr (std::is_same_v<T, float>)
        d.master = sources.take<float>(h.slot);  // the gather's source
      else
        d.master = DeviceBuffer<float>(h.slot);
      d.m = DeviceBuffer<float>(h.slot);
      d.v = DeviceBuffer<float>(h.slot);
      ST_CUDA_CHECK(
          cudaMemcpyAsync(d.master.data(), init.data(), d.master.bytes(), cudaMemcpyHostToDevice, ctx.stream));
      zero_async(d.m, d.m.size(), ctx.stream);
      zero_async(d.v, d.v.size(), ctx.stream);
      if (!std::is_same_v<T, float>) {
        d.compute = sources.take<T>(h.slot);
        gpu::convert<T>(d.compute.data(), d.master.data(), h.slot, ctx);
      }
    }
    // The frozen base's shard, from the seed as one process would draw it, rounded to T on the device; an NF4 unit's
    // whole segment, quantised on the device, of which the rank keeps its words.
    nf4_storage_.push_back(u.nf4_base ? nf4_unit_storage(u) : Nf4UnitStorage{});
    if (u.nf4_base) {
      h.frozen_span = ShardSpan{0, u.frozen_numel};
      h.nf4_span = shard_span(nf4_storage_.back().words, rank, world);
      h.nf4_slot = padded_shard_size(nf4_storage_.back().words, world);
      d.nf4 = sources.take<uint8_t>(h.nf4_slot * 4);
      h.frozen.assign(static_cast<size_t>(u.frozen_numel), 0.0f);
      init_unit_range(u, cfg.model, cfg.train.seed, 0, u.frozen_numel, h.frozen.data(), Segment::kFrozen);
    } else {
      h.frozen_span = shard_span(u.frozen_numel, rank, world);
      h.frozen_slot = padded_shard_size(u.frozen_numel, world);
    }
    if (h.frozen_slot > 0) {
      d.frozen = sources.take<T>(h.frozen_slot);
      std::vector<float> frozen(static_cast<size_t>(h.frozen_slot), 0.0f);
      init_unit_range(u, cfg.model, cfg.train.seed, h.frozen_span.offset, h.frozen_span.end(), frozen.data(),
                      Segment::kFrozen);
      upload_rounded(d.frozen, frozen, ctx);
    }
    // `init` is refilled for the next unit: its copy must be done with it first.
    ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    device_.push_back(std::move(d));
    views_.push_back(std::move(h));
    if (u.nf4_base) store_nf4(u.index, views_.back(), ctx);
    // An offloaded unit's view is its host state (OffloadPipeline::state): it carries the frozen spans too.
    state.frozen_span = views_.back().frozen_span;
    state.frozen_slot = views_.back().frozen_slot;
    state.nf4_span = views_.back().nf4_span;
    state.nf4_slot = views_.back().nf4_slot;
    initial->states.push_back(std::move(state));
    initial->copies.push_back(std::move(copy));
  }
}

template <typename T>
const T* DeviceShards<T>::gather_source(int unit) const {
  const Device& d = device_[static_cast<size_t>(unit)];
  if constexpr (std::is_same_v<T, float>)
    return d.master.data();
  else
    return d.compute.data();
}

template <typename T>
typename DeviceOptimizer<T>::UnitState DeviceShards<T>::optimizer_state(int unit) {
  Device& d = device_[static_cast<size_t>(unit)];
  T* compute = std::is_same_v<T, float> ? nullptr : d.compute.data();
  return {d.master.data(), d.m.data(), d.v.data(), d.grad.data(), compute};
}

template <typename T>
void DeviceShards<T>::pull(int unit) {
  UnitShard& h = views_[static_cast<size_t>(unit)];
  const Device& d = device_[static_cast<size_t>(unit)];
  for (auto [host, dev] : {std::pair{&h.param, &d.master}, std::pair{&h.m, &d.m}, std::pair{&h.v, &d.v}}) {
    host->resize(static_cast<size_t>(h.slot));
    ST_CUDA_CHECK(cudaMemcpy(host->data(), dev->data(), dev->bytes(), cudaMemcpyDeviceToHost));
  }
}

template <typename T>
void DeviceShards<T>::push(int unit, const gpu::GpuContext& ctx) {
  UnitShard& h = views_[static_cast<size_t>(unit)];
  Device& d = device_[static_cast<size_t>(unit)];
  for (auto [host, dev] : {std::pair{&h.param, &d.master}, std::pair{&h.m, &d.m}, std::pair{&h.v, &d.v}}) {
    ST_CHECK(static_cast<int64_t>(host->size()) == h.slot, "push_unit without pull_unit");
    // On ctx.stream, so that the conversion reads the landed bytes (see the constructor).
    ST_CUDA_CHECK(cudaMemcpyAsync(dev->data(), host->data(), dev->bytes(), cudaMemcpyHostToDevice, ctx.stream));
  }
  if constexpr (!std::is_same_v<T, float>) gpu::convert<T>(d.compute.data(), d.master.data(), h.slot, ctx);
}

template <typename T>
void DeviceShards<T>::store_nf4(int unit, UnitShard& h, const gpu::GpuContext& ctx) {
  const UnitLayout& u = units_[static_cast<size_t>(unit)];
  const Nf4UnitStorage& s = nf4_storage_[static_cast<size_t>(unit)];
  Device& d = device_[static_cast<size_t>(unit)];
  ST_CHECK(static_cast<int64_t>(h.frozen.size()) == u.frozen_numel, "store_nf4 of ", u.name, " without its view");
  // One matrix at a time: its fp32 values uploaded and quantised into the whole storage, whose span is then kept.
  int64_t largest = 0;
  for (const Nf4Part& p : s.parts) largest = std::max(largest, p.numel);
  DeviceBuffer<uint8_t> storage(s.words * 4);
  DeviceBuffer<float> values(largest);
  DeviceBuffer<unsigned char> scratch(static_cast<int64_t>(gpu::nf4_quantize_scratch_bytes(largest)));
  gpu::GpuContext q = ctx;
  q.scratch = scratch.data();
  q.scratch_bytes = scratch.bytes();
  zero_async(storage, storage.size(), ctx.stream);  // the gaps between parts
  for (const Nf4Part& p : s.parts) {
    const TensorSpec& t = u.tensors[static_cast<size_t>(p.tensor)];
    const float* x = h.frozen.data() + (t.offset - u.numel) + p.first;
    if (!p.quantized) {
      ST_CUDA_CHECK(cudaMemcpyAsync(storage.data() + p.byte_offset, x, static_cast<size_t>(p.bytes),
                                    cudaMemcpyHostToDevice, ctx.stream));
      continue;
    }
    ST_CUDA_CHECK(cudaMemcpyAsync(values.data(), x, static_cast<size_t>(p.numel) * sizeof(float),
                                  cudaMemcpyHostToDevice, ctx.stream));
    gpu::nf4_quantize<float>(values.data(), p.numel, nf4_view(storage.data() + p.byte_offset, p.numel),
                             nf4_part_name(u, p), q);  // waits for ctx.stream
  }
  zero_async(d.nf4, d.nf4.size(), ctx.stream);  // the padding past the span
  ST_CUDA_CHECK(cudaMemcpyAsync(d.nf4.data(), storage.data() + h.nf4_span.offset * 4, h.nf4_span.count * 4,
                                cudaMemcpyDeviceToDevice, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // before the temporaries and the view go
  std::vector<float>().swap(h.frozen);
}

template <typename T>
void DeviceShards<T>::dequantize_nf4(int unit, const uint8_t* storage, T* segment, const gpu::GpuContext& ctx) const {
  const UnitLayout& u = units_[static_cast<size_t>(unit)];
  for (const Nf4Part& p : nf4_storage_[static_cast<size_t>(unit)].parts) {
    const TensorSpec& t = u.tensors[static_cast<size_t>(p.tensor)];
    T* out = segment + (t.offset - u.numel) + p.first;
    if (p.quantized)
      gpu::nf4_dequantize<T>(nf4_view(storage + p.byte_offset, p.numel), out, ctx);
    else
      gpu::convert<T>(out, reinterpret_cast<const float*>(storage + p.byte_offset), p.numel, ctx);
  }
}

template <typename T>
void DeviceShards<T>::pull_frozen(int unit, UnitShard& h) {
  const Device& d = device_[static_cast<size_t>(unit)];
  if (units_[static_cast<size_t>(unit)].nf4_base) {
    h.frozen.assign(static_cast<size_t>(units_[static_cast<size_t>(unit)].frozen_numel), unwritten_frozen());
    return;
  }
  h.frozen.assign(static_cast<size_t>(h.frozen_slot), 0.0f);
  if (h.frozen_slot == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    ST_CUDA_CHECK(cudaMemcpy(h.frozen.data(), d.frozen.data(), d.frozen.bytes(), cudaMemcpyDeviceToHost));
  } else {
    std::vector<T> raw(static_cast<size_t>(h.frozen_slot));
    ST_CUDA_CHECK(cudaMemcpy(raw.data(), d.frozen.data(), d.frozen.bytes(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < raw.size(); ++i) h.frozen[i] = static_cast<float>(raw[i]);
  }
}

template <typename T>
void DeviceShards<T>::push_frozen(int unit, UnitShard& h, const gpu::GpuContext& ctx) {
  const UnitLayout& u = units_[static_cast<size_t>(unit)];
  if (u.nf4_base) {
    if (!h.frozen.empty() && nf4_view_written(u, h.frozen.data())) store_nf4(unit, h, ctx);
    return;
  }
  if (h.frozen_slot == 0) return;
  ST_CHECK(static_cast<int64_t>(h.frozen.size()) == h.frozen_slot, "push_frozen without pull_frozen");
  upload_rounded(device_[static_cast<size_t>(unit)].frozen, h.frozen, ctx);
}

template <typename T>
void DeviceShards<T>::release_view(int unit) {
  UnitShard& h = views_[static_cast<size_t>(unit)];
  for (std::vector<float>* v : {&h.param, &h.m, &h.v, &h.frozen}) std::vector<float>().swap(*v);
}

template <typename T>
int64_t DeviceShards<T>::views_held() const {
  int64_t n = 0;
  for (const UnitShard& h : views_) n += h.param.empty() && h.frozen.empty() ? 0 : 1;
  return n;
}

template <typename T>
int64_t DeviceShards<T>::padding_elements() const {
  int64_t n = 0;
  for (const UnitShard& h : views_) n += h.slot - h.span.count;
  return n;
}

template class DeviceShards<float>;
template class DeviceShards<bf16>;
template class DeviceShards<fp16>;

}  // namespace st
