// The full-unit buffers of a CUDA rank: gathered parameters and full gradients in the compute type T, allocated once
// and handed to the units in turn. Unit 0 (the tied embedding, live at both ends of the step) has a parameter and a
// gradient buffer of its own; the other units share two pools (memory_plan.h sizes them). Each buffer carries two
// events, recorded and waited on by the caller's streams: `ready` when its contents are complete (gather done,
// backward done), `free` when its last reader has finished (compute done, reduce-scatter done). At one rank the
// parameter buffers are sized by the units that gather copies (memory_plan.h's units_in_place); where none does they
// hold no elements and serve only to order the schedule's gathers and releases.
//
//   Buffer& b = buffers.take_params(u);    // the least recently released free buffer
//   b.free.wait_on(comm);  nccl.all_gather(src, slot, b.data.data(), comm);  b.ready.record(comm);
//   ...
//   buffers.release_params(u, compute);    // records b.free on the compute stream
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/shard/shard_collectives.h"

namespace st {

template <typename T>
class UnitBuffers {
 public:
  struct Buffer {
    DeviceBuffer<T> data;
    int unit = -1;         // the unit it holds, or -1
    int64_t released = 0;  // when it was last handed back, to reuse the oldest first
    CudaEvent ready, free;
  };

  // `units` units; unit 0's parameter buffer holds emb_elements, the parameter pool's unit_elements, and the gradient
  // buffers emb_grad_elements and unit_grad_elements (fewer with frozen tensors, which have no gradient). Parameter
  // buffers are carved from
  // `params`, gradient buffers from `grads` (unit 0's first, then the pool's, in that order on every rank). The
  // gradient pool is zeroed once: no unit writes past its elements, so what its reduce-scatter sends from there
  // stays 0.
  UnitBuffers(int units, int64_t emb_elements, int64_t unit_elements, int64_t emb_grad_elements,
              int64_t unit_grad_elements, int param_pool, int grad_pool, WindowArena& params, WindowArena& grads);

  // The buffer holding the unit's parameters (gradient), or null.
  Buffer* params(int unit) { return params_of_[static_cast<size_t>(unit)]; }
  Buffer* grads(int unit) { return grads_of_[static_cast<size_t>(unit)]; }
  // Whether take_params(unit) would find a buffer: the unit holds none and one is free.
  bool can_take_params(int unit);
  // A free buffer, now holding the unit; throws when the unit already holds one or none is free (a schedule that
  // breaks the pools' sizes).
  Buffer& take_params(int unit);
  Buffer& take_grads(int unit);
  // The unit's buffer is free once `after` has run what it has queued so far.
  void release_params(int unit, cudaStream_t after);
  void release_grads(int unit, cudaStream_t after);

  int64_t in_use_bytes() const { return in_use_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  Buffer* free_buffer(std::vector<Buffer>& pool, Buffer& emb, int unit);
  Buffer& take(std::vector<Buffer*>& of, std::vector<Buffer>& pool, Buffer& emb, int unit, const char* what);
  void release(std::vector<Buffer*>& of, int unit, cudaStream_t after, const char* what);

  Buffer emb_params_, emb_grads_;
  std::vector<Buffer> param_pool_, grad_pool_;
  std::vector<Buffer*> params_of_, grads_of_;  // per unit
  int64_t in_use_bytes_ = 0, peak_bytes_ = 0;
  int64_t release_tick_ = 0;
};

}  // namespace st
