#include "shardtrain/shard/schedule.h"

namespace st {
namespace {

// With reshard_after_forward = false the blocks stay gathered from their forward to their backward.
void forward_part(int n_layer, bool reshard, bool keep_embedding, std::vector<ScheduleOp>& s) {
  for (int u = 0; u <= n_layer; ++u) {
    s.push_back({OpKind::kGather, u});
    s.push_back({OpKind::kForward, u});
    if (u == 0 ? !keep_embedding : reshard) s.push_back({OpKind::kRelease, u});
  }
  const int head = n_layer + 1;
  s.push_back({OpKind::kGather, head});
  if (!keep_embedding) s.push_back({OpKind::kGather, 0});
  s.push_back({OpKind::kHeadForwardBackward, head});
  s.push_back({OpKind::kRelease, 0});
}

}  // namespace

std::vector<ScheduleOp> training_schedule(int n_layer, bool reshard_after_forward, bool keep_embedding) {
  std::vector<ScheduleOp> s;
  forward_part(n_layer, reshard_after_forward, keep_embedding, s);
  const int head = n_layer + 1;
  s.push_back({OpKind::kReduceScatter, head});
  s.push_back({OpKind::kRelease, head});
  for (int u = n_layer; u >= 1; --u) {
    if (reshard_after_forward) s.push_back({OpKind::kGather, u});
    s.push_back({OpKind::kBackward, u});
    s.push_back({OpKind::kReduceScatter, u});
    s.push_back({OpKind::kRelease, u});
  }
  s.push_back({OpKind::kBackward, 0});
  s.push_back({OpKind::kReduceScatter, 0});
  return s;
}

std::vector<ScheduleOp> eval_schedule(int n_layer, bool keep_embedding) {
  std::vector<ScheduleOp> s;
  forward_part(n_layer, /*reshard=*/true, keep_embedding, s);
  s.push_back({OpKind::kRelease, n_layer + 1});
  return s;
}

std::string to_string(const ScheduleOp& op) {
  const char* name = "?";
  switch (op.kind) {
    case OpKind::kGather:
      name = "gather";
      break;
    case OpKind::kForward:
      name = "forward";
      break;
    case OpKind::kHeadForwardBackward:
      name = "head";
      break;
    case OpKind::kBackward:
      name = "backward";
      break;
    case OpKind::kReduceScatter:
      name = "reduce-scatter";
      break;
    case OpKind::kRelease:
      name = "release";
      break;
  }
  return std::string(name) + " " + std::to_string(op.unit);
}

}  // namespace st
