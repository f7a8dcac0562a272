// A ModelBackend that keeps the state the way a device backend does, on the CPU: it wraps a ShardedModel (whose
// shards stand for the device memory) and gives callers host views of their own, filled by pull_unit, copied back by
// push_unit and freed by push_unit and release_unit, as CudaShardedModel's DeviceShards does. It counts the views
// held, so that a test can check what a checkpoint load, init.from or save holds at once. Not thread-safe: the
// callers under test pull on the thread that trains.
//
//   HostViewBackend viewed(engine.sharded());
//   load_checkpoint(dir, cfg, viewed, comm);
//   EXPECT_EQ(viewed.most_held(), 1);
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/shard/model_backend.h"

namespace st::testing {

class HostViewBackend : public ModelBackend {
 public:
  explicit HostViewBackend(ModelBackend& inner) : inner_(inner) {
    for (const UnitLayout& u : inner.units()) {
      const UnitShard& sh = inner.shard(u.index);
      views_.push_back(UnitShard{sh.span, sh.slot, {}, {}, {}, {}});
    }
  }

  void pull_unit(int unit) override {
    UnitShard& view = views_[static_cast<size_t>(unit)];
    const UnitShard& state = inner_.shard(unit);
    view.param = state.param;
    view.m = state.m;
    view.v = state.v;
    ++pulls_;
    most_held_ = std::max(most_held_, held_unit_views());
  }
  void push_unit(int unit) override {
    UnitShard& view = views_[static_cast<size_t>(unit)];
    UnitShard& state = inner_.shard(unit);
    ST_CHECK(static_cast<int64_t>(view.param.size()) == view.slot, "push_unit(", unit, ") without pull_unit");
    state.param = view.param;
    state.m = view.m;
    state.v = view.v;
    ++pushes_;
    release_unit(unit);
  }
  void release_unit(int unit) override {
    UnitShard& view = views_[static_cast<size_t>(unit)];
    for (std::vector<float>* v : {&view.param, &view.m, &view.v}) std::vector<float>().swap(*v);
  }
  int64_t held_unit_views() const override {
    int64_t n = 0;
    for (const UnitShard& v : views_) n += v.param.empty() ? 0 : 1;
    return n;
  }
  // The most views held at once, and how many pulls and pushes there were, since construction.
  int64_t most_held() const { return most_held_; }
  int64_t pulls() const { return pulls_; }
  int64_t pushes() const { return pushes_; }

  UnitShard& shard(int unit) override { return views_[static_cast<size_t>(unit)]; }

  // Everything else is the wrapped model's.
  const std::vector<UnitLayout>& units() const override { return inner_.units(); }
  Communicator& comm() override { return inner_.comm(); }
  Communicator& shard_comm() override { return inner_.shard_comm(); }
  int replica_index() const override { return inner_.replica_index(); }
  std::string describe() const override { return "host views over " + inner_.describe(); }
  std::string device_name() const override { return inner_.device_name(); }
  void zero_grads() override { inner_.zero_grads(); }
  double micro_step(const int32_t* inputs, const int32_t* targets, float dloss) override {
    return inner_.micro_step(inputs, targets, dloss);
  }
  double eval_micro(const int32_t* inputs, const int32_t* targets) override {
    return inner_.eval_micro(inputs, targets);
  }
  void last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) override {
    inner_.last_logits(tokens, len, logits);
  }
  double grad_sum_of_squares() override { return inner_.grad_sum_of_squares(); }
  void adamw(int unit, const std::vector<AdamWRun>& runs) override { inner_.adamw(unit, runs); }
  std::vector<float> gather_params(int unit) override { return inner_.gather_params(unit); }
  std::vector<float> gather_grads(int unit) override { return inner_.gather_grads(unit); }
  MemoryStats memory() const override { return inner_.memory(); }
  int64_t peak_memory_bytes() override { return inner_.peak_memory_bytes(); }
  const CommCounters& counters() const override { return inner_.counters(); }
  double take_exposed_comm_ms() override { return inner_.take_exposed_comm_ms(); }
  GemmAlgorithms gemm_algorithms() const override { return inner_.gemm_algorithms(); }
  void use_gemm_algorithms(const GemmAlgorithms& a) override { inner_.use_gemm_algorithms(a); }

 private:
  ModelBackend& inner_;
  std::vector<UnitShard> views_;
  int64_t most_held_ = 0, pulls_ = 0, pushes_ = 0;
};

}  // namespace st::testing
