// The CUDA backend streams its state through the host one unit at a time: a synchronous checkpoint save, a checkpoint
// load and init.from hold at most one device-resident unit's host view at once (DeviceShards' count, read after every
// pull, push and release) and none afterwards, and give the CPU reference's state bit for bit, with the optimizer on
// the device and with half the units offloaded (read and written in place).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../common/forwarding_backend.h"
#include "../common/gpu_test.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/train/step_engine.h"
#include "small_cuda_config.h"

namespace st {
namespace {

// The CUDA backend itself, its held views sampled after every pull, push and release.
class WatchedBackend : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void pull_unit(int unit) override {
    ForwardingBackend::pull_unit(unit);
    sample();
  }
  void push_unit(int unit) override {
    ForwardingBackend::push_unit(unit);
    sample();
  }
  void release_unit(int unit) override {
    ForwardingBackend::release_unit(unit);
    sample();
  }
  int64_t most_held() const { return most_held_; }
  int64_t calls() const { return calls_; }

 private:
  void sample() {
    ++calls_;
    most_held_ = std::max(most_held_, held_unit_views());
  }
  int64_t most_held_ = 0, calls_ = 0;
};

// The GPU tests' small model in bf16, with synchronous checkpoints (the streamed save).
Config small_bf16() {
  Config c = testing::small_config(Device::kCuda, DType::kBF16);
  c.ckpt.async = false;
  return c;
}

constexpr uint64_t kSeed = 77;

// Every unit's owned param, m and v as fp32 bits, read unit by unit through the backend's own views.
std::vector<std::vector<uint32_t>> state_bits(ModelBackend& m) {
  std::vector<std::vector<uint32_t>> out;
  for (const UnitLayout& u : m.units()) {
    m.pull_unit(u.index);
    const UnitShard& sh = m.shard(u.index);
    for (const std::vector<float>* part : {&sh.param, &sh.m, &sh.v}) {
      std::vector<uint32_t> bits(static_cast<size_t>(sh.span.count));
      std::memcpy(bits.data(), part->data(), bits.size() * sizeof(float));
      out.push_back(std::move(bits));
    }
    m.release_unit(u.index);
  }
  return out;
}

TEST(CudaStreamedState, SaveLoadAndInitFromHoldOneUnitViewAndMatchTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  struct Case {
    OffloadMode mode;
    float fraction;
  };
  for (const Case& k : {Case{OffloadMode::kNone, 1.0f}, Case{OffloadMode::kOptimizerParams, 0.5f}}) {
    SCOPED_TRACE(::testing::Message() << "optim.offload=" << to_string(k.mode) << ", fraction " << k.fraction);
    testing::TempDir dir;
    Config g = small_bf16();
    g.optim.offload = k.mode;
    g.optim.offload_fraction = k.fraction;
    g.ckpt.dir = dir.file("ck");
    SoloCommunicator comm;
    StepEngine gpu(g, comm);
    for (int64_t s = 0; s < 2; ++s) gpu.train_step(testing::corpus_batches(g, kSeed, s), 2, s);
    const int64_t units = static_cast<int64_t>(gpu.units().size());

    // A synchronous save pulls one unit at a time; the file holds the trained state exactly.
    CheckpointState cs;
    cs.step = 2;
    cs.optimizer_updates = gpu.updates();
    WatchedBackend saving(gpu.sharded());
    const std::string where = save_checkpoint(g, saving, cs, comm);
    EXPECT_LE(saving.most_held(), 1);
    EXPECT_GE(saving.calls(), 2 * units);  // a pull and a release per unit
    EXPECT_EQ(gpu.sharded().held_unit_views(), 0);
    Config c = g;
    c.train.device = Device::kCpu;
    c.train.dtype = DType::kF32;
    c.optim.offload = OffloadMode::kNone;
    StepEngine cpu(c, comm);
    load_checkpoint(where, c, cpu.sharded(), comm);  // the CPU's state is the file's, whole
    const std::vector<std::vector<uint32_t>> want = state_bits(cpu.sharded());
    EXPECT_EQ(state_bits(gpu.sharded()), want);

    // A load pulls and pushes one unit at a time; the device then holds the file's state, compute copies included.
    StepEngine back(g, comm);
    WatchedBackend loading(back.sharded());
    load_checkpoint(where, g, loading, comm);
    EXPECT_LE(loading.most_held(), 1);
    EXPECT_GE(loading.calls(), 2 * units);
    EXPECT_EQ(back.sharded().held_unit_views(), 0);
    EXPECT_EQ(state_bits(back.sharded()), want);
    EXPECT_EQ(back.gather_params(), cpu.gather_params());
    // The next forward reads the restored compute copies: the trained engine's loss, or with offload (whose host
    // AdamW rounds the copies of its own) that of the same checkpoint loaded with the optimizer on the device.
    std::optional<StepEngine> on_device;
    StepEngine* reference = &gpu;
    if (k.mode != OffloadMode::kNone) {
      Config plain = g;
      plain.optim.offload = OffloadMode::kNone;
      on_device.emplace(plain, comm);
      load_checkpoint(where, plain, on_device->sharded(), comm);
      reference = &*on_device;
    }
    EXPECT_EQ(back.forward_backward(testing::corpus_batches(g, kSeed, 2), 2),
              reference->forward_backward(testing::corpus_batches(g, kSeed, 2), 2));

    // init.from the trained weights: one unit in hand at a time, and the file's weights on the device.
    const std::vector<std::vector<float>> weights = cpu.gather_params();
    std::vector<const float*> ptrs;
    for (const std::vector<float>& w : weights) ptrs.push_back(w.data());
    const std::string file = dir.file("w.h5");
    write_hf_gpt2(file, c.model, cpu.units(), ptrs);
    Config fresh_cfg = g;
    fresh_cfg.train.seed = g.train.seed + 1;  // another random init, which the file overwrites
    StepEngine fresh(fresh_cfg, comm);
    // The file holds the real vocabulary's rows of wte; the padding rows after them keep the fresh init.
    std::vector<std::vector<float>> expected = weights;
    const std::vector<std::vector<float>> before = fresh.gather_params();
    const size_t real = static_cast<size_t>(c.model.vocab_size) * static_cast<size_t>(c.model.n_embd);
    const size_t padded = static_cast<size_t>(c.model.padded_vocab()) * static_cast<size_t>(c.model.n_embd);
    std::copy(before[0].begin() + real, before[0].begin() + padded, expected[0].begin() + real);
    WatchedBackend importing(fresh.sharded());
    init_from_weights(file, fresh_cfg.model, importing);
    EXPECT_LE(importing.most_held(), 1);
    EXPECT_GE(importing.calls(), 2);
    EXPECT_EQ(fresh.sharded().held_unit_views(), 0);
    EXPECT_EQ(fresh.gather_params(), expected);
  }
}

}  // namespace
}  // namespace st
