#include "shardtrain/shard/schedule_runner.h"

#include "shardtrain/core/error.h"

namespace st {

void run_schedule(const std::vector<ScheduleOp>& schedule, ScheduleExecutor& ex) {
  // What the schedule itself says is held: a unit's full parameters between its gather and its release, its full
  // gradient from the first compute op that writes it to its reduce-scatter.
  std::vector<bool> params, grads;
  auto held = [](std::vector<bool>& v, int unit) -> std::vector<bool>::reference {
    if (static_cast<size_t>(unit) >= v.size()) v.resize(static_cast<size_t>(unit) + 1, false);
    return v[static_cast<size_t>(unit)];
  };
  // An evaluation's head computes no gradient: only a schedule with a backward produces any.
  bool training = false;
  for (const ScheduleOp& op : schedule) training = training || op.kind == OpKind::kBackward;
  auto need_params = [&](const ScheduleOp& op) {
    ST_CHECK(held(params, op.unit), to_string(op), ": unit ", op.unit, " is not gathered");
  };
  for (size_t i = 0; i < schedule.size(); ++i) {
    const ScheduleOp& op = schedule[i];
    const int u = op.unit;
    ex.prefetch(schedule, i);
    switch (op.kind) {
      case OpKind::kGather:
        ST_CHECK(!held(params, u), to_string(op), ": unit ", u, " is already gathered");
        held(params, u) = true;
        ex.gather(u, i);
        break;
      case OpKind::kForward:
        need_params(op);
        if (u == 0)
          ex.embedding_forward();
        else
          ex.block_forward(u);
        break;
      case OpKind::kHeadForwardBackward:
        need_params(op);
        ST_CHECK(held(params, 0), to_string(op), ": the tied embedding (unit 0) is not gathered");
        ex.head(u);
        if (training) held(grads, u) = held(grads, 0) = true;
        break;
      case OpKind::kBackward:
        if (u != 0) need_params(op);  // the embedding's backward reads no parameters
        if (u == 0)
          ex.embedding_backward();
        else
          ex.block_backward(u);
        held(grads, u) = true;
        break;
      case OpKind::kReduceScatter:
        ST_CHECK(held(grads, u), to_string(op), ": unit ", u, " has no gradient");
        ex.reduce_scatter(u);
        held(grads, u) = false;
        break;
      case OpKind::kRelease:
        need_params(op);
        ex.release(u);
        held(params, u) = false;
        break;
    }
  }
  for (size_t u = 0; u < params.size(); ++u) ST_CHECK(!params[u], "the schedule ends with unit ", u, " gathered");
  for (size_t u = 0; u < grads.size(); ++u)
    ST_CHECK(!grads[u], "the schedule ends with unit ", u, "'s gradient not reduce-scattered");
}

}  // namespace st
