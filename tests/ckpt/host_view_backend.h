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
#include <vector>

#include "../common/forwarding_backend.h"
#include "shardtrain/core/error.h"
#include "shardtrain/shard/model_backend.h"

namespace st::testing {

class HostViewBackend : public ForwardingBackend {
 public:
  explicit HostViewBackend(ModelBackend& inner) : ForwardingBackend(inner) {
    for (const UnitLayout& u : inner.units()) {
      const UnitShard& sh = inner.shard(u.index);
      views_.push_back(UnitShard{sh.span, sh.slot, {}, {}, {}, {}});
    }
  }

  void pull_unit(int unit) override {
    UnitShard& view = views_[static_cast<size_t>(unit)];
    const UnitShard& state = inner().shard(unit);
    view.param = state.param;
    view.m = state.m;
    view.v = state.v;
    ++pulls_;
    most_held_ = std::max(most_held_, held_unit_views());
  }
  void push_unit(int unit) override {
    UnitShard& view = views_[static_cast<size_t>(unit)];
    UnitShard& state = inner().shard(unit);
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
  UnitShard& shard(int unit) override { return views_[static_cast<size_t>(unit)]; }
  // The most views held at once, and how many pulls and pushes there were, since construction.
  int64_t most_held() const { return most_held_; }
  int64_t pulls() const { return pulls_; }
  int64_t pushes() const { return pushes_; }

 private:
  std::vector<UnitShard> views_;
  int64_t most_held_ = 0, pulls_ = 0, pushes_ = 0;
};

}  // namespace st::testing
