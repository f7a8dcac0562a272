// A ModelBackend that hands every call to another one (every virtual of model_backend.h): the base of test backends
// that watch or change a few calls (tests/ckpt/host_view_backend.h gives the CPU backend a device backend's host views;
// the CUDA streaming test counts the views the CUDA backend holds). The wrapped backend must outlive it.
//
//   class Counting : public testing::ForwardingBackend {
//     using ForwardingBackend::ForwardingBackend;
//     void pull_unit(int u) override { ++pulls; ForwardingBackend::pull_unit(u); }
//   };
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shardtrain/shard/model_backend.h"

namespace st::testing {

class ForwardingBackend : public ModelBackend {
 public:
  explicit ForwardingBackend(ModelBackend& inner) : inner_(inner) {}

  const std::vector<UnitLayout>& units() const override { return inner_.units(); }
  Communicator& comm() override { return inner_.comm(); }
  Communicator& shard_comm() override { return inner_.shard_comm(); }
  int replica_index() const override { return inner_.replica_index(); }
  std::string describe() const override { return inner_.describe(); }
  std::string device_name() const override { return inner_.device_name(); }
  void zero_grads() override { inner_.zero_grads(); }
  void expect_micro_steps(int64_t n) override { inner_.expect_micro_steps(n); }
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
  std::vector<float> gather_frozen(int unit) override { return inner_.gather_frozen(unit); }
  void set_dropout_batch(int64_t first_sequence) override { inner_.set_dropout_batch(first_sequence); }
  UnitShard& shard(int unit) override { return inner_.shard(unit); }
  void pull_unit(int unit) override { inner_.pull_unit(unit); }
  void push_unit(int unit) override { inner_.push_unit(unit); }
  void release_unit(int unit) override { inner_.release_unit(unit); }
  int64_t held_unit_views() const override { return inner_.held_unit_views(); }
  void snapshot_state(StateSnapshot* snap) override { inner_.snapshot_state(snap); }
  void reserve_snapshot(StateSnapshot* snap) override { inner_.reserve_snapshot(snap); }
  MemoryStats memory() const override { return inner_.memory(); }
  int64_t peak_memory_bytes() override { return inner_.peak_memory_bytes(); }
  const CommCounters& counters() const override { return inner_.counters(); }
  double take_exposed_comm_ms() override { return inner_.take_exposed_comm_ms(); }
  GemmAlgorithms gemm_algorithms() const override { return inner_.gemm_algorithms(); }
  void use_gemm_algorithms(const GemmAlgorithms& a) override { inner_.use_gemm_algorithms(a); }
  void fp8_step_end(bool applied) override { inner_.fp8_step_end(applied); }
  std::vector<std::vector<float>> fp8_history() override { return inner_.fp8_history(); }
  void load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) override {
    inner_.load_fp8_history(entries, from);
  }
  bool gates_on_device() const override { return inner_.gates_on_device(); }
  void micro_step_queued(const int32_t* inputs, const int32_t* targets, float dloss) override {
    inner_.micro_step_queued(inputs, targets, dloss);
  }
  void queue_gated_update(double earlier_losses, double loss_scale, float grad_clip,
                          const std::vector<std::vector<AdamWRun>>& runs) override {
    inner_.queue_gated_update(earlier_losses, loss_scale, grad_clip, runs);
  }
  GatedStep finish_gated_step() override { return inner_.finish_gated_step(); }
  bool speculates() const override { return inner_.speculates(); }
  void speculate_optimizer(std::vector<std::vector<AdamWRun>> runs) override {
    inner_.speculate_optimizer(std::move(runs));
  }
  void drop_speculation() override { inner_.drop_speculation(); }
  std::string op_profile(int64_t steps) override { return inner_.op_profile(steps); }
  void reset_op_profile() override { inner_.reset_op_profile(); }

 protected:
  ModelBackend& inner() { return inner_; }

 private:
  ModelBackend& inner_;
};

}  // namespace st::testing
